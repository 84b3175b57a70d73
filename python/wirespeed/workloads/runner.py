"""One rank's run of `wirespeed model`: for each strategy, warm up, time the steps, check the result.

Timing follows the bench harness (docs/metrics.md): every step is timed on every rank with a host
clock closed by a device sync, a step's time is the slowest rank's, and the reported time is the
median over steps. Checking runs after the timed steps on freshly filled gradients: each rank
compares 1/world of the result with the exact reference (data.reference) and hashes its whole
result; equal hashes on every rank extend the check to every rank's copy.
"""
from __future__ import annotations

import sys
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
from ..report.records import record


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


# `wirespeed model`'s rank, its backend started (cli/model.py parses the flags, resolves the shapes
# and starts the ranks): the header, every strategy through run_rank, and on rank 0 the table and
# records.


def run_as_rank(cfg, info, backend, device, shapes) -> int:
    from ..bench.watchdog import guarded_rank
    from ..envinfo import record_env
    lead = info.rank == 0
    plan = plan_for(shapes, cfg)
    if lead:
        _print_header(cfg, info, shapes, plan)
    with guarded_rank(info.rank, cfg.timeout_s) as watchdog:
        results = run_rank(cfg, info, backend, device, shapes, watchdog)
    bad = [r for r in results if not within_rounding(r["error"], cfg.dtype)]
    if lead:
        records = _records(cfg, info, shapes, plan, results, record_env())
        print(_table(records))
        if cfg.json_path:
            from ..report.records import write_jsonl
            write_jsonl(cfg.json_path, records)
        if bad:
            sys.stderr.write(f"wirespeed: error: {', '.join(r['strategy'] for r in bad)}: the result "
                             "differs from the reference beyond the dtype's rounding\n")
        sys.stdout.flush()
    return 1 if bad else 0


def within_rounding(error: float, dtype: str) -> bool:
    """Exact data give 0; where a dtype is too narrow for them, a few units of its rounding."""
    import torch
    return error == 0 or error <= 8 * torch.finfo(DTYPES[dtype].torch).eps


def _print_header(cfg, info, shapes, plan) -> None:
    itemsize = DTYPES[cfg.dtype].itemsize
    total = shapes.numel * itemsize
    print(f"# wirespeed model: {shapes.name} ({shapes.source}), {len(shapes.params)} arrays, "
          f"{shapes.numel:,} parameters = {total / (1 << 20):.1f} MiB of {cfg.dtype} gradients")
    print(f"# backend {cfg.backend}, device {cfg.device}, {info.world_size} ranks; "
          f"{plan.describe(itemsize)}; optimizer {'sgd' if cfg.optimizer else 'none'}")
    print(f"# {cfg.iters} timed steps after {cfg.warmup_iters} warm-up; time = median over steps of the "
          "slowest rank; GB/s per rank = gradient bytes / time (1e9 B/s); busbw = GB/s x 2(n-1)/n; "
          "error = relative L1 against the exact reference")
    sys.stdout.flush()


def _records(cfg, info, shapes, plan, results, env) -> list[dict]:
    n = info.world_size
    total = shapes.numel * DTYPES[cfg.dtype].itemsize
    run_id = time.strftime("%Y%m%d-%H%M%S")
    out = []
    for r in results:
        t = r.get("time_us", 0.0)
        gbps = total / (t * 1e-6) / 1e9 if t > 0 else 0.0
        rec = record("model", {"run_id": run_id, "model": shapes.name,
               "source": shapes.source, "arrays": len(shapes.params), "total_bytes": total,
               "strategy": r["strategy"], "world_size": n, "time_us": t, "gbps_per_rank": gbps,
               "busbw_gbps": gbps * 2 * (n - 1) / n if n > 1 else 0.0, "error": r["error"],
               "backend": cfg.backend, "device": cfg.device, "dtype": cfg.dtype,
               "bucket_mb": cfg.bucket_label, "bucket_mode": plan.mode, "buckets": len(plan.buckets),
               "optimizer": "sgd" if cfg.optimizer else "none", "iters": cfg.iters,
               "warmup_iters": cfg.warmup_iters})
        rec.update({k: v for k, v in r.items() if k not in rec and k != "strategy"})
        rec["env"] = env
        out.append(rec)
    return out


def _table(records) -> str:
    head = (f"{'strategy':<20} {'servers':>7} {'calls/step':>10} {'time/step(ms)':>14} "
            f"{'min(ms)':>9} {'max(ms)':>9} {'GB/s/rank':>10} {'busbw':>8} {'error':>9}  notes")
    lines = [head]
    for r in records:
        notes = []
        if "staleness_mean" in r:
            notes.append(f"staleness mean {r['staleness_mean']:.2f} max {r['staleness_max']:.0f} "
                         f"over {r['pushes']} pushes")
        if "hidden_pct" in r:
            notes.append(f"compute {r['compute_us'] / 1e3:.1f} ms, comm {r['comm_us'] / 1e3:.1f} ms, "
                         f"serial {r['serial_us'] / 1e3:.1f} ms: {r['hidden_pct']:.0f}% of the "
                         "comm hidden")
        if not r.get("ranks_agree", True):
            notes.append("RANKS DISAGREE")
        lines.append(f"{r['strategy']:<20} {r.get('servers') or '-':>7} {r.get('calls_per_step', 0):>10} "
                     f"{r['time_us'] / 1e3:>14.3f} {r.get('time_min_us', 0) / 1e3:>9.3f} "
                     f"{r.get('time_max_us', 0) / 1e3:>9.3f} {r['gbps_per_rank']:>10.3f} "
                     f"{r['busbw_gbps']:>8.3f} {r['error']:>9.2g}  {'; '.join(notes)}")
    return "\n".join(lines)
