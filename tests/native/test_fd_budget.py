"""Open files as a budget (crates/wirespeed-core/src/hosts/fds.rs) with real processes on two host
ids over loopback, meeting through a real TCPStore served by the test (no root needed; the
emulated-cluster version, a bench with collectives checked, is tests/netem/test_fd_budget.py).
Every rank decides from the rooms all ranks published, so each outcome must be the same on both.
"""
from __future__ import annotations

import os
import re
import resource
import subprocess
import sys
import time

import pytest

from .ranks import master_store

# Each test starts real rank processes (torch's import alone takes seconds on a small machine).
pytestmark = pytest.mark.slow

TIMEOUT_S = 30

# One rank of wirespeed's rendezvous (as ranks.RENDEZVOUS_RANK) that, once connected (a barrier:
# connections are made on first use), prints "joined", its TCP streams (its sockets less the
# store's and its listener) and its soft limit.
RANK = r"""
import sys, os, datetime, resource
from torch.distributed import TCPStore
from wirespeed.native.rendezvous import rendezvous
rank, port, timeout = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
store = TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=30))
def sockets():
    n = 0
    for f in os.listdir("/proc/self/fd"):
        try:
            n += os.readlink(f"/proc/self/fd/{f}").startswith("socket:")
        except OSError:  # the listing's own descriptor, closed by now
            pass
    return n
try:
    group = rendezvous(store, rank, 2, datetime.timedelta(seconds=timeout))
    group.barrier(blocking=True)
    print("joined", sockets() - 2, resource.getrlimit(resource.RLIMIT_NOFILE)[0], flush=True)
except Exception as e:
    print(type(e).__name__, e)
"""


def _run(limits: tuple[int, int] | None, nstreams=(None, None)) -> tuple[list[str], float]:
    """Both ranks' output (stdout and stderr) and how long the slower took, under open-file
    limits (soft, hard) where given."""
    store = master_store()  # served by this process while the ranks run
    def preexec():
        if limits is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, limits)
    procs = []
    t0 = time.monotonic()
    for rank, n in enumerate(nstreams):
        env = {k: v for k, v in os.environ.items() if k != "WIRESPEED_NSTREAMS"}
        env.update(WIRESPEED_HOSTID=f"host-{rank}", WIRESPEED_IFNAME="lo")
        if n is not None:
            env["WIRESPEED_NSTREAMS"] = str(n)
        argv = [sys.executable, "-c", RANK, str(rank), str(store.port), str(TIMEOUT_S)]
        procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True, preexec_fn=preexec))
    outs = [p.communicate(timeout=TIMEOUT_S + 60)[0].strip() for p in procs]
    return outs, time.monotonic() - t0


@pytest.mark.timeout(TIMEOUT_S + 90)
def test_a_low_soft_limit_is_raised():
    outs, _ = _run((20, 20000))
    # both raised their soft limit to the hard one and connected with all 12 streams
    assert [o.splitlines()[-1] for o in outs] == ["joined 12 20000", "joined 12 20000"], outs
    assert not any("open-file limit" in o for o in outs), outs


# What a rank of RANK holds when it publishes its room: the same imports and store.
HELD = r"""
import sys, datetime
from torch.distributed import TCPStore
from wirespeed import _native
store = TCPStore("127.0.0.1", int(sys.argv[1]), is_master=False, timeout=datetime.timedelta(seconds=30))
import wirespeed.native.rendezvous
print(_native.fd_room().split(":")[2])
"""


@pytest.mark.timeout(TIMEOUT_S + 90)
def test_a_low_hard_limit_gives_both_ranks_the_same_fewer_streams():
    store = master_store()
    held = int(subprocess.run([sys.executable, "-c", HELD, str(store.port)], capture_output=True, text=True,
                              check=True, timeout=60).stdout)
    # Beside what it holds, each rank needs a stream per stream count (its one peer is its
    # counterpart), its listener, 2 during setup and the 64 of the margin: room for 4 streams.
    limit = held + 1 + 2 + 64 + 4
    outs, _ = _run((limit, limit))
    said = re.search(rf"rank \d's hard open-file limit \({limit}\) holds (\d+) TCP streams per peer, not WIRESPEED_NSTREAMS=12", outs[0])
    # (a descriptor more or less held than the probe's moves it by one)
    assert said and 1 <= int(said.group(1)) < 12, outs
    # both connected with that many streams
    assert [o.splitlines()[-1] for o in outs] == [f"joined {said.group(1)} {limit}"] * 2, outs
    assert "open-file limit" not in outs[1], outs  # said once, by rank 0


@pytest.mark.timeout(TIMEOUT_S + 90)
def test_a_hard_limit_too_low_for_one_stream_fails_both_ranks_alike_at_once():
    outs, took = _run((40, 40))
    last = [o.splitlines()[-1] for o in outs]
    assert last[0] == last[1], outs  # the same decision, naming the same rank
    assert re.match(r"UnsupportedError rank \d needs \d+ open files at WIRESPEED_NSTREAMS=12 and \d+ at the fewest, "
                    r"WIRESPEED_NSTREAMS=1, but its hard limit is 40: raise it where the ranks start \(`ulimit -n \d+`",
                    last[0]), last
    assert took < TIMEOUT_S, f"{took:.0f} s: a rank waited for its peer instead of failing at setup"


@pytest.mark.timeout(TIMEOUT_S + 90)
def test_ranks_with_different_stream_counts_fail_alike_at_once():
    outs, took = _run(None, nstreams=(12, 4))
    last = [o.splitlines()[-1] for o in outs]
    want = ("MismatchError ranks disagree: rank 0 has WIRESPEED_NSTREAMS=12 and rank 1 WIRESPEED_NSTREAMS=4: "
            "give every rank the same WIRESPEED_* environment")
    assert last == [want, want], outs
    assert took < TIMEOUT_S, f"{took:.0f} s: the ranks met at the handshake instead of at setup"
