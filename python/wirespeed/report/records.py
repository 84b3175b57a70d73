"""The one record schema every result is written in (JSON lines), documented in docs/records.md.

A record is a flat dict of one measurement plus an `env` dict describing where it ran, so records
from a cluster can be re-rendered anywhere. Readers accept any record with the required fields.
"""
from __future__ import annotations

import csv
import json
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import UsageError

SCHEMA = "wirespeed.bench/1"

# What a field must hold for a reader to use it: the required fields of each kind, and the
# optional ones a renderer reads. "count" is a whole number >= 0, "num" a finite number >= 0 (NaN or
# infinity in a time would poison every mean, fit and axis drawn from it), "str?" a string or null.
BENCH_FIELDS = {"collective": "str", "backend": "str", "dtype": "str", "op": "str?", "device": "str",
                "world_size": "count", "bytes": "count", "count": "count", "inplace": "bool",
                "time_us": "num", "algbw_gbps": "num", "busbw_gbps": "num", "wrong": "count"}
REQUIRED = tuple(BENCH_FIELDS)
OPTIONAL = {"env": "dict", "root": "int", "layout": "list", "link_rate_gbps": "num?", "total_bytes": "num"}

# Every kind of record wirespeed writes, by its schema, with the fields a reader needs. bench,
# compare, tune and predict (`"predicted": true`) all write the bench schema; records without a
# schema field are bench records of an early version.
KINDS = {
    SCHEMA: ("bench", BENCH_FIELDS),
    "wirespeed.model/1": ("model", {"model": "str", "strategy": "str", "backend": "str",
                                    "world_size": "count", "time_us": "num", "total_bytes": "count"}),
    "wirespeed.batching/1": ("batching", {"backend": "str", "world_size": "count",
                                          "total_bytes": "count", "chunks": "count", "time_us": "num"}),
    "wirespeed.objects/1": ("objects", {"backend": "str", "world_size": "count", "method": "str",
                                        "time_us": "num"}),
    "wirespeed.tune/1": ("tune", {"backend": "str", "knobs": "list", "setting": "dict",
                                  "min_bytes": "count", "max_bytes": "count", "gain": "num"}),
    "wirespeed.links/1": ("links", {"backend": "str", "world_size": "count", "src": "count",
                                    "dst": "count", "bytes": "count", "gbps": "num"}),
    "wirespeed.train/1": ("train", {"backend": "str", "world_size": "count", "model": "str",
                                    "parallel": "str", "samples_per_s": "num", "step_us": "num",
                                    "compute_us": "num", "exposed_pct": "num",
                                    "bytes_per_step": "num", "state_digest": "str"}),
}

# Each kind's schema, by the kind's name: what `record` stamps.
SCHEMAS = {kind: schema for schema, (kind, _) in KINDS.items()}


def record(kind: str, fields: dict) -> dict:
    """A new record of `kind` (bench, model, batching, objects, tune, links, train): its schema, then
    `fields` in their order. The one place a schema string is written into a record."""
    return {"schema": SCHEMAS[kind], **fields}


# Column order for CSV: required fields first, then the rest as they come.
CSV_FIELDS = ("schema", "run_id", "collective", "backend", "dtype", "op", "device", "world_size",
              "root", "bytes", "count", "inplace", "time_us", "time_method", "loops", "time_rank_mean_us",
              "time_p50_us", "time_p99_us", "time_min_us", "time_max_us", "algbw_gbps", "busbw_gbps", "busbw_factor", "wrong", "checked",
              "iters", "warmup_iters")


def write_jsonl(path, records) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for r in records:
            f.write(json.dumps(r, sort_keys=False) + "\n")


def write_csv(path, records) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        # bench --plan's records name their plan: columns only where some record has them.
        extra = tuple(k for k in ("plan", "plan_file") if any(k in r for r in records))
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS + extra, extrasaction="ignore")
        w.writeheader()
        for r in records:
            w.writerow(r)


def kind(r: dict) -> str:
    """bench, model, batching, objects, tune, links or train; "" for a schema this version does not know."""
    schema = r.get("schema", SCHEMA)
    return KINDS[schema][0] if isinstance(schema, str) and schema in KINDS else ""


def bench_records(records) -> list[dict]:
    """The collective measurements (bench schema) among records of any kind."""
    return [r for r in records if kind(r) == "bench"]


# The longest line read as a record. A record is a few KiB (env.hosts adds ~10 bytes a rank, so
# this holds a job of 100,000 ranks); a longer line is not ours, and reading it whole could take
# the machine's memory (a log of binary data renamed .jsonl).
MAX_LINE = 4 << 20


def read_records(path) -> list[dict]:
    """Records of every kind from a JSON-lines file, or from every .jsonl under a run directory,
    for files wirespeed just wrote itself (a bench run's --json): a line that is not a record is a
    one-line UsageError. A record of a kind this version does not know is kept as it is. Files a
    user names go through `load` instead, which skips what it cannot use and says so."""
    out = []
    for where, r, problem in _scan(path):
        if problem:
            raise UsageError(f"{where}: {problem}")
        out.append(r)
    return out


