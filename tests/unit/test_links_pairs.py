"""`wirespeed links` without ranks: the rounds never put a host in two pairs and cover every pair
once; the slow rule names a slow host, a slow link, or nothing, and refuses to guess with two."""
from __future__ import annotations

import itertools

import pytest

from wirespeed.explain.pairs import circle_order, find_slow, matrix_text, schedule


@pytest.mark.parametrize("host_of", [list(range(n)) for n in (2, 3, 4, 5, 8, 9)]
                         + [[0, 0, 1, 1], [0, 0, 0, 1, 1, 2], [0, 1, 0, 1, 2, 2]])
def test_rounds_cover_every_pair_once_and_share_no_host(host_of):
    rounds = schedule(host_of)
    seen = [p for rnd in rounds for p in rnd]
    assert sorted(seen) == list(itertools.combinations(range(len(host_of)), 2))
    for rnd in rounds:
        hosts = [h for a, b in rnd for h in {host_of[a], host_of[b]}]
        assert len(hosts) == len(set(hosts)), rnd


@pytest.mark.parametrize("n", [2, 4, 6, 8, 16])
def test_one_rank_per_host_takes_the_fewest_rounds(n):
    assert len(schedule(list(range(n)))) == n - 1
    assert len(circle_order(n + 1)) == n + 1  # odd: one sits out each round


def bw(n, slow_units=(), slow_links=(), fast=0.94, slow=0.19, jitter=0.0):
    out = {}
    for a in range(n):
        for b in range(n):
            if a != b:
                v = fast * (1 - jitter * ((a * 7 + b * 3) % 5) / 5)
                if a in slow_units or b in slow_units or {a, b} in [set(l) for l in slow_links]:
                    v = slow
                out[(a, b)] = v
    return out


def test_a_slow_host_is_named_alone():
    v = find_slow(["h0", "h1", "h2", "h3"], [0, 1, 2, 3], bw(4, slow_units=[2], jitter=0.2))
    assert [w for w, _ in v.slow] == ["h2"]
    assert v.line().startswith("slow: h2 (0.19 GB/s vs ") and v.line().endswith(" median)")


def test_equal_links_within_noise_are_not_slow():
    assert find_slow(["h0", "h1", "h2", "h3"], [0, 1, 2, 3], bw(4, jitter=0.4)).line() == "slow: none"


def test_a_slow_link_between_good_hosts_is_named_as_a_link():
    v = find_slow([f"h{i}" for i in range(5)], list(range(5)), bw(5, slow_links=[(1, 3)]))
    assert [w for w, _ in v.slow] == ["h1<->h3"]


def test_two_hosts_give_no_verdict_and_say_why():
    v = find_slow(["h0", "h1"], [0, 1], {(0, 1): 0.1, (1, 0): 0.9})
    assert v.line() == "slow: none" and "one link" in v.note


def test_ranks_inside_one_host_are_compared_with_each_other():
    # Three ranks on one machine: rank 1 is slow in every pair it is in.
    v = find_slow(["r0", "r1", "r2"], [0, 0, 0], bw(3, slow_units=[1]))
    assert [w for w, _ in v.slow] == ["r1"]


def test_pairs_inside_a_host_do_not_count_against_the_network():
    # 2 hosts x 2 ranks plus a third host: shm pairs are 10x faster and must not make every
    # network link look slow; h2 is the slow one.
    host_of = [0, 0, 1, 1, 2]
    g = {}
    for a in range(5):
        for b in range(5):
            if a != b:
                g[(a, b)] = 9.0 if host_of[a] == host_of[b] else (0.19 if 2 in (host_of[a], host_of[b]) else 0.94)
    v = find_slow([f"r{r}" for r in range(5)], host_of, g, ["h0", "h1", "h2"])
    assert [w for w, _ in v.slow] == ["h2"]


def test_matrix_text_rows_send_columns_receive():
    text = matrix_text(["h0", "h1"], {(0, 1): 0.5, (1, 0): 0.25}, ".2f").splitlines()
    assert text[1].split() == ["h0", "-", "0.50"] and text[2].split() == ["h1", "0.25", "-"]
