"""The compact layout rank 0 publishes in the store rendezvous (wirespeed.native.layout): every
layout comes back exactly, and its size follows the layout's irregularity, not the world size."""
from __future__ import annotations

import random

import pytest

from wirespeed.native.layout import decode, decode_seq, encode, encode_seq


def _labels(hosts: list[str]) -> list[int]:
    seen: dict[str, int] = {}
    return [seen.setdefault(h, len(seen)) for h in hosts]


@pytest.mark.parametrize("world,k", [(1, 1), (8, 8), (16, 4), (8192, 8), (10, 4)])
def test_ranks_in_blocks_cost_the_same_few_bytes_at_any_size(world, k):
    hosts = [f"node{r // k}.cluster/boot-{r // k}" for r in range(world)]
    rooms = ["12:1048576:40"] * world
    jobs = ["0123456789abcdef"] * world
    text = encode(hosts, rooms, jobs)
    assert len(text) < 120, text
    got_hosts, got_rooms, got_jobs = decode(text, world)
    assert _labels(got_hosts) == _labels(hosts) and got_rooms == rooms and got_jobs == jobs


def test_round_robin_and_irregular_layouts_come_back_exactly():
    cyclic = [r % 5 for r in range(40)]
    assert encode_seq(cyclic) == ["c", 5] and decode_seq(["c", 5], 40) == cyclic
    rng = random.Random(7)
    for _ in range(200):
        world = rng.randint(1, 60)
        hosts = [f"h{rng.randint(0, 6)}" for _ in range(world)]
        rooms = [f"12:20000:{rng.choice([30, 31, 45])}" for _ in range(world)]
        jobs = [rng.choice(["aa", "bb"]) for _ in range(world)]
        got_hosts, got_rooms, got_jobs = decode(encode(hosts, rooms, jobs), world)
        assert _labels(got_hosts) == _labels(hosts) and got_rooms == rooms and got_jobs == jobs


def test_a_layout_for_another_world_size_is_refused():
    with pytest.raises(ValueError, match="for 4 ranks in a world of 5"):
        decode(encode(["a"] * 4, ["1:2:3"] * 4, ["x"] * 4), 5)