@dataclass
class Loaded:
    """What `load` found: the records the command can use, and a count of the rest by reason."""

    records: list[dict]
    skipped: Counter = field(default_factory=Counter)   # reason -> records (or lines)
    first_bad: str = ""                                  # where and why the first malformed line was
    who: str = ""

    def note(self) -> str:
        """One line saying what was left out, or "" when nothing was."""
        if not self.skipped:
            return ""
        total = sum(self.skipped.values())
        return f"# skipped {total} record{'s' if total != 1 else ''} {self.who} does not use: " \
               f"{_counts(self.skipped, self.first_bad)}"


def _counts(skipped: Counter, first_bad: str) -> str:
    parts = ", ".join(f"{n} {why}" for why, n in skipped.items())
    return parts + (f"; the first malformed: {first_bad}" if first_bad else "")


def load(paths, uses: tuple[str, ...], who: str, flag: str = "") -> Loaded:
    """The records of `paths` (files or run directories) that `who` (a command) can use: those of
    the kinds in `uses` whose fields are sound. Records of other kinds, and malformed lines (not
    JSON, NaN or infinite numbers, missing fields, nested too deep, over MAX_LINE), are skipped
    and counted. A path that gives nothing usable is refused in one line: the user named the wrong
    file, and an empty report would hide it."""
    loaded = Loaded([], who=who)
    names = " or ".join(uses)
    for path in paths:
        mine: list[dict] = []
        skipped: Counter = Counter()
        first_bad = ""
        for where, r, problem in _scan(path):
            if problem:
                skipped["malformed"] += 1
                first_bad = first_bad or f"{where}: {problem}"
            elif kind(r) in uses:
                mine.append(r)
            else:
                skipped[kind(r) or f"of schema {str(r.get('schema'))[:40]}"] += 1
        if not mine:
            found = _counts(skipped, first_bad) if skipped else "it is empty"
            raise UsageError(f"{who}{' ' + flag if flag else ''} {path}: no {names} records in it "
                             f"({found}): give a file of {names} records")
        loaded.records.extend(mine)
        loaded.skipped.update(skipped)
        loaded.first_bad = loaded.first_bad or first_bad
    return loaded


def _scan(path):
    """(where, record, None) for each record of `path`, (where, None, why) for each line that is
    not one; a path that cannot be read at all is a UsageError."""
    p = Path(path)
    if p.is_dir():
        files = sorted(p.rglob("*.jsonl"))
        if not files:
            raise UsageError(f"{path}: no .jsonl records in this directory")
        for f in files:
            yield from _scan(f)
        return
    if not p.exists():
        raise UsageError(f"{path}: no such file")
    try:
        with open(p, "rb") as f:
            lineno = 0
            while True:
                line = f.readline(MAX_LINE + 1)
                if not line:
                    break
                lineno += 1
                where = f"{path}:{lineno}"
                if len(line) > MAX_LINE and not line.endswith(b"\n"):
                    while line and not line.endswith(b"\n"):  # skip the rest of the long line
                        line = f.readline(MAX_LINE)
                    yield where, None, f"a line over {MAX_LINE >> 20} MiB, not a record"
                    continue
                if line.strip():
                    r, problem = _record(line)
                    yield where, r, problem
    except OSError as e:
        raise UsageError(f"{path}: cannot read it ({e.strerror or type(e).__name__})") from None


def _record(line: bytes) -> tuple[dict | None, str | None]:
    """(record, None), or (None, what is wrong with the line)."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError:
        return None, "not a text file (wirespeed records are JSON lines, UTF-8)"
    try:
        r = json.loads(text)
    except json.JSONDecodeError:
        return None, "not a JSON line (expected wirespeed records; a truncated line?)"
    except RecursionError:
        return None, "JSON nested too deep to be a record"
    if not isinstance(r, dict):
        return None, f"a JSON {type(r).__name__}, not a record (expected one JSON object per line)"
    schema = r.get("schema", SCHEMA)
    if not isinstance(schema, str):
        return None, "its schema is not a string"
    if schema not in KINDS:
        return r, None  # an unknown kind is kept as it is; readers skip it
    name, fields = KINDS[schema]
    missing = [k for k in fields if k not in r]
    if missing:
        return None, f"{name} record lacks {', '.join(missing)}"
    for k, want in [*fields.items(), *((k, w) for k, w in OPTIONAL.items() if k in r)]:
        why = _wrong_type(r[k], want)
        if why:
            return None, f"{name} record has {why} {k} ({str(r[k])[:40]})"
    return r, None


def _wrong_type(v, want: str) -> str:
    """"" when `v` is what `want` says, else a word for what it is instead."""
    if want.endswith("?"):
        if v is None:
            return ""
        want = want[:-1]
    if want in ("num", "count", "int"):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return "non-numeric"
        if not math.isfinite(v):
            return "non-finite"
        if want != "int" and v < 0:
            return "negative"
        return "fractional" if want != "num" and v != int(v) else ""
    types = {"str": str, "bool": bool, "list": list, "dict": dict}[want]
    return "" if isinstance(v, types) else f"non-{want}"
