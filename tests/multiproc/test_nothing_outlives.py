"""Nothing outlives its command (issue 36, item 4): killing `compare`, `tune` or `train` while a
child run of theirs has its ranks up, with SIGKILL, SIGTERM or SIGINT (sent to the command alone,
as `kill` does, not to its terminal's process group), leaves no process of it behind and no scratch
folder. On 482a6d1 the child run and its ranks went on running, and the folder stayed.

Every process of a run carries a tag in its environment (children inherit it), so the test finds
them all in /proc whoever their parent is by then.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from wsutil import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

LONG = ["-n", "2000000", "-w", "0", "--no-save"]
COMMANDS = {
    "compare": ["compare", "--backends", "gloo", "--nprocs", "2", "--dtypes", "float32", "--sizes", "4K", *LONG],
    "tune": ["tune", "--backend", "wirespeed", "-N", "2", "--sizes", "4K", "--knobs", "WIRESPEED_ALGO", *LONG],
    "train": ["train", "--model", "gpt", "--layers", "1", "--hidden", "32", "--heads", "2", "--seq-len", "16",
              "--vocab", "64", "--batch-size", "2", "-N", "2", "--backend", "gloo,wirespeed", "--no-scaling",
              "-n", "100000", "-w", "1", "--no-save"],
}


def tagged(tag: str) -> list[int]:
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if f"WS_OUTLIVE_TAG={tag}".encode() in (d / "environ").read_bytes().split(b"\0"):
                    found.append(int(d.name))
            except OSError:
                pass
    return found


def ranks_running(tag: str, command_pid: int) -> bool:
    # the command, its janitor, the child command and its two ranks (all tagged)
    return len([p for p in tagged(tag) if p != command_pid]) >= 4


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT], ids=["KILL", "TERM", "INT"])
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_killing_a_command_mid_run_leaves_nothing(command, sig, tmp_path):
    tag = uuid.uuid4().hex
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = dict(os.environ, WS_OUTLIVE_TAG=tag, TMPDIR=str(scratch), OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-m", "wirespeed.cli.main", *COMMANDS[command]], env=env, cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not ranks_running(tag, proc.pid):
            assert proc.poll() is None, f"{command} ended before its ranks ran:\n{proc.stderr.read()}"
            assert time.monotonic() < deadline, f"{command}'s ranks never came up: {tagged(tag)}"
            time.sleep(0.2)
        time.sleep(1.0)                      # mid-run: the ranks are in their loops
        os.kill(proc.pid, sig)
        proc.wait(timeout=30)
        deadline = time.monotonic() + 20
        # (torch keeps caches of its own there, e.g. torchinductor_USER: not the command's)
        while (left := tagged(tag)) or (ours := sorted(p.name for p in scratch.glob("wirespeed-*"))):
            assert time.monotonic() < deadline, f"after {sig.name} of {command}: {left} and {ours} left behind"
            time.sleep(0.2)
        if sig != signal.SIGKILL:
            err = proc.stderr.read()
            assert "Traceback" not in err, err
    finally:
        for pid in tagged(tag):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        if proc.poll() is None:
            proc.kill()
        proc.wait()
