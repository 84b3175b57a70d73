"""One rank's run of `wirespeed model`: for each strategy, warm up, time the steps, check the result.

Timing follows the bench harness (docs/metrics.md): every step is timed on every rank with a host
clock closed by a device sync, a step's time is the slowest rank's, and the reported time is the
median over steps. Checking runs after the timed steps on freshly filled gradients: each rank
compares 1/world of the result with the exact reference (data.reference) and hashes its whole
result; equal hashes on every rank extend the check to every rank's copy.
"""
from __future__ import annotations

import time

from ..bench.dtypes import DTYPES
from ..bench.verifiable import CHUNK_ELEMS
from .async_ps import run_async
from .bucketing import BucketPlan, plan_buckets
from .check import check_slice, finish
from .config import ModelConfig, servers_for
from .data import grad_divisor, reference
from .models import ModelShapes
from .overlap import run_overlap
from .strategies import SYNC_STRATEGIES, StepState


def plan_for(shapes: ModelShapes, cfg: ModelConfig) -> BucketPlan:
    return plan_buckets([p.numel for p in shapes.params], DTYPES[cfg.dtype].itemsize,
                        cfg.bucket_mode, cfg.bucket_bytes)


def rank_bytes(shapes: ModelShapes, cfg: ModelConfig) -> int:
    """Peak bytes of one rank: gradients, weights with sgd, a shard buffer, the checker's temporaries."""
    n = shapes.numel + 64 * len(shapes.params) * cfg.nproc  # padding is at most world per bucket
    per = DTYPES[cfg.dtype].itemsize * n
    return per * (2 if cfg.optimizer else 1) + per // max(cfg.nproc, 1) + 6 * 8 * CHUNK_ELEMS


def run_sync(name: str, backend, info, shapes: ModelShapes, plan: BucketPlan, cfg: ModelConfig,
             device: str, watchdog) -> dict:
    rank, world = info.rank, info.world_size
    dt = DTYPES[cfg.dtype]
    cls = SYNC_STRATEGIES[name]
    servers = servers_for(name, cfg, world)
    state = StepState(plan, dt, device, rank, cls.pad(world, servers), cfg.optimizer)
    strat = cls(backend, state, rank, world, servers)
    divisor = grad_divisor(world, cfg.optimizer)
    state.fill(rank, divisor)
    watchdog.step(f"warming up {name}")
    for _ in range(cfg.warmup_iters):
        strat.step()
    backend.synchronize()
    backend.barrier()
    times = []
    for i in range(cfg.iters):
        watchdog.step(f"timing {name} (step {i + 1} of {cfg.iters})")
        t0 = time.perf_counter()
        strat.step()
        backend.synchronize()
        times.append(time.perf_counter() - t0)
    watchdog.step(f"checking {name}")
    state.fill(rank, divisor)
    backend.barrier()  # no rank may receive into a buffer a peer is still refilling
    strat.step()
    backend.synchronize()
    results = state.results()
    meter = check_slice(results, plan, rank, world, lambda s, c: reference(
        range(world), s, c, dt, divisor, cfg.optimizer))
    watchdog.step(f"gathering results of {name}")
    out, _ = finish(backend, rank, world, times, meter, results)
    out.update(strategy=name, servers=servers, calls_per_step=strat.calls_per_step())
    return out


def run_rank(cfg: ModelConfig, info, backend, device: str, shapes: ModelShapes, watchdog) -> list[dict]:
    """Every strategy on this rank; returns the same summaries on every rank."""
    plan = plan_for(shapes, cfg)
    out = []
    for name in cfg.strategies:
        if name == "async-ps":
            out.append(run_async(backend, info, plan, cfg, device, watchdog))
        else:
            out.append(run_sync(name, backend, info, shapes, plan, cfg, device, watchdog))
        if cfg.overlap and name == "allreduce":
            out.append(run_overlap(backend, info, plan, cfg, device, watchdog))
    watchdog.step("finishing")
    backend.barrier()
    return out
