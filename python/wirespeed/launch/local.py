"""Spawn N ranks of a wirespeed command on this host, on loopback, and supervise them.

Each child runs the same command with torchrun's variables set, so a rank cannot tell a local spawn
from torchrun. If any rank fails, the survivors normally fail on their own within moments (their
peer is gone); whatever still runs a few seconds later is killed, so nothing is left behind. The
children also die with the launcher (PR_SET_PDEATHSIG), even when it is killed with SIGKILL.
"""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time

from .environment import check_port_free, free_port

# After the first rank fails, how long the others get to report their own error before being killed.
SURVIVOR_GRACE_S = 5.0


def _die_with_parent() -> None:
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def rank_env(rank: int, nproc: int, port: int, base=None) -> dict:
    env = dict(os.environ if base is None else base)
    env.update(RANK=str(rank), WORLD_SIZE=str(nproc), LOCAL_RANK=str(rank),
               LOCAL_WORLD_SIZE=str(nproc), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
               WIRESPEED_LOCAL_SPAWN="1", OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "1"))
    return env


def spawn(argv: list[str], nproc: int, master_port: int | None = None) -> int:
    """Run `python -m wirespeed.cli.main *argv` as nproc ranks; return the job's exit code."""
    if master_port is None:
        port = free_port()
    else:
        check_port_free(master_port)
        port = master_port
    cmd = [sys.executable, "-m", "wirespeed.cli.main", *argv]
    procs = [subprocess.Popen(cmd, env=rank_env(r, nproc, port), preexec_fn=_die_with_parent)
             for r in range(nproc)]
    return supervise(procs)


def supervise(procs: list[subprocess.Popen]) -> int:
    def kill_all(*_):
        for p in procs:
            if p.poll() is None:
                p.kill()

    old = {s: signal.signal(s, lambda signum, frame: (kill_all(), sys.exit(128 + signum)))
           for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        failed_at = None
        killed: set[int] = set()
        while True:
            codes = [p.poll() for p in procs]
            if all(c is not None for c in codes):
                break
            if failed_at is None:
                failed = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
                if failed:
                    failed_at = time.monotonic()
                    r, c = failed[0]
                    how = f"was killed by signal {-c}" if c < 0 else f"exited with status {c}"
                    sys.stderr.write(f"wirespeed: error: rank {r} {how}; ending the job\n")
            elif time.monotonic() - failed_at > SURVIVOR_GRACE_S:
                for r, p in enumerate(procs):
                    if p.poll() is None and r not in killed:
                        sys.stderr.write(f"wirespeed: error: rank {r} still running "
                                         f"{SURVIVOR_GRACE_S:g} s after another rank failed; killing it\n")
                        p.kill()
                        killed.add(r)
            time.sleep(0.05)
        codes = [p.wait() for p in procs]
    finally:
        kill_all()
        for s, h in old.items():
            signal.signal(s, h)
    bad = [c for c in codes if c != 0]
    if not bad:
        return 0
    # A killed rank has a negative code; report the first real failure's code (1 wrong data, 2 usage,
    # 3 peer timeout), else a generic 1.
    positive = [c for c in bad if c > 0]
    return positive[0] if positive else 1
