"""`wirespeed model`: the gradients of a real network's training step, bucketed as DDP does, synchronised
by each aggregation strategy, timed and checked (what MXNet's tools/bandwidth measured, and more).

Run by hand it spawns -N local ranks; under torchrun, srun or mpirun it is one rank of that job.
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
from functools import partial

from ..errors import UsageError
from . import flags
from .rankjob import (Job, check_local_start, default_nproc, parse_iters_timeout,
                      parse_num, resolve_backend, run_job, uses_torch_distributed)
from .common import add


def register(sub) -> None:
    from ..workloads.models import CATALOGUE
    from ..workloads.config import STRATEGIES
    p = sub.add_parser("model", help="time one training step's gradient sync of a real network",
                       description="Synchronise the gradients of a real network (shapes only, nothing "
                       "downloaded) with each strategy, bucketed as DDP does; time and check every step.")
    add(p, "--model", default=None, help=f"one of {', '.join(CATALOGUE)}")
    add(p, "--shapes", default=None, help="a file of shapes instead of --model (JSON, or one "
        "`[name:] 64x3x7x7` per line, first layer first)")
    add(p, "--list", action="store_true", help="list the models with their arrays and parameters")
    add(p, "--strategy", default="allreduce", help=f"comma list of {', '.join(STRATEGIES)}, or all")
    add(p, "--bucket-mb", default="25", help="DDP bucket size in MiB (first bucket 1 MiB); 0 = one "
        "call per tensor; flat = everything in one buffer")
    add(p, "--servers", default=None, help="server ranks of sharded-ps (default: every rank) and "
        "async-ps (default: 1; the other ranks are workers)")
    add(p, "--optimizer", default="none", choices=("none", "sgd"), help="sgd: the owner applies "
        "w -= lr*g (lr = 2^-6) before the pull; the result checked is then the weights")
    add(p, "--overlap", action="store_true", help="also time allreduce with each bucket launched "
        "asynchronously while a matching amount of computation runs (torch.distributed backends)")
    add(p, "-d", "--dtype", default="float32", help="float32, float16, bfloat16, float64, ...")
    flags.ranks(p, holds="the gradients")
    flags.iterations(p, warmup="2", iters="10", unit="steps per strategy")
    flags.output(p, "--json", unused_with=("list",), default=None,
                 help="write one JSON-lines record per strategy here")
    flags.placement(p, host_per_rank=False)
    # The launcher resolves the shapes once and hands them to its ranks (no model build per rank).
    p.add_argument("--resolved-shapes", default=None, help=argparse.SUPPRESS)
    p.set_defaults(func=main)


def config_from_args(args):
    from ..bench.dtypes import parse_dtypes
    from ..workloads.bucketing import parse_bucket_mb
    from ..workloads.config import ModelConfig, parse_strategies
    dtypes = parse_dtypes(args.dtype)
    if len(dtypes) != 1 or not dtypes[0].is_float:
        raise UsageError("--dtype takes one floating-point type for gradients: float32, float16, "
                         "bfloat16 or float64")
    mode, nbytes = parse_bucket_mb(args.bucket_mb)
    backend, device = resolve_backend(args.backend, args.device)
    iters, timeout = parse_iters_timeout(args)
    servers = parse_num(args.servers, "--servers") if args.servers is not None else None
    if servers == 0:
        raise UsageError("--servers must be at least 1")
    return ModelConfig(strategies=parse_strategies(args.strategy), bucket_mode=mode,
                       bucket_bytes=nbytes, bucket_label=str(args.bucket_mb).strip(),
                       servers=servers, optimizer=args.optimizer == "sgd", overlap=args.overlap,
                       dtype=dtypes[0].name, backend=backend, device=device,
                       nproc=default_nproc(args.nproc, device),
                       warmup_iters=parse_num(args.warmup_iters, "--warmup-iters"), iters=iters,
                       timeout_s=timeout, json_path=args.json)


def resolve_shapes(args):
    from ..workloads.models import ModelShapes, model_shapes, read_shapes
    if args.resolved_shapes:
        with open(args.resolved_shapes) as f:
            return ModelShapes.from_json(json.load(f))
    if args.model and args.shapes:
        raise UsageError("give --model or --shapes, not both")
    if args.shapes:
        return read_shapes(args.shapes)
    if not args.model:
        raise UsageError("which network? give --model NAME (see `wirespeed model --list`) or --shapes FILE")
    return model_shapes(args.model)


def list_models() -> int:
    from ..workloads.models import CATALOGUE, model_shapes
    print(f"{'model':<16} {'library':<13} {'arrays':>7} {'parameters':>15} {'fp32 size':>10}")
    for name, (source, _) in CATALOGUE.items():
        try:
            m = model_shapes(name)
        except UsageError as e:
            print(f"{name:<16} {source:<13} unavailable: {e}")
            continue
        print(f"{name:<16} {source:<13} {len(m.params):>7} {m.numel:>15,} "
              f"{m.numel * 4 / (1 << 20):>8.1f}Mi")
    return 0


def main(args, argv) -> int:
    if args.list:
        return list_models()
    return run_job(_job, args, argv)


def _job(args) -> Job:
    cfg = config_from_args(args)
    return Job(cfg.backend, cfg.device, cfg.timeout_s, launch=partial(launch_local, cfg, args),
               before_start=partial(_before_start, cfg, args), work=partial(_run_as_rank, cfg))


def _check_memory(shapes, cfg, ranks_here: int) -> None:
    from ..launch.memory import buffer_budget
    from ..workloads.runner import rank_bytes
    sharers, budget = buffer_budget(cfg.device, ranks_here)
    need = rank_bytes(shapes, cfg) * sharers
    if need > budget:
        raise UsageError(f"{shapes.name} in {cfg.dtype} needs {need / (1 << 30):.1f} GiB for "
                         f"{sharers} rank(s) but {max(budget, 0) / (1 << 30):.1f} GiB is available: "
                         "use fewer ranks (-N), a smaller --dtype, or a smaller model")


def launch_local(cfg, args, start) -> int:
    from ..workloads.config import validate
    adapter = check_local_start(cfg.nproc, cfg.backend, cfg.device)
    validate(cfg, cfg.nproc)
    if cfg.overlap and not uses_torch_distributed(adapter):
        raise UsageError(f"--overlap needs asynchronous collectives (torch.distributed's async_op), "
                         f"which --backend {cfg.backend} lacks: use gloo, nccl or wirespeed")
    shapes = resolve_shapes(args)
    _check_memory(shapes, cfg, cfg.nproc)
    fd, path = tempfile.mkstemp(prefix="wirespeed-shapes-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(shapes.to_json(), f)
        return start(cfg.nproc, ["--resolved-shapes", path])
    finally:
        os.unlink(path)


def _before_start(cfg, args, info) -> tuple:
    from ..workloads.config import validate
    shapes = resolve_shapes(args)
    validate(cfg, info.world_size)
    from ..launch.environment import spawned_here
    if not spawned_here():
        _check_memory(shapes, cfg, info.local_world_size)
    return (shapes,)


def _run_as_rank(cfg, info, backend, device, shapes) -> int:
    from ..workloads.runner import run_as_rank   # imports torch: in the ranks only
    return run_as_rank(cfg, info, backend, device, shapes)
