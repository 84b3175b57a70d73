"""One wirespeed command in processes of its own, as compare runs each combination, tune each
setting and train each backend: fresh processes, so no run inherits another's threads, caches or
sockets, and every figure comes from the command's own harness and checks. One runner and one
outcome for all three (cli/ builds each child's argv: compare/runner.BenchRun, train/shell.TrainRun;
tests/unit/test_argv_roundtrip.py proves every builder parses back to its settings).

Nothing outlives the command that started the children: each child dies with it
(PR_SET_PDEATHSIG, so even after a SIGKILL; its own ranks die with it likewise, launch/local.py),
a SIGTERM or SIGINT sent to the command alone is passed on to the child before the command ends,
and the command's scratch folder is removed by a janitor process that outlives a SIGKILL of the
command by the moment it takes to remove it (`scratch_dir`)."""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

from ..report.records import read_records
from .local import die_with_parent

# How long a child told to stop (SIGTERM: its launcher kills its ranks and leaves) gets before it
# is killed.
STOP_GRACE_S = 5.0

# The janitor: waits for the command to die, then removes the folder. Its parent-death signal is
# SIGURG, which is ignored until the janitor's handler is set (a SIGTERM would kill it before
# then); it looks for its parent once the handler is set, so a death in between is not missed.
# A few lines of Python without torch: ~20 ms to start, nothing while it waits.
_JANITOR = r"""
import os, shutil, signal, sys
folder, parent = sys.argv[1], int(sys.argv[2])
def bye(*_):
    if os.getppid() != parent:   # only once the command is gone (a stray signal deletes nothing)
        shutil.rmtree(folder, ignore_errors=True)
        os._exit(0)
signal.signal(signal.SIGURG, bye)
signal.signal(signal.SIGINT, signal.SIG_IGN)   # Ctrl-C reaches the whole group: the command cleans up
bye()   # the command died before the handler was set (SIGURG is ignored until then)
sys.stdout.write("ready\n")
sys.stdout.flush()
while True:
    signal.pause()
"""


@contextlib.contextmanager
def scratch_dir(prefix: str):
    """A temporary folder for the children's records, removed when the command ends, however it
    ends: by this context on a normal end, an exception or a SIGTERM/SIGINT (which end the
    command through one), and by the janitor when the command is killed outright."""
    folder = tempfile.mkdtemp(prefix=prefix)
    janitor = subprocess.Popen([sys.executable, "-c", _JANITOR, folder, str(os.getpid())],
                               stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               preexec_fn=lambda: die_with_parent(signal.SIGURG))
    janitor.stdout.readline()   # armed: from here a SIGKILL of this process removes the folder too
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        janitor.kill()
        janitor.wait()
        janitor.stdout.close()


@contextlib.contextmanager
def _passed_on(proc: subprocess.Popen):
    """While `proc` runs: a SIGTERM or SIGINT sent to this process stops the child (SIGTERM, then
    SIGKILL after STOP_GRACE_S) and ends this process as the signal would (SystemExit 143,
    KeyboardInterrupt), so the scratch folder's context removes it. The handler only sends the
    signal and raises: the wait happens after the interrupted wait has unwound (a wait inside the
    handler could deadlock on the one the signal interrupted), with further signals ignored."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    got = []

    def stop(signum, frame):
        if got:
            return            # already stopping
        got.append(signum)
        proc.terminate()      # poll() inside does not block: it skips a wait in progress
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise SystemExit(128 + signum)
    sigs = (signal.SIGTERM, signal.SIGINT)
    old = {s: signal.signal(s, stop) for s in sigs}
    try:
        yield
    finally:
        try:
            if got:
                for s in sigs:
                    signal.signal(s, signal.SIG_IGN)
                try:
                    proc.wait(timeout=STOP_GRACE_S)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        finally:
            for s, h in old.items():
                signal.signal(s, h)


@dataclass
class ChildRun:
    """What one child left: the records it wrote, its exit status and its stderr."""
    records: list[dict]
    code: int
    stderr: str
    wrote: bool              # the child wrote its records file (perhaps empty)

    @property
    def why(self) -> str | None:
        """Why it failed (its own error line), or None when it exited 0."""
        return None if self.code == 0 else failure_line(self.stderr, self.code)


@dataclass
class Outcome:
    """A series of child runs: every record, the runs that failed, and those that gave nothing."""
    records: list[dict] = field(default_factory=list)
    failures: list[tuple[str, str]] = field(default_factory=list)   # (what, why)
    # Runs that gave no figure for part of what they were asked (compare: a backend said n/a).
    empty: list[tuple[str, str]] = field(default_factory=list)


def failure_line(stderr: str, code: int) -> str:
    """Why a child command failed: its first `wirespeed: error:` line, else its last line."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("wirespeed: error:")]
    if errors:
        return errors[0][len("wirespeed: error:"):].strip()
    return (lines[-1] if lines else f"exited with code {code}")[:300]


def run_child(argv: list[str], env: dict, json_path: Path, log_path: Path | None = None,
              log_header: str = "", echo: bool = False) -> ChildRun:
    """Run `wirespeed <argv>` (which writes its records to `json_path`) and wait for it.
    echo=False: its output is kept, and written to `log_path` when given (compare, tune);
    echo=True: its stdout goes straight through and its stderr through as it comes, kept too
    (train: the ranks' own header and table are the progress)."""
    if json_path.exists():
        json_path.unlink()
    cmd = [sys.executable, "-m", "wirespeed.cli.main", *argv]
    proc = subprocess.Popen(cmd, env=env, stdout=None if echo else subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, errors="replace", preexec_fn=die_with_parent)
    with _passed_on(proc):
        if echo:
            kept = []
            for line in proc.stderr:
                sys.stderr.write(line)
                sys.stderr.flush()
                kept.append(line)
            code, stdout, stderr = proc.wait(), "", "".join(kept)
        else:
            stdout, stderr = proc.communicate()
            code = proc.returncode
    if log_path is not None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_path.write_text(f"{log_header}$ {' '.join(cmd)}\n# exit code {code}\n{stdout}\n"
                            f"# stderr\n{stderr}")
    wrote = json_path.exists()
    return ChildRun(read_records(json_path) if wrote else [], code, stderr, wrote)
