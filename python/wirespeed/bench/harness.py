"""The harness: for each series (collective x dtype x op) and size, warm up, time, check, aggregate.

Timing (as nccl-tests and PARAM do it, stated in docs/metrics.md): every iteration is timed on every
rank with a host clock that closes on a device sync; the time of an iteration is the slowest rank's;
the reported time is the median over iterations, with min, max and p99 beside it. Checking runs
after the timed loop on freshly filled inputs, so it never disturbs the timing, and every rank's
count of wrong elements is summed into the `wrong` field.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Iterator

from ..backends.base import Backend, RankInfo
from .collectives import COLLECTIVES, Case, Collective
from .config import BenchConfig
from .dtypes import DTYPES, DType
from .watchdog import Watchdog


@dataclass(frozen=True)
class Series:
    collective: Collective
    dtype: DType
    op: str | None
    root: int


def series_of(cfg: BenchConfig) -> list[Series]:
    out = []
    for cname in cfg.collectives:
        coll = COLLECTIVES[cname]
        dtypes = [DTYPES[d] for d in cfg.dtypes] if cname != "barrier" else [DTYPES["float32"]]
        for dt in dtypes:
            for op in (cfg.ops if coll.reduces else [None]):
                out.append(Series(coll, dt, op, cfg.root if coll.rooted else -1))
    return out


def sizes_for(coll: Collective, cfg: BenchConfig) -> list[int]:
    return [0] if coll.name == "barrier" else cfg.sizes


def make_case(s: Series, nbytes: int, inplace: bool, info: RankInfo, device: str) -> Case:
    count, send, recv = s.collective.counts(nbytes, s.dtype.itemsize, info.world_size)
    return Case(s.collective.name, s.dtype, s.op, s.root, inplace, count, send, recv,
                info.rank, info.world_size, device)


def steps(cfg: BenchConfig) -> Iterator[tuple[Series, int]]:
    for s in series_of(cfg):
        for nbytes in sizes_for(s.collective, cfg):
            yield s, nbytes


def percentile(sorted_vals: list[float], q: float) -> float:
    """Nearest-rank percentile of an already sorted list (q in 0..100)."""
    if not sorted_vals:
        return float("nan")
    k = max(0, min(len(sorted_vals) - 1, int(-(-q * len(sorted_vals) // 100)) - 1))
    return sorted_vals[k]


def summarize(per_rank_times_s: list[list[float]]) -> dict:
    """Per iteration the slowest rank's time; then median/min/max/p99 over iterations, in us."""
    slowest = sorted(max(col) for col in zip(*per_rank_times_s))
    n = len(slowest)
    median = (slowest[(n - 1) // 2] + slowest[n // 2]) / 2
    return {"time_us": median * 1e6, "time_min_us": slowest[0] * 1e6,
            "time_max_us": slowest[-1] * 1e6, "time_p99_us": percentile(slowest, 99) * 1e6}


def measure(backend: Backend, case: Case, coll: Collective, cfg: BenchConfig,
            watchdog: Watchdog) -> dict:
    """Time one case on this rank and check it; returns the aggregate over all ranks."""
    label = f"{case.collective} {case.nbytes} B {case.dtype.name}{' ' + case.op if case.op else ''}"
    watchdog.step(f"allocating {label}")
    bufs = coll.alloc(case)
    coll.fill_inputs(case, bufs)
    watchdog.step(f"warming up {label}")
    for _ in range(cfg.warmup_iters):
        coll.run(backend, case, bufs)
    backend.synchronize()
    backend.barrier()
    times = []
    clock = time.perf_counter
    for i in range(cfg.iters):
        watchdog.step(f"running {label} (iteration {i + 1} of {cfg.iters})")
        t0 = clock()
        coll.run(backend, case, bufs)
        backend.synchronize()
        times.append(clock() - t0)
    wrong = 0
    if cfg.check:
        watchdog.step(f"checking {label}")
        coll.fill_inputs(case, bufs)
        backend.barrier()  # nobody may receive fresh data into a buffer a peer is still refilling
        coll.run(backend, case, bufs)
        backend.synchronize()
        wrong = coll.wrong(case, bufs)
    watchdog.step(f"gathering results of {label}")
    rows = backend.allgather_floats([float(wrong)] + times)
    del bufs
    out = summarize([r[1:] for r in rows])
    out["wrong"] = int(sum(r[0] for r in rows))
    return out


def run_rank(cfg: BenchConfig, info: RankInfo, backend: Backend, device: str,
             on_result: Callable[[dict], None], on_step: Callable[[], None] = lambda: None) -> int:
    """Run every case on this rank; on_result gets each measurement (same on every rank).
    Returns the total of wrong elements over all cases and ranks."""
    watchdog = Watchdog(cfg.timeout_s, info.rank)
    total_wrong = 0
    try:
        for s, nbytes in steps(cfg):
            for inplace in s.collective.variants:
                reason = backend.unsupported(s.collective.name, s.dtype.name, s.op, inplace, device)
                if reason:
                    continue
                case = make_case(s, nbytes, inplace, info, device)
                m = measure(backend, case, s.collective, cfg, watchdog)
                factor = s.collective.busbw_factor(info.world_size)
                algbw = case.nbytes / (m["time_us"] * 1e-6) / 1e9 if m["time_us"] > 0 else 0.0
                m.update(collective=s.collective.name, dtype=s.dtype.name, op=s.op, root=s.root,
                         bytes=case.nbytes, count=case.count, inplace=inplace,
                         algbw_gbps=algbw, busbw_gbps=algbw * factor, busbw_factor=factor,
                         checked=cfg.check, iters=cfg.iters, warmup_iters=cfg.warmup_iters)
                total_wrong += m["wrong"]
                on_result(m)
            on_step()
        watchdog.step("finishing")
        backend.barrier()
    finally:
        watchdog.close()
    return total_wrong
