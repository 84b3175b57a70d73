"""--overlap: how much of the gradient all_reduce hides behind the backward pass, as DDP overlaps it.

A backward pass is stood in for by matrix products: before bucket b's gradients are "ready", the
rank computes for as long as bucket b's all_reduce alone takes (measured first, the slowest rank's,
agreed by all). Then four timings of one step:
- comm: the buckets' all_reduces back to back (no compute);
- compute: the computation alone;
- serial: compute bucket b, then all_reduce it and wait, bucket after bucket;
- overlapped: compute bucket b, launch its all_reduce asynchronously, go on computing; wait at the end.
hidden = (serial - overlapped) / comm: the share of the communication that the compute covered
(at most about 1 - last bucket's share, since nothing follows the last bucket's compute).

Asynchronous collectives come from torch.distributed (async_op=True), so this runs on
torch.distributed backends only.
"""
from __future__ import annotations

import time

import torch

from ..bench.dtypes import DTYPES
from ..bench.harness import summarize
from ..errors import UsageError
from .check import check_slice, finish
from .data import LR, grad_divisor, reference
from .strategies import StepState

UNIT_N = 128          # a compute unit is one UNIT_N x UNIT_N matrix product
CALIBRATE_REPS = 5
CALIBRATE_ROUNDS = 3


class Compute:
    def __init__(self, device: str):
        self.a = torch.randn(UNIT_N, UNIT_N, device=device) / UNIT_N
        self.c = torch.empty_like(self.a)

    def run(self, units: int) -> None:
        for _ in range(units):
            torch.mm(self.a, self.a, out=self.c)


def _median(xs):
    xs = sorted(xs)
    return (xs[(len(xs) - 1) // 2] + xs[len(xs) // 2]) / 2


def _timed(backend, fn) -> float:
    t0 = time.perf_counter()
    fn()
    backend.synchronize()
    return time.perf_counter() - t0


def run_overlap(backend, info, plan, cfg, device: str, watchdog) -> dict:
    import torch.distributed as dist
    if not dist.is_available() or not dist.is_initialized():
        raise UsageError("--overlap needs a torch.distributed backend (gloo or nccl) for "
                         "asynchronous collectives; drop --overlap or choose --backend gloo")
    rank, world = info.rank, info.world_size
    dt = DTYPES[cfg.dtype]
    state = StepState(plan, dt, device, rank, 1, cfg.optimizer)
    divisor = grad_divisor(world, cfg.optimizer)
    state.fill(rank, divisor)
    compute = Compute(device)
    grads, opt = state.grads, cfg.optimizer

    def update(i):
        if opt:
            state.weights[i].add_(grads[i], alpha=-LR)

    # Calibrate: each bucket's all_reduce time (slowest rank), and one compute unit's time.
    watchdog.step("calibrating --overlap")
    per_bucket = []
    for g in grads:
        backend.all_reduce(g, g, "sum")
        per_bucket.append(_median([_timed(backend, lambda: backend.all_reduce(g, g, "sum"))
                                   for _ in range(CALIBRATE_REPS)]))
    compute.run(10)
    unit = _median([_timed(backend, lambda: compute.run(10)) / 10 for _ in range(CALIBRATE_REPS)])
    rows = backend.allgather_floats([unit, *per_bucket])
    unit = max(r[0] for r in rows)
    units = [max(1, round(max(r[1 + i] for r in rows) / unit)) for i in range(len(grads))]

    def comm_only():
        for i, g in enumerate(grads):
            backend.all_reduce(g, g, "sum")
            update(i)

    def compute_only():
        for u in units:
            compute.run(u)

    def serial():
        for i, g in enumerate(grads):
            compute.run(units[i])
            backend.all_reduce(g, g, "sum")
            update(i)

    def overlapped():
        works = []
        for i, g in enumerate(grads):
            compute.run(units[i])
            works.append(dist.all_reduce(g, async_op=True))
        for i, w in enumerate(works):
            w.wait()
            update(i)

    # A unit measured alone runs slower or faster among busy ranks: rescale until the whole
    # computation takes as long as the whole communication (the slowest rank's of each).
    for _ in range(CALIBRATE_ROUNDS):
        t_comm = _median([_timed(backend, comm_only) for _ in range(3)])
        t_comp = _median([_timed(backend, compute_only) for _ in range(3)])
        rows = backend.allgather_floats([t_comm, t_comp])
        ratio = max(r[0] for r in rows) / max(max(r[1] for r in rows), 1e-9)
        units = [max(1, round(u * ratio)) for u in units]

    variants = {"comm": comm_only, "compute": compute_only, "serial": serial, "overlapped": overlapped}
    times = {k: [] for k in variants}
    for k, fn in variants.items():
        for _ in range(cfg.warmup_iters):
            fn()
        backend.synchronize()
        backend.barrier()
        for i in range(cfg.iters):
            watchdog.step(f"timing --overlap {k} (step {i + 1} of {cfg.iters})")
            times[k].append(_timed(backend, fn))
    watchdog.step("checking --overlap")
    state.fill(rank, divisor)
    backend.barrier()
    overlapped()
    backend.synchronize()
    results = state.results()
    meter = check_slice(results, plan, rank, world, lambda s, c: reference(
        range(world), s, c, dt, divisor, opt))
    flat = [t for k in variants for t in times[k]]
    out, rows = finish(backend, rank, world, [], meter, results, extra=flat)
    n = cfg.iters
    summ = {k: summarize([r[j * n:(j + 1) * n] for r in rows]) for j, k in enumerate(variants)}
    out.update(summ["overlapped"])
    comm = summ["comm"]["time_us"]
    out.update(strategy="allreduce+overlap", servers=0, calls_per_step=len(grads),
               comm_us=comm, compute_us=summ["compute"]["time_us"],
               serial_us=summ["serial"]["time_us"], compute_units=sum(units),
               unit_us=unit * 1e6,
               hidden_pct=100 * (summ["serial"]["time_us"] - summ["overlapped"]["time_us"]) / comm
               if comm > 0 else 0.0)
    return out
