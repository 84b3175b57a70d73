"""Output paths are proven writable before any rank starts, so a long sweep never ends in a
traceback with its measurements lost (`--json /tmp`, `--csv /sys/x`, `--save-dir /proc/runs`).

The proof is the real thing: create (or open for appending) the file, or create the directory and
a file in it, then remove whatever the probe created. A permission bit says nothing for root, and
/proc and /sys accept no new files whatever the bits say.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

from ..errors import UsageError


# A file name to suggest when a file flag is given a directory.
_EXAMPLES = {"--json": "records.jsonl", "--csv": "records.csv", "--plot": "plot.png", "-o": "plot.png"}


def _why(e: OSError) -> str:
    return e.strerror or type(e).__name__


def _make_dirs(path: str, flag: str, shown: str) -> list[str]:
    """Create directory `path` and its missing parents; return those created (deepest last).
    Errors name `flag` and `shown`, the path as the user gave it."""
    missing = []
    p = os.path.abspath(path)
    while p and not os.path.exists(p):
        missing.append(p)
        parent = os.path.dirname(p)
        if parent == p:
            break
        p = parent
    if p and os.path.exists(p) and not os.path.isdir(p):
        raise UsageError(f"{flag} {shown}: {p} is a file, not a directory: choose another path")
    made = []
    try:
        for d in reversed(missing):
            os.mkdir(d)
            made.append(d)
    except OSError as e:
        _remove_dirs(made)
        raise UsageError(f"{flag} {shown}: cannot create directory {d} ({_why(e)}): choose a "
                         "writable place") from None
    return made


def _remove_dirs(made: list[str]) -> None:
    for d in reversed(made):
        try:
            os.rmdir(d)
        except OSError:
            pass


def check_output_file(path: str | None, flag: str) -> None:
    """Raise a one-line UsageError unless `path` can be written as a file (leaves no trace)."""
    if not path:
        return
    if os.path.isdir(path):
        example = os.path.join(path, _EXAMPLES.get(flag, "out"))
        raise UsageError(f"{flag} {path} is a directory: give a file in it, e.g. {flag} {example}")
    made = _make_dirs(os.path.dirname(path) or ".", flag, path)
    existed = os.path.exists(path)
    try:
        with open(path, "a"):
            pass
    except OSError as e:
        _remove_dirs(made)
        raise UsageError(f"{flag} {path}: cannot write there ({_why(e)}): choose a writable "
                         "path") from None
    if not existed:
        os.unlink(path)
    _remove_dirs(made)


def check_output_dir(path: str | None, flag: str) -> None:
    """Raise a one-line UsageError unless files can be created under directory `path`."""
    if not path:
        return
    if os.path.exists(path) and not os.path.isdir(path):
        raise UsageError(f"{flag} {path} is a file, not a directory: choose a directory")
    made = _make_dirs(path, flag, path)
    try:
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as e:
        raise UsageError(f"{flag} {path}: cannot create files there ({_why(e)}): choose a "
                         "writable directory") from None
    finally:
        _remove_dirs(made)


def check_outputs(files: dict[str, str | None] = (), dirs: dict[str, str | None] = ()) -> None:
    """Every output of a command at once: {flag: path} for files and for directories."""
    for flag, path in dict(files).items():
        check_output_file(path, flag)
    for flag, path in dict(dirs).items():
        check_output_dir(path, flag)


def run_dir(save_dir: str | None, kind: str, run_id: str) -> Path | None:
    """Where a saved compare/tune run goes: SAVE_DIR/<kind>-<run_id>, or with this process's id
    added when another run of the same second took that name; None when not saving."""
    if not save_dir:
        return None
    out = Path(save_dir) / f"{kind}-{run_id}"
    return Path(f"{out}-{os.getpid()}") if out.exists() else out


def save_verdict(json_path: str | None, out_dir: Path | None, records: list[dict], text: str | None,
                 say) -> None:
    """A run's outputs (tune's, train's and train --tune's): its records to --json and, in its run
    directory, the records and, for a search, the printed verdict (text; None: a run with none);
    `say` prints where they went."""
    from .records import write_jsonl
    if json_path:
        write_jsonl(json_path, records)
    if out_dir:
        write_jsonl(out_dir / "records.jsonl", records)
        if text is None:
            say(f"# saved records in {out_dir}/")
            return
        (out_dir / "verdict.txt").write_text(text + "\n")
        say(f"# saved records, verdict and logs in {out_dir}/")
