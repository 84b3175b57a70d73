"""The one record schema every result is written in (JSON lines), documented in docs/records.md.

A record is a flat dict of one measurement plus an `env` dict describing where it ran, so records
from a cluster can be re-rendered anywhere. Readers accept any record with the required fields.
"""
from __future__ import annotations

import csv
import json
from pathlib import Path

from ..errors import UsageError

SCHEMA = "wirespeed.bench/1"

REQUIRED = ("collective", "backend", "dtype", "op", "device", "world_size", "bytes", "count",
            "inplace", "time_us", "algbw_gbps", "busbw_gbps", "wrong")

# Every kind of record wirespeed writes, by its schema, with the fields a reader needs. bench,
# compare, tune and predict (`"predicted": true`) all write the bench schema; records without a
# schema field are bench records of an early version.
KINDS = {
    SCHEMA: ("bench", REQUIRED),
    "wirespeed.model/1": ("model", ("model", "strategy", "backend", "world_size", "time_us", "total_bytes")),
    "wirespeed.batching/1": ("batching", ("backend", "world_size", "total_bytes", "chunks", "time_us")),
    "wirespeed.objects/1": ("objects", ("backend", "world_size", "method", "time_us")),
    "wirespeed.tune/1": ("tune", ("backend", "knobs", "setting", "min_bytes", "max_bytes", "gain")),
}

# Each kind's schema, by the kind's name: what `record` stamps.
SCHEMAS = {kind: schema for schema, (kind, _) in KINDS.items()} | {"links": "wirespeed.links/1"}


def record(kind: str, fields: dict) -> dict:
    """A new record of `kind` (bench, model, batching, objects, tune, links): its schema, then
    `fields` in their order. The one place a schema string is written into a record."""
    return {"schema": SCHEMAS[kind], **fields}


# Column order for CSV: required fields first, then the rest as they come.
CSV_FIELDS = ("schema", "run_id", "collective", "backend", "dtype", "op", "device", "world_size",
              "root", "bytes", "count", "inplace", "time_us", "time_method", "time_rank_mean_us",
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
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        w.writeheader()
        for r in records:
            w.writerow(r)


def kind(r: dict) -> str:
    """bench, model, batching, objects or tune; "" for a schema this version does not know."""
    schema = r.get("schema", SCHEMA)
    return KINDS[schema][0] if schema in KINDS else ""


def bench_records(records) -> list[dict]:
    """The collective measurements (bench schema) among records of any kind."""
    return [r for r in records if kind(r) == "bench"]


def read_records(path) -> list[dict]:
    """Records of every kind from a JSON-lines file, or from every .jsonl under a run directory.
    A record of a kind this version does not know is kept as it is (readers skip it)."""
    p = Path(path)
    if p.is_dir():
        files = sorted(p.rglob("*.jsonl"))
        if not files:
            raise UsageError(f"{path}: no .jsonl records in this directory")
        return [r for f in files for r in read_records(f)]
    if not p.exists():
        raise UsageError(f"{path}: no such file")
    out = []
    try:
        with open(p, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if line.strip():
                    out.append(_record(line, f"{path}:{lineno}"))
    except UnicodeDecodeError:
        raise UsageError(f"{path}: not a text file (wirespeed records are JSON lines, UTF-8)") from None
    except OSError as e:
        raise UsageError(f"{path}: cannot read it ({e.strerror or type(e).__name__})") from None
    return out


# Fields a renderer does arithmetic on: a record with text there is corrupt, not a record.
NUMERIC = ("world_size", "bytes", "count", "time_us", "algbw_gbps", "busbw_gbps", "wrong",
           "total_bytes")


def _record(line: str, where: str) -> dict:
    try:
        r = json.loads(line)
    except json.JSONDecodeError:
        raise UsageError(f"{where}: not a JSON line (expected wirespeed records)") from None
    if not isinstance(r, dict):
        raise UsageError(f"{where}: a JSON {type(r).__name__}, not a record (expected one JSON "
                         "object per line)")
    schema = r.get("schema", SCHEMA)
    required = KINDS[schema][1] if schema in KINDS else ()  # an unknown kind is kept as it is
    missing = [k for k in required if k not in r]
    if missing:
        raise UsageError(f"{where}: record lacks {', '.join(missing)}")
    bad = [k for k in required if k in NUMERIC
           and (isinstance(r[k], bool) or not isinstance(r[k], (int, float)))]
    if bad:
        raise UsageError(f"{where}: record has non-numeric {', '.join(bad)}")
    return r
