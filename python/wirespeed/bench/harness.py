"""The harness: for each series (collective x dtype x op) and size, warm up, time, check, aggregate.

Timing has two parts (docs/metrics.md says when each is the right figure):

- the loop (the `time_us` of records and the table's time column), as nccl-tests times: after the
  warm-up and a barrier, `iters` calls back to back with one device sync at the end; a rank's time is
  elapsed / iters, and a loop's is the slowest rank's (nccl-tests' mean over ranks is kept beside
  it in records). Up to LOOPS such loops run back to back and the figure is the median loop's: the
  first loop after the warm-up and the refill of the inputs is colder than the library's steady
  state (a 4 KiB all_reduce on two ranks: 7-10 us against 5.5-6), and one loop of a few
  microseconds is one sample of a shared machine. Calls may overlap (launches pipeline on a
  GPU, a fast rank runs ahead), as they do in a training loop;
- single calls (`time_p50_us`, `time_p99_us`, `time_min_us`, `time_max_us`): each call timed on its
  own, closed by a device sync; a call's time is the slowest rank's; percentiles over calls. This is
  the latency of one isolated collective, skew between ranks included. `--no-per-op` skips it.

A timed call is the library's call and nothing else of ours: the collective's call is bound once
per case (Collective.bind, Backend.bind: the op's enum, MPI's buffer views resolved ahead), and the
loop around it only counts calls for the watchdog.

Every timed call works on verifiable data and is checked: where several calls in a row leave the
result of one (out of place, copies, min/max), the buffers the last timed call wrote are checked as
they lie; otherwise (an in-place sum feeds its result into the next call) the inputs are refilled
and one more call is run and checked. Checking never runs inside a timed region, and every rank's
count of wrong elements is summed into the `wrong` field.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable, Iterator

from ..backends.base import Backend, RankInfo
from ..errors import UsageError
from .collectives import COLLECTIVES, Case, Collective
from .config import BenchConfig
from .dtypes import DTYPES, DType
from .watchdog import Watchdog

# records' time_method: the median over `loops` loops of each loop's slowest rank ("loop-slowest"
# in records before that: one loop; "loop" before that: one loop's mean over ranks)
LOOPS_MEDIAN = "loops-median"
# At most this many timed loops per case, while they take at most about LOOPS_WITHIN_S together:
# a loop of a big message is long enough to be its own steady state, and the sweep's time stays.
LOOPS = 5
LOOPS_WITHIN_S = 0.5


def loops_for(first_loop_s: float) -> int:
    """How many timed loops a case gets, from its first loop's time (the slowest rank's, so every
    rank decides alike): an odd count, so the median is one loop's."""
    n = min(LOOPS, max(1, int(LOOPS_WITHIN_S / first_loop_s) if first_loop_s > 0 else LOOPS))
    return n if n % 2 else n - 1


@dataclass(frozen=True)
class Series:
    collective: Collective
    dtype: DType
    op: str | None
    root: int


def series_of(cfg: BenchConfig) -> list[Series]:
    if cfg.plan:
        # An execution plan is one series: float32, summed where its collective reduces.
        coll = plan_collective(cfg)
        return [Series(coll, DTYPES["float32"], "sum" if coll.reduces else None, cfg.root if coll.rooted else -1)]
    out = []
    for cname in cfg.collectives:
        coll = COLLECTIVES[cname]
        dtypes = [DTYPES[d] for d in cfg.dtypes] if cname != "barrier" else [DTYPES["float32"]]
        for dt in dtypes:
            for op in (cfg.ops if coll.reduces else [None]):
                out.append(Series(coll, dt, op, cfg.root if coll.rooted else -1))
    return out


_PLANS: dict[tuple, Collective] = {}


def plan_collective(cfg: BenchConfig) -> Collective:
    """The plan of `bench --plan` as a collective, read once per process."""
    key = (cfg.plan, cfg.timeout_s)
    if key not in _PLANS:
        from .collectives.plan import PlanCollective
        # The executor's own limit comes just before the watchdog's, so the error names the op.
        _PLANS[key] = PlanCollective(cfg.plan, max(cfg.timeout_s * 0.5, cfg.timeout_s - 1.0))
    return _PLANS[key]


