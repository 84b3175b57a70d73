"""A rank number claimed twice at wirespeed's rendezvous is an error on every rank that sees it,
naming both claimants (issue 27): never a silent first-come in which the job computes with
whichever process answered. Real processes meet through a real TCPStore.
"""
from __future__ import annotations

import time

import pytest

from .ranks import master_store, start_rendezvous_rank

def _start(rank: int, port: int):
    return start_rendezvous_rank(rank, port, 20)


@pytest.mark.timeout(120)
def test_a_rank_claimed_twice_is_an_error_on_every_rank_naming_both():
    store = master_store()
    twins = [_start(1, store.port), _start(1, store.port)]
    deadline = time.monotonic() + 60
    while store.add("wirespeed/0/claims/1", 0) < 2:  # both have claimed rank 1 ...
        assert time.monotonic() < deadline, "the two rank-1 processes never claimed"
        time.sleep(0.1)
    first = _start(0, store.port)                  # ... before rank 0 comes: it must see it
    outs = [p.communicate(timeout=60)[0].strip() for p in [first, *twins]]
    claimants = {store.get(f"wirespeed/0/claimant/1/{n}").decode() for n in (1, 2)}
    assert len(claimants) == 2, claimants
    for out in outs:
        assert out.startswith("RankClaimedTwice rank 1 was claimed twice"), outs
        assert all(c in out for c in claimants), (out, claimants)
        assert "MASTER_PORT" in out


@pytest.mark.timeout(120)
def test_each_rank_claimed_once_joins():
    store = master_store()
    procs = [_start(r, store.port) for r in (0, 1)]
    outs = [p.communicate(timeout=60)[0].strip() for p in procs]
    assert outs == ["joined", "joined"], outs


@pytest.mark.timeout(120)
def test_the_same_processes_meeting_again_on_the_same_store_join_again():
    # destroy_process_group then init on the same store: each process claims its rank again,
    # which is a new round, not a duplicate; and the round reads its own token and addresses.
    store = master_store()
    procs = [start_rendezvous_rank(r, store.port, 20, times=3) for r in (0, 1)]
    outs = [p.communicate(timeout=90)[0].strip() for p in procs]
    assert outs == ["joined\njoined\njoined"] * 2, outs
