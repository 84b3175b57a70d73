"""Checking a strategy's result and gathering every rank's timings: the end of each run, shared by
the synchronous strategies (runner.py), the overlapped allreduce (overlap.py) and the
asynchronous parameter server (async_ps.py)."""
from __future__ import annotations

from ..bench.harness import summarize
from .bucketing import BucketPlan
from .data import ErrorMeter, digest

def check_slice(results, plan: BucketPlan, rank: int, world: int, expected) -> ErrorMeter:
    """Compare this rank's share [rank/world, (rank+1)/world) of the flat result with the reference."""
    meter = ErrorMeter()
    lo, hi = plan.numel * rank // world, plan.numel * (rank + 1) // world
    for b, t in zip(plan.buckets, results):
        a, z = max(lo, b.offset), min(hi, b.offset + b.numel)
        if a < z:
            meter.add(t[a - b.offset:z - b.offset], a, expected)
    return meter


def finish(backend, rank: int, world: int, times: list[float], meter: ErrorMeter, results,
           extra: list[float] = ()) -> tuple[dict, list[list[float]]]:
    """Gather timings, error parts and result hashes from every rank into one summary."""
    h = float(int(digest(results)[:12], 16)) if results is not None else -1.0
    rows = backend.allgather_floats([meter.diff, meter.norm, h, *extra, *times])
    k = 3 + len(extra)
    out = summarize([r[k:] for r in rows]) if times else {}
    out["error"] = ErrorMeter.combine(sum(r[0] for r in rows), sum(r[1] for r in rows))
    hashes = {r[2] for r in rows if r[2] >= 0}
    out["ranks_agree"] = len(hashes) <= 1
    if not out["ranks_agree"]:
        out["error"] = max(out["error"], float("inf"))  # some rank holds a different result
    out["digest"] = digest(results) if results is not None else None
    return out, [r[3:k] for r in rows]
