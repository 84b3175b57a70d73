"""One rank's run of `wirespeed model`: for each strategy, warm up, time the steps, check the result.

Timing follows the bench harness (docs/metrics.md): every step is timed on every rank with a host
clock closed by a device sync, a step's time is the slowest rank's, and the reported time is the
median over steps. Checking runs after the timed steps on freshly filled gradients: each rank
compares 1/world of the result with the exact reference (data.reference) and hashes its whole
result; equal hashes on every rank extend the check to every rank's copy.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from ..bench.dtypes import DTYPES
from ..bench.harness import summarize
from ..bench.verifiable import CHUNK_ELEMS
from ..errors import UsageError
from .bucketing import BucketPlan, plan_buckets
from .data import ErrorMeter, digest, grad_divisor, reference
from .models import ModelShapes
from .strategies import SYNC_STRATEGIES, StepState

STRATEGIES = ("allreduce", "reduce-broadcast", "sharded-ps", "async-ps")


@dataclass
class ModelConfig:
    strategies: list[str] = field(default_factory=lambda: ["allreduce"])
    bucket_mode: str = "ddp"
    bucket_bytes: int = 25 << 20
    bucket_label: str = "25"
    servers: int | None = None       # None: world size for sharded-ps, 1 for async-ps
    optimizer: bool = False
    overlap: bool = False
    dtype: str = "float32"
    backend: str = "gloo"
    device: str = "cpu"
    nproc: int = 2
    warmup_iters: int = 2
    iters: int = 10
    timeout_s: float = 300.0
    json_path: str | None = None


def parse_strategies(text: str) -> list[str]:
    names = list(STRATEGIES) if text.strip() == "all" else [t.strip() for t in text.split(",") if t.strip()]
    for n in names:
        if n not in STRATEGIES:
            raise UsageError(f"unknown strategy {n!r}: choose from {', '.join(STRATEGIES)} or all")
    if not names:
        raise UsageError("no strategy given: use e.g. --strategy allreduce or --strategy all")
    return names


def servers_for(strategy: str, cfg: ModelConfig, world: int) -> int:
    if strategy == "async-ps":
        s = cfg.servers if cfg.servers is not None else 1
        if not 1 <= s < world:
            raise UsageError(f"async-ps needs at least one server and one worker: --servers {s} "
                             f"with {world} ranks (use -N {s + 1} or more, or fewer --servers)")
        return s
    if strategy == "sharded-ps":
        s = cfg.servers if cfg.servers is not None else world
        if not 1 <= s <= world:
            raise UsageError(f"--servers {s} is not between 1 and the {world} ranks")
        return s
    return 0


def validate(cfg: ModelConfig, world: int) -> None:
    """Refuse, before any rank starts, what cannot run (each rank calls it too, for outer launchers)."""
    for s in cfg.strategies:
        servers_for(s, cfg, world)
    if "async-ps" in cfg.strategies and (cfg.backend != "gloo" or cfg.device != "cpu"):
        raise UsageError("async-ps runs on --backend gloo --device cpu only (it needs receives from "
                         "any source); leave it out of --strategy for other backends")
    if cfg.overlap and "allreduce" not in cfg.strategies:
        raise UsageError("--overlap times DDP's pattern: it needs --strategy allreduce")


def plan_for(shapes: ModelShapes, cfg: ModelConfig) -> BucketPlan:
    return plan_buckets([p.numel for p in shapes.params], DTYPES[cfg.dtype].itemsize,
                        cfg.bucket_mode, cfg.bucket_bytes)


def rank_bytes(shapes: ModelShapes, cfg: ModelConfig) -> int:
    """Peak bytes of one rank: gradients, weights with sgd, a shard buffer, the checker's temporaries."""
    n = shapes.numel + 64 * len(shapes.params) * cfg.nproc  # padding is at most world per bucket
    per = DTYPES[cfg.dtype].itemsize * n
    return per * (2 if cfg.optimizer else 1) + per // max(cfg.nproc, 1) + 6 * 8 * CHUNK_ELEMS


def _check_slice(results, plan: BucketPlan, rank: int, world: int, expected) -> ErrorMeter:
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
    meter = _check_slice(results, plan, rank, world, lambda s, c: reference(
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
            from .async_ps import run_async
            out.append(run_async(backend, info, plan, cfg, device, watchdog))
        else:
            out.append(run_sync(name, backend, info, shapes, plan, cfg, device, watchdog))
        if cfg.overlap and name == "allreduce":
            from .overlap import run_overlap
            out.append(run_overlap(backend, info, plan, cfg, device, watchdog))
    watchdog.step("finishing")
    backend.barrier()
    return out
