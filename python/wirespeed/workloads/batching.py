"""One big reduction against many small ones of the same total (the 1 x 4 GB vs 1000 x 4 MB comparison).

One buffer of `total` bytes is all_reduced as k near-equal chunks, one call each, back to back. Each
call costs about a + b * bytes (latency plus bytes over bandwidth), so k calls of total/k bytes cost
k * a + b * total: only the latency term grows with k. The fit recovers a and b by least squares
over every measured k, from the per-call time t/k against the per-call size total/k.

Each chunk count is checked: exact data (bench/verifiable.py) are reduced as chunks, then every rank
compares its share of the sum with the reference and hashes its whole result; equal hashes on every
rank carry the check to every rank's copy.
"""
from __future__ import annotations

import time

import torch

from ..bench.dtypes import DType
from ..bench.harness import summarize
from ..bench.verifiable import count_wrong, fill, reduce_values
from .data import digest


def chunk_views(buf: torch.Tensor, k: int) -> list[torch.Tensor]:
    """k contiguous, near-equal pieces covering `buf` (the first ones one element longer)."""
    return list(torch.tensor_split(buf, k))


def fit_latency_bandwidth(points: list[tuple[int, float]], total: int) -> tuple[float, float] | None:
    """Fit per-call t = a + b * bytes to (calls k, total seconds T_k) points: T_k = a * k + b * total.

    Least squares on the total times, i.e. on the per-call model multiplied by k: fitting per-call
    times directly would let the one-call point (the largest time) fix the slope and leave the
    latency a at the mercy of its noise. Returns (a seconds, b seconds per byte), or None when fewer
    than two distinct call counts were measured."""
    n = len(points)
    if n < 2 or total <= 0:
        return None
    mk = sum(k for k, _ in points) / n
    mt = sum(t for _, t in points) / n
    skk = sum((k - mk) ** 2 for k, _ in points)
    if skk == 0:
        return None
    a = sum((k - mk) * (t - mt) for k, t in points) / skk
    return a, (mt - a * mk) / total


def measure_chunks(backend, buf: torch.Tensor, k: int, dt: DType, rank: int, world: int,
                   warmup: int, iters: int, watchdog) -> dict:
    views = chunk_views(buf, k)

    def step():
        for v in views:
            backend.all_reduce(v, v, "sum")

    fill(buf, rank, 0, dt, "sum", world)
    watchdog.step(f"warming up {k} chunks")
    for _ in range(warmup):
        step()
    backend.synchronize()
    backend.barrier()
    times = []
    for i in range(iters):
        watchdog.step(f"timing {k} chunks (iteration {i + 1} of {iters})")
        t0 = time.perf_counter()
        step()
        backend.synchronize()
        times.append(time.perf_counter() - t0)
    watchdog.step(f"checking {k} chunks")
    fill(buf, rank, 0, dt, "sum", world)
    backend.barrier()
    step()
    backend.synchronize()
    n = buf.numel()
    lo, hi = n * rank // world, n * (rank + 1) // world
    wrong = count_wrong(buf[lo:hi], lambda off, c: reduce_values(range(world), lo + off, c, dt, "sum", world),
                        dt, "sum")
    h = float(int(digest([buf])[:12], 16))
    rows = backend.allgather_floats([float(wrong), h, *times])
    out = summarize([r[2:] for r in rows])
    out["wrong"] = int(sum(r[0] for r in rows))
    if len({r[1] for r in rows}) > 1:
        out["wrong"] = max(out["wrong"], 1)  # some rank's copy differs from the checked ones
    out["chunks"] = k
    out["chunk_bytes"] = views[0].numel() * dt.itemsize
    return out
