"""Start a real `wirespeed bench` job, find its rank processes, inject a fault at a seeded random
point, and read back how the job ended: each rank's own status from the launcher's last line.

Every process of a job carries a unique marker in its environment, so its ranks are found (and
leftovers detected) by that marker alone, wherever they run (loopback or the emulated cluster).
"""
from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
STARTUP_S = 150   # torch imported by every rank of a shared 2-core machine: this long, at worst
HEADER = "# wirespeed"  # rank 0 prints it once every rank has joined; collectives follow at once
COLLECTIVES = ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all",
               "send_recv", "barrier"]


def _environ(pid: int) -> dict[bytes, bytes]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
    except OSError:
        return {}


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def marked(mark: str) -> dict[int, dict[bytes, bytes]]:
    """Live processes (not zombies) whose environment carries the marker."""
    out = {}
    needle = mark.encode()
    for d in os.listdir("/proc"):
        if d.isdigit() and int(d) != os.getpid():
            env = _environ(int(d))
            if env.get(b"WIRESPEED_FAULT_MARK") == needle and _alive(int(d)):
                out[int(d)] = env
    return out


def shm_entries() -> set[str]:
    """What wirespeed, torch or gloo could leave in /dev/shm."""
    try:
        return {n for n in os.listdir("/dev/shm") if any(k in n.lower() for k in ("wirespeed", "torch", "gloo"))}
    except FileNotFoundError:
        return set()


def bench_args(seed: int, backend: str, timeout_s: float) -> list[str]:
    """A sweep of every collective in a seeded order, long enough to outlast any fault below, so
    the fault lands in whichever collective that order puts first."""
    order = COLLECTIVES[:]
    random.Random(seed).shuffle(order)
    return ["bench", "--backend", backend, "-c", ",".join(order), "-d", "float32,int32",
            "-o", "sum,max", "--sizes", "4K,1M", "-n", "300", "-w", "1", "--no-save",
            "--no-progress", "-T", str(timeout_s)]


@dataclass
class Job:
    proc: subprocess.Popen
    mark: str
    out: Path
    err: Path
    started: float = 0.0
    ended: float | None = None
    ranks: dict[int, int] = field(default_factory=dict)

    def stderr(self) -> str:
        return self.err.read_text(errors="replace")

    def stdout(self) -> str:
        return self.out.read_text(errors="replace")

    def wait_for(self, text: str, timeout: float, where: str = "err") -> bool:
        deadline = time.monotonic() + timeout
        path = self.err if where == "err" else self.out
        while time.monotonic() < deadline:
            if text in path.read_text(errors="replace"):
                return True
            if self.proc.poll() is not None:
                return text in path.read_text(errors="replace")
            time.sleep(0.02)
        return False

    def finish(self, limit_s: float) -> int:
        """The job's exit status; kills it (and fails the caller's assertion) past limit_s."""
        try:
            code = self.proc.wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"the job was still running {limit_s:g} s later:\n{self.stderr()[-3000:]}")
        self.ended = time.monotonic()
        return code

    def kill(self) -> None:
        for pid in marked(self.mark):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.kill()
        self.proc.wait()

    def rank_statuses(self) -> dict[int, str]:
        """Rank -> what the launcher's last line says of it ("exited with status 4 (peer lost)",
        "killed by SIGKILL", "killed by the launcher, stopped")."""
        line = next((ln for ln in self.stderr().splitlines() if "the job failed with status" in ln), "")
        out = {}
        for part in line.split("; ")[1:]:
            m = re.match(r"ranks? ([\d, ]+): (.*)", part)
            if m:
                for r in m.group(1).split(","):
                    out[int(r)] = m.group(2)
        return out


def start(tmp_path: Path, args: list, env: dict | None = None) -> Job:
    """`wirespeed ARGS` in the background, its ranks found once rank 0 printed the header."""
    mark = uuid.uuid4().hex
    full = {k: v for k, v in os.environ.items()
            if not k.startswith(("RANK", "WORLD_SIZE", "LOCAL_", "MASTER_", "OMPI_", "PMI_", "SLURM_"))}
    full.update(env or {}, WIRESPEED_FAULT_MARK=mark)
    out, err = tmp_path / f"{mark}.out", tmp_path / f"{mark}.err"
    with open(out, "w") as o, open(err, "w") as e:
        proc = subprocess.Popen([sys.executable, "-m", "wirespeed.cli.main", *map(str, args)],
                                cwd=ROOT, env=full, stdout=o, stderr=e)
    job = Job(proc, mark, out, err)
    if not job.wait_for(HEADER, STARTUP_S, where="out"):
        job.kill()
        raise AssertionError(f"the job did not start:\n{job.stderr()[-3000:]}")
    job.started = time.monotonic()
    job.ranks = {int(env[b"RANK"]): pid for pid, env in marked(mark).items() if b"RANK" in env}
    return job


def kill_rank(job: Job, rank: int) -> float:
    os.kill(job.ranks[rank], signal.SIGKILL)
    return time.monotonic()


def stop_rank(job: Job, rank: int) -> float:
    os.kill(job.ranks[rank], signal.SIGSTOP)
    return time.monotonic()


def continue_rank(job: Job, rank: int) -> None:
    os.kill(job.ranks[rank], signal.SIGCONT)
