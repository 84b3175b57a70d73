"""A rank that dies or hangs: the job ends with an error within the timeout, nothing left running."""
import os
import signal
import subprocess
import sys
import time

import pytest

from wsutil import ROOT


def _children_of(pid):
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        out.append(int(d))
            except (OSError, IndexError, ValueError):
                pass
    return out


def _rank_of(pid):
    with open(f"/proc/{pid}/environ", "rb") as f:
        env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
    return int(env[b"RANK"])


def _start_long_job(nproc, timeout):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR")}
    cmd = [sys.executable, "-m", "wirespeed.cli.main", "bench", "-N", str(nproc), "-b", "8M", "-e", "8M",
           "-n", "100000", "-w", "1", "--no-save", "--timeout", str(timeout)]
    launcher = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
    # Wait until every rank is in the timed loop (the header is printed after rendezvous).
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        kids = _children_of(launcher.pid)
        if len(kids) == nproc:
            break
        time.sleep(0.2)
    time.sleep(6)
    kids = _children_of(launcher.pid)
    assert len(kids) == nproc, "ranks did not start"
    return launcher, {_rank_of(k): k for k in kids}


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.timeout(120)
def test_killed_rank_ends_the_job():
    launcher, ranks = _start_long_job(3, timeout=60)
    t0 = time.monotonic()
    os.kill(ranks[1], signal.SIGKILL)
    _, err = launcher.communicate(timeout=60)
    elapsed = time.monotonic() - t0
    assert launcher.returncode != 0
    assert elapsed < 30, elapsed  # survivors see the closed connection at once, or get killed
    assert "Traceback" not in err
    assert "error" in err
    assert not any(_alive(p) for p in ranks.values())


@pytest.mark.timeout(120)
def test_hung_rank_times_out():
    launcher, ranks = _start_long_job(2, timeout=8)
    t0 = time.monotonic()
    os.kill(ranks[1], signal.SIGSTOP)  # alive but silent: only a timeout can notice
    try:
        _, err = launcher.communicate(timeout=60)
    finally:
        for p in ranks.values():
            if _alive(p):
                os.kill(p, signal.SIGKILL)
    elapsed = time.monotonic() - t0
    assert launcher.returncode != 0
    assert elapsed < 8 + 20, elapsed
    assert "rank 0" in err and "Traceback" not in err
    assert not any(_alive(p) for p in ranks.values())


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_healthy_step_slower_than_the_timeout_is_not_a_hang(run_cli):
    # Allocating a 512 MiB all_reduce's buffers, and the check after its loops (fill, one more
    # call, the comparison), each take seconds here; with -T 2, 482a6d1 killed the job ("no
    # progress for 2 s while allocating / checking ... a peer hangs"). Its peers are alive and
    # working and say so: the job runs to its end. (-T also bounds gloo's own waits: 2 s leaves
    # room for one rank to fill its buffer later than the other on a loaded machine.)
    p = run_cli("bench", "-N", "2", "--sizes", "512M", "-n", "2", "-w", "1", "-T", "2", "--no-save", timeout=150)
    assert p.returncode == 0, p.stderr
    assert "no progress" not in p.stderr and "536870912" in p.stdout