# How check_something_runs's refusal begins: compare lists such a combination under "no results"
# (every case n/a), not under "failed".
NOTHING_RUNS = "nothing to run"


def check_something_runs(cfg: BenchConfig, backend: Backend, world: int, device: str) -> None:
    """A UsageError when the backend can run no case of the run at all (gloo has no integer avg,
    send_recv needs two ranks): the run would print no table and exit 0, which reads as success.
    A run where only some cases cannot run shows their reason in the table instead."""
    reasons = []
    for s in series_of(cfg):
        why = [backend.unsupported(s.collective.name, s.dtype.name, s.op, inplace, device, world)
               for inplace in s.collective.variants]
        if not all(why):
            return
        case = " ".join(x for x in (s.collective.name, s.dtype.name, s.op) if x)
        reasons.append(f"{case}: {next(w for w in why if w not in ('n/a', None))}"
                       if any(w != "n/a" for w in why) else f"{case}: n/a")
    shown = "; ".join(dict.fromkeys(reasons[:3])) + ("; ..." if len(reasons) > 3 else "")
    raise UsageError(f"{NOTHING_RUNS}: {cfg.backend} can run no case asked for ({shown}): "
                     "choose other -c/-d/-o or more ranks")


def sizes_for(coll: Collective, cfg: BenchConfig) -> list[int]:
    return [0] if coll.name == "barrier" else coll.sizes(cfg.sizes)


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
    """Single calls: per call the slowest rank's time; then median/min/max/p99 over calls, in us."""
    slowest = sorted(max(col) for col in zip(*per_rank_times_s))
    n = len(slowest)
    median = (slowest[(n - 1) // 2] + slowest[n // 2]) / 2
    return {"time_us": median * 1e6, "time_min_us": slowest[0] * 1e6,
            "time_max_us": slowest[-1] * 1e6, "time_p99_us": percentile(slowest, 99) * 1e6}


def summarize_loop(per_rank_elapsed_s: list[list[float]], iters: int) -> dict:
    """The loops (per rank, each loop's elapsed): a loop's time is its slowest rank's elapsed /
    iters (the loop is done when the last rank's last call is), and the figure is the median over
    loops; the mean over ranks (nccl-tests' default, `-a 1`) beside it, its median over loops too,
    in us. Not the mean: a root whose sends complete into socket buffers finishes early, and a
    mean with it claims more than the wire carried (broadcast at 1.2x a capped link)."""
    loops = list(zip(*per_rank_elapsed_s))
    slowest = [max(loop) / iters for loop in loops]
    mean = [sum(loop) / len(loop) / iters for loop in loops]
    return {"time_us": statistics.median(slowest) * 1e6, "time_rank_mean_us": statistics.median(mean) * 1e6,
            "loops": len(loops), "time_loops_us": [t * 1e6 for t in slowest]}


def summarize_ops(per_rank_times_s: list[list[float]]) -> dict:
    """Single calls under the names records give them (time_p50_us, time_p99_us, min, max)."""
    s = summarize(per_rank_times_s)
    return {"time_p50_us": s["time_us"], "time_p99_us": s["time_p99_us"],
            "time_min_us": s["time_min_us"], "time_max_us": s["time_max_us"]}


def check_last(backend: Backend, coll: Collective, case: Case, bufs, call: Callable[[], object]) -> int:
    """Wrong elements of the last timed call where its result lies in the buffers; else of one more
    call on freshly filled inputs (see the module's docstring). `call` is the timed loops' bound
    call (Collective.bind), so the checked call is the very one that was timed."""
    if not coll.repeat_keeps_result(case):
        coll.fill_inputs(case, bufs)
        backend.barrier()  # nobody may receive fresh data into a buffer a peer is still refilling
        call()
        backend.synchronize()
    return coll.wrong(case, bufs)


def _start_timed(backend: Backend, coll: Collective, case: Case, bufs) -> None:
    """Fresh inputs, outputs poisoned, every rank at the start line."""
    coll.fill_inputs(case, bufs)
    coll.poison_outputs(case, bufs)
    backend.synchronize()
    backend.start_line()


def timed_loops(backend: Backend, call: Callable[[], object], iters: int, watchdog: Watchdog,
                label: str, sent_bytes: Callable[[], int] | None = None,
                stamps: list | None = None) -> tuple[list[float], float]:
    """The loops of one case, every rank at the start line already: this rank's elapsed seconds
    per loop, and what its host sent during them (-1 where unknown). The first loop's time sets
    how many follow (loops_for); between two loops the ranks meet at an untimed barrier, so a
    loop's clock never runs while a peer is still finishing the previous loop. `stamps` (bench
    --trace): a list that gets, per loop, its start, each call's entry and return and its end
    (clock readings, s: tracing.py); None: the loop reads no clock around a call."""
    clock = time.perf_counter
    progress = watchdog.progress
    elapsed: list[float] = []
    sent = 0
    loops = 1
    while len(elapsed) < loops:
        if elapsed:
            backend.start_line()
        watchdog.step(f"running {label} (loop {len(elapsed) + 1}: {iters} calls back to back)")
        # The clock starts before a second barrier, which no rank leaves before every rank has
        # started its clock: so no byte of the loop can cross before any rank's start, and the
        # slowest rank's elapsed covers the whole loop. Started after the barrier, a rank that left
        # it late (it learns last that everyone arrived) misses the bytes sent before it looked,
        # and small loops claimed up to 1.4x a capped link. The price is one barrier per loop
        # (1/iters of one per call: 0.03 us of a 4 KiB all_reduce's ~5 us on two wirespeed ranks,
        # whose start line is the engine's barrier), on the side of never claiming more than was
        # moved; the untimed one before it has the ranks arrive together, so it costs the
        # barrier's latency, not the skew between ranks.
        s0 = sent_bytes() if sent_bytes else 0
        t0 = clock()
        backend.start_line()
        if stamps is None:
            for _ in range(iters):
                call()
                progress()  # each call must end within the timeout; the loop may take longer
        else:
            stamps.append(t0)
            for _ in range(iters):
                stamps.append(clock())
                call()
                stamps.append(clock())
                progress()
        backend.synchronize()
        elapsed.append(clock() - t0)
        if stamps is not None:
            stamps.append(t0 + elapsed[-1])
        if sent_bytes:
            sent += sent_bytes() - s0
        if len(elapsed) == 1:
            loops = loops_for(max(r[0] for r in backend.allgather_floats([elapsed[0]])))
    return elapsed, (float(sent) if sent_bytes else -1.0)


def measure(backend: Backend, case: Case, coll: Collective, cfg: BenchConfig,
            watchdog: Watchdog, sent_bytes: Callable[[], int] | None = None, bufs=None,
            trace=None) -> dict:
    """Time one case on this rank (the loops, then single calls) and check it; returns the
    aggregate over all ranks. `sent_bytes`, where the rank's host link is known (the emulated
    cluster), reads what the host has sent over it: the loops' share of it per second becomes
    `link_sent_gbps`, what really crossed beside what busbw assumes. `bufs`: the case's buffers
    where the caller has them (alloc's otherwise). `trace` (bench --trace, tracing.Trace): the
    case's calls become spans, their readings gathered with the results."""
    label = f"{case.collective} {case.nbytes} B {case.dtype.name}{' ' + case.op if case.op else ''}"
    clock = time.perf_counter
    watchdog.step(f"allocating {label}")
    if bufs is None:
        bufs = coll.alloc(case)
    call = coll.bind(backend, case, bufs)
    coll.fill_inputs(case, bufs)
    watchdog.step(f"warming up {label}")
    for _ in range(cfg.warmup_iters):
        call()
        watchdog.progress()
    _start_timed(backend, coll, case, bufs)
    stamps = [] if trace is not None else None
    elapsed, sent = timed_loops(backend, call, cfg.iters, watchdog, label, sent_bytes, stamps)
    wrong_loop = wrong_ops = 0
    if cfg.check:
        watchdog.step(f"checking {label} (after the loops)")
        wrong_loop = check_last(backend, coll, case, bufs, call)
    times = []
    if cfg.per_op:
        _start_timed(backend, coll, case, bufs)
        for i in range(cfg.iters):
            watchdog.step(f"running {label} (single call {i + 1} of {cfg.iters})")
            t0 = clock()
            call()
            backend.synchronize()
            times.append(clock() - t0)
            if stamps is not None:
                stamps += [t0, t0 + times[-1]]
        if cfg.check:
            watchdog.step(f"checking {label} (after the single calls)")
            wrong_ops = check_last(backend, coll, case, bufs, call)
    watchdog.step(f"gathering results of {label}")
    n = len(elapsed)
    rows = backend.allgather_floats([float(wrong_loop), float(wrong_ops), sent] + elapsed + times
                                    + (stamps or []))
    del bufs, call
    if trace is not None:
        trace.add_case([r[3 + n + len(times):] for r in rows], n, cfg.iters, len(times),
                       collective=case.collective, bytes=case.nbytes, dtype=case.dtype.name, op=case.op,
                       inplace=case.inplace)
    out = summarize_loop([r[3:3 + n] for r in rows], cfg.iters)
    if sent >= 0:
        # The barriers inside the timed regions and the header bytes count too: a figure of what
        # the wire carried, never more than the link, for the busiest host, over the loops' time.
        loops_s = sum(max(r[3 + k] for r in rows) for k in range(n))
        out["link_sent_gbps"] = max(r[2] for r in rows) / loops_s / 1e9
    if times:
        out.update(summarize_ops([r[3 + n:3 + n + len(times)] for r in rows]))
    # The worse of the two checked results, each summed over ranks (not their sum: one broken
    # element found twice is one wrong element).
    out["wrong"] = int(max(sum(r[0] for r in rows), sum(r[1] for r in rows)))
    out["time_method"] = LOOPS_MEDIAN
    return out


def run_rank(cfg: BenchConfig, info: RankInfo, backend: Backend, device: str,
             on_result: Callable[[dict], None], on_step: Callable[[], None] = lambda: None,
             sent_bytes: Callable[[], int] | None = None, trace=None) -> int:
    """Run every case on this rank; on_result gets each measurement (same on every rank).
    Returns the total of wrong elements over all cases and ranks. `sent_bytes`, `trace`: see
    measure."""
    check_something_runs(cfg, backend, info.world_size, device)  # under an outer launcher too
    watchdog = Watchdog(cfg.timeout_s, info.rank)
    total_wrong = 0
    begun: list[Collective] = []
    try:
        for s, nbytes in steps(cfg):
            if s.collective not in begun:
                watchdog.step(f"setting up {s.collective.name}")
                begun.append(s.collective)
                s.collective.begin(backend, info)
            for inplace in s.collective.variants:
                reason = backend.unsupported(s.collective.name, s.dtype.name, s.op, inplace, device)
                if reason:
                    continue
                case = make_case(s, nbytes, inplace, info, device)
                m = measure(backend, case, s.collective, cfg, watchdog, sent_bytes, trace=trace)
                factor = s.collective.busbw_factor(info.world_size)
                algbw = case.nbytes / (m["time_us"] * 1e-6) / 1e9 if m["time_us"] > 0 else 0.0
                m.update(collective=s.collective.name, dtype=s.dtype.name, op=s.op, root=s.root,
                         bytes=case.nbytes, count=case.count, inplace=inplace,
                         algbw_gbps=algbw, busbw_gbps=algbw * factor, busbw_factor=factor,
                         checked=cfg.check, iters=cfg.iters, warmup_iters=cfg.warmup_iters)
                m.update(s.collective.record_fields())
                total_wrong += m["wrong"]
                on_result(m)
            on_step()
        watchdog.step("finishing")
        backend.barrier()
        for c in begun:
            c.end()
    finally:
        watchdog.close()
    return total_wrong
