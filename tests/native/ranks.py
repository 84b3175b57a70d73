"""Start N real rank processes of a worker script (workers/) on loopback and collect what each reports.

Each worker prints one JSON line prefixed with RESULT; a rank that hangs past the deadline is
killed (and the test fails), so no test can hang and nothing is left running.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from wirespeed.launch.environment import free_port  # noqa: F401 - tests import it from here
from wirespeed.launch.local import rank_env

# The rank programs (one process each) live apart from the tests, so this folder lists tests and
# the checks they share with the ranks.
WORKERS = Path(__file__).resolve().parent / "workers"


def run_ranks(script: str, world: int, timeout: float, extra_env: dict | None = None,
              args: tuple = (), may_die: frozenset = frozenset()) -> list[dict]:
    """Results in rank order; a rank in `may_die` that reports nothing gives None."""
    port = free_port()
    procs = []
    for r in range(world):
        env = dict(rank_env(r, world, port), OMP_NUM_THREADS="1", **(extra_env or {}))
        procs.append(subprocess.Popen([sys.executable, str(WORKERS / script), *map(str, args)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    deadline = time.monotonic() + timeout
    outs = []
    try:
        for r, p in enumerate(procs):
            try:
                out, err = p.communicate(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                raise AssertionError(f"rank {r} of {script} still running after {timeout} s")
            outs.append((p.returncode, out, err))
    finally:
        for q in procs:
            if q.poll() is None:
                q.kill()
                q.wait()
    results = []
    for r, (code, out, err) in enumerate(outs):
        lines = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
        if not lines and r in may_die:
            results.append(None)
            continue
        if not lines:
            raise AssertionError(f"rank {r} of {script} exited {code} without a result:\n{out[-3000:]}\n{err[-3000:]}")
        results.append(json.loads(lines[-1][len("RESULT "):]))
    return results


def report(obj) -> None:
    """Called by a worker: hand its result to run_ranks."""
    print("RESULT " + json.dumps(obj), flush=True)


# One rank of wirespeed's own rendezvous (native/rendezvous.py) through a TCPStore at a port,
# then a barrier (connections across hosts are made on first use: the barrier makes them):
# prints "joined", or the error's class and message (for the admission tests).
RENDEZVOUS_RANK = r"""
import sys, datetime
from torch.distributed import TCPStore
from wirespeed.native.rendezvous import rendezvous
rank, port, timeout, times = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
store = TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=30))
try:
    for _ in range(times):
        group = rendezvous(store, rank, 2, datetime.timedelta(seconds=timeout))
        group.barrier(blocking=True)
        print("joined", flush=True)
        del group
except Exception as e:
    print(type(e).__name__, e)
"""


def master_store():
    """A TCPStore served by this (the test's) process, for ranks to meet at."""
    from datetime import timedelta

    from torch.distributed import TCPStore
    return TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                    timeout=timedelta(seconds=60))


def start_rendezvous_rank(rank: int, port: int, timeout_s: float, env: dict | None = None,
                          times: int = 1):
    return subprocess.Popen([sys.executable, "-c", RENDEZVOUS_RANK, str(rank), str(port), str(timeout_s),
                             str(times)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
