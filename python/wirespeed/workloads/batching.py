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

import sys
import time

import torch

from ..bench.dtypes import DType
from ..bench.harness import summarize
from ..bench.verifiable import count_wrong, fill, reduce_values
from ..report.records import record
from ..sizes import format_size, human_bytes
from .config import BatchingConfig
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


# `wirespeed batching`'s rank, its backend started (cli/batching.py parses the flags, picks the
# total and starts the ranks): every call count measured, and on rank 0 the table, fit and records.


def run_as_rank(c: BatchingConfig, info, backend, device, total: int) -> int:
    from ..bench.watchdog import guarded_rank
    dt = c.dtype
    # Under an outer launcher each host picked its own default: all use the smallest.
    total = int(min(r[0] for r in backend.allgather_floats([float(total)])))
    lead = info.rank == 0
    if lead:
        print(f"# wirespeed batching: {format_size(total)} of {dt.name} all_reduce (sum) as "
              f"{', '.join(map(str, c.chunks))} calls; backend {c.backend}, device {c.device}, "
              f"{info.world_size} ranks")
        print(f"# {c.iters} timed steps after {c.warmup} warm-up; time = median over steps of the "
              "slowest rank; every chunk count checked with exact data")
        sys.stdout.flush()
    rows = []
    with guarded_rank(info.rank, c.timeout) as watchdog:
        buf = torch.empty(total // dt.itemsize, dtype=dt.torch, device=device)
        for k in c.chunks:
            rows.append(measure_chunks(backend, buf, k, dt, info.rank, info.world_size, c.warmup,
                                       c.iters, watchdog))
        watchdog.step("finishing")
        backend.barrier()
    wrong = sum(r["wrong"] for r in rows)
    if lead:
        _report(c, info, total, rows)
        if wrong:
            sys.stderr.write(f"wirespeed: error: {wrong} wrong elements: the backend returned wrong data\n")
    return 1 if wrong else 0


def _report(c, info, total, rows) -> None:
    from ..envinfo import record_env
    from ..report.records import write_jsonl
    fit = fit_latency_bandwidth([(r["chunks"], r["time_us"] * 1e-6) for r in rows], total)
    print(f"{'calls':>7} {'bytes/call':>11} {'total(ms)':>11} {'per call(us)':>13} {'GB/s':>8} "
          f"{'fit(ms)':>9} {'#wrong':>7}")
    run_id = time.strftime("%Y%m%d-%H%M%S")
    env = record_env()
    records = []
    for r in rows:
        t = r["time_us"]
        model = (r["chunks"] * fit[0] + fit[1] * total) * 1e3 if fit else float("nan")
        print(f"{r['chunks']:>7} {human_bytes(r['chunk_bytes']):>11} {t / 1e3:>11.3f} "
              f"{t / r['chunks']:>13.1f} {total / (t * 1e-6) / 1e9 if t else 0:>8.3f} {model:>9.3f} "
              f"{r['wrong']:>7}")
        records.append(record("batching", {"run_id": run_id, "backend": c.backend,
                        "device": c.device, "dtype": c.dtype.name, "world_size": info.world_size,
                        "total_bytes": total, **r, "per_call_us": t / r["chunks"],
                        "algbw_gbps": total / (t * 1e-6) / 1e9 if t else 0.0,
                        "fit_latency_us": fit[0] * 1e6 if fit else None,
                        "fit_bandwidth_gbps": 1 / fit[1] / 1e9 if fit and fit[1] > 0 else None,
                        "env": env}))
    if fit:
        bw = f"{1 / fit[1] / 1e9:.3f} GB/s" if fit[1] > 0 else "unbounded (b <= 0: noise dominates)"
        print(f"# fit over {len(rows)} points: t_call = a + b*bytes with a = {fit[0] * 1e6:.1f} us, "
              f"1/b = {bw}")
    else:
        print("# fit: needs at least two different chunk counts")
    if len(rows) > 1:
        lo, hi = rows[0], rows[-1]
        print(f"# {hi['chunks']} calls of {human_bytes(hi['chunk_bytes'])} took "
              f"{hi['time_us'] / lo['time_us']:.2f}x the time of {lo['chunks']} call(s) of "
              f"{human_bytes(lo['chunk_bytes'])}")
    if c.json_path:
        write_jsonl(c.json_path, records)
    if c.plot_path:
        from .plots import plot_batching
        plot_batching(records, fit, total, c.plot_path)
        print(f"# plot written to {c.plot_path}")
    sys.stdout.flush()
