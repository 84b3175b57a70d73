"""One wirespeed command in processes of its own, as compare runs each combination, tune each
setting and train each backend: fresh processes, so no run inherits another's threads, caches or
sockets, and every figure comes from the command's own harness and checks. One runner and one
outcome for all three (cli/ builds each child's argv: compare/runner.BenchRun, train/shell.TrainRun;
tests/unit/test_argv_roundtrip.py proves every builder parses back to its settings)."""
from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ..report.records import read_records


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
    if echo:
        proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True, errors="replace")
        kept = []
        for line in proc.stderr:
            sys.stderr.write(line)
            sys.stderr.flush()
            kept.append(line)
        code, stdout, stderr = proc.wait(), "", "".join(kept)
    else:
        done = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              errors="replace")
        code, stdout, stderr = done.returncode, done.stdout, done.stderr
    if log_path is not None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_path.write_text(f"{log_header}$ {' '.join(cmd)}\n# exit code {code}\n{stdout}\n"
                            f"# stderr\n{stderr}")
    wrote = json_path.exists()
    return ChildRun(read_records(json_path) if wrote else [], code, stderr, wrote)
