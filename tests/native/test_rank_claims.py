"""A rank number claimed twice at wirespeed's rendezvous is an error on every rank that sees it,
naming both claimants (issue 27): never a silent first-come in which the job computes with
whichever process answered. Real processes meet through a real TCPStore.
"""
from __future__ import annotations

import subprocess
import sys
import time
from datetime import timedelta

import pytest

RANK = r"""
import sys, datetime
from torch.distributed import TCPStore
from wirespeed.native.rendezvous import rendezvous
rank, port = int(sys.argv[1]), int(sys.argv[2])
store = TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=30))
try:
    rendezvous(store, rank, 2, datetime.timedelta(seconds=20))
    print("joined")
except Exception as e:
    print(type(e).__name__, e)
"""


def _start(rank: int, port: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", RANK, str(rank), str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.timeout(120)
def test_a_rank_claimed_twice_is_an_error_on_every_rank_naming_both():
    from torch.distributed import TCPStore
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                     timeout=timedelta(seconds=60))
    twins = [_start(1, store.port), _start(1, store.port)]
    deadline = time.monotonic() + 60
    while store.add("wirespeed/claims/1", 0) < 2:  # both have claimed rank 1 ...
        assert time.monotonic() < deadline, "the two rank-1 processes never claimed"
        time.sleep(0.1)
    first = _start(0, store.port)                  # ... before rank 0 comes: it must see it
    outs = [p.communicate(timeout=60)[0].strip() for p in [first, *twins]]
    claimants = {store.get(f"wirespeed/claimant/1/{n}").decode() for n in (1, 2)}
    assert len(claimants) == 2, claimants
    for out in outs:
        assert out.startswith("RankClaimedTwice rank 1 was claimed twice"), outs
        assert all(c in out for c in claimants), (out, claimants)
        assert "MASTER_PORT" in out


@pytest.mark.timeout(120)
def test_each_rank_claimed_once_joins():
    from torch.distributed import TCPStore
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                     timeout=timedelta(seconds=60))
    procs = [_start(r, store.port) for r in (0, 1)]
    outs = [p.communicate(timeout=60)[0].strip() for p in procs]
    assert outs == ["joined", "joined"], outs
