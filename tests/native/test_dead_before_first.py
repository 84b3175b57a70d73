"""A rank that dies after setup and before its first collective (issue 36): connections across
hosts are made on first use, the lower rank of a pair dialling, so a dead higher rank was found at
once (its address refuses the dial) while a dead lower rank left its higher peer waiting for a
dial that never came, the whole timeout. Now every rank holds every address (rendezvous.py) and,
after a short wait for the lower rank's dial, dials it itself (hosts/mesh.rs): both sides name the
dead rank within seconds. Real processes on two host ids over loopback, the test's TCPStore.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from .ranks import master_store

# Three ranks on three host ids, so that the pair under test (ranks 1 and 2) is not the one the
# setup's stream probe connects (hosts 0 and 1). Each rendezvous; the rank told to die waits until
# every rank is set up (so it dies between setup and the first collective, not during setup) and
# exits without a word; its peer in the pair posts a receive from it, the pair's first message,
# and prints the outcome; rank 0 stays until then.
RANK = r"""
import ctypes, os, sys, datetime, time
from torch.distributed import TCPStore
from wirespeed.native.rendezvous import rendezvous
rank, port, dead = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
store = TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=90))
group = rendezvous(store, rank, 3, datetime.timedelta(seconds=60))
store.add("set-up", 1)
while store.add("set-up", 0) < 3:
    time.sleep(0.05)
if rank == dead:
    os._exit(0)
if rank == 0:
    store.wait(["done"])
    sys.exit(0)
time.sleep(0.5)
buf = ctypes.create_string_buffer(64)
t = time.monotonic()
try:
    group.recv(3 - rank, (ctypes.addressof(buf), 64), 7, buf, blocking=True)
    print("received", flush=True)
except Exception as e:
    print(f"{time.monotonic() - t:.2f}", type(e).__name__, e, flush=True)
store.set("done", "1")
"""


@pytest.mark.timeout(150)
@pytest.mark.parametrize("dead", [1, 2])
def test_a_rank_dead_before_its_first_collective_is_named_at_once_by_its_peer(dead):
    store = master_store()
    procs = []
    for rank in range(3):
        env = dict(os.environ, WIRESPEED_HOSTID=f"host-{rank}", WIRESPEED_IFNAME="lo")
        procs.append(subprocess.Popen([sys.executable, "-c", RANK, str(rank), str(store.port), str(dead)],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    try:
        outs = [p.communicate(timeout=120)[0].strip() for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    alive = outs[3 - dead]
    assert "Traceback" not in "".join(outs), outs
    line = alive.splitlines()[-1]
    secs, rest = line.split(" ", 1)
    # The group's timeout is 60 s: the survivor's receive fails in seconds (the higher rank
    # waits about 1 s for the lower rank's dial first), naming the dead rank.
    assert float(secs) < 10, line
    assert rest.startswith("PeerAbortedError") and f"rank {dead}" in rest, line
