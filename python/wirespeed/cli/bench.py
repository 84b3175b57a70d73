"""`wirespeed bench`: the collective benchmark (nccl-tests' flags, any torch.distributed backend).

Run by hand it spawns -N local ranks; under torchrun, srun or mpirun it is one rank of that job.
"""
from __future__ import annotations

import os
from functools import partial

from ..bench.config import BenchConfig
from ..bench.dtypes import parse_dtypes, parse_ops
from ..bench.fastnet import enable_fast_net
from ..bench.run import before_start, run_as_rank, validate_for_world
from ..errors import UsageError
from . import flags
from .rankjob import (Job, check_local_gpus, default_nproc, parse_iters_timeout, parse_num,
                      resolve_backend, run_job)
from .common import add


# The names for --help, without importing torch (which every collective module needs) at start-up;
# tests/unit/test_metrics.py checks they match the registry in bench/collectives.
COLLECTIVE_NAMES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all",
                    "send_recv", "barrier")


def register(sub) -> None:
    p = sub.add_parser("bench", help="time collectives over a size sweep, checked, as nccl-tests does",
                       description="Time collectives over a sweep of sizes on local ranks (or as one "
                       "rank under torchrun/srun/mpirun), check every result, print nccl-tests' table.")
    add(p, "-c", "--collective", default="all_reduce",
        help=f"comma list of {', '.join(COLLECTIVE_NAMES)}, or all")
    add(p, "--plan", default=None, metavar="PLAN.json",
        help="time and check this MSCCL++ execution plan, executed by CPU ranks (--backend wirespeed), "
        "instead of -c")
    flags.sweep(p, minbytes="8", factor="2", stepbytes=True,
                min_help="smallest size (8, 32K, 128M, 1G; binary units)")
    add(p, "-d", "--dtype", default="float32",
        help="comma list of float32, float16, bfloat16, float64, int8, uint8, int32, int64, or all")
    add(p, "-o", "--op", default="sum", help="comma list of sum, prod, min, max, avg, or all")
    flags.ranks(p)
    flags.iterations(p, warmup="5", iters="20", unit="iterations per size")
    add(p, "-r", "--root", default="0", help="root rank of broadcast and reduce")
    add(p, "--no-check", action="store_true", help="skip checking results (the #wrong column shows N/A)")
    add(p, "-I", "--per-op-stats", action="store_true",
        help="add the p50 and p99 of single timed calls to the table (records always have them)")
    add(p, "--no-per-op", action="store_true",
        help="time only the loop, not single calls too (records then lack p50/p99/min/max)")
    add(p, "--format", default="table", choices=("table", "md"), help="nccl-tests table or markdown")
    flags.output(p, "--json", default=None, help="write JSON-lines records here")
    flags.output(p, "--csv", default=None, help="write CSV here")
    flags.output(p, "--plot", default=None, help="write a PNG plot of busbw and algbw here")
    flags.output(p, "--save-dir", what="dir", unused_with=("no_save",), default="runs",
                 help="every run also lands in SAVE_DIR/<timestamp>/")
    flags.output(p, "--trace", default=None, metavar="F.json",
                 help="write every timed call of every rank as a span here (Chrome/Perfetto JSON)")
    add(p, "--no-save", action="store_true", help="do not save the run under --save-dir")
    add(p, "--no-progress", action="store_true", help="no progress bar even on a terminal")
    flags.placement(p, rph="place ranks in blocks of this many per host (default -N = hosts x this)")
    add(p, "--fast-net", action="store_true", help="NCCL only: move inter-host traffic through the "
        "wirespeed network plugin (multi-stream TCP; `make plugin` builds it)")
    p.set_defaults(func=main)


def config_from_args(args) -> BenchConfig:
    from ..bench.collectives import parse_collectives
    colls = [c.name for c in parse_collectives(args.collective)]
    dtypes = [d.name for d in parse_dtypes(args.dtype)]
    ops = parse_ops(args.op)
    sizes = flags.sizes(args)
    if args.plan:
        colls, dtypes, ops = _plan_settings(args, dtypes, ops)
    backend, device = resolve_backend(args.backend, args.device)
    iters, timeout = parse_iters_timeout(args)
    cfg = BenchConfig(plan=args.plan, collectives=colls, dtypes=dtypes, ops=ops, sizes=sizes,
                      warmup_iters=parse_num(args.warmup_iters, "--warmup-iters"), iters=iters,
                      backend=backend, device=device, nproc=default_nproc(args.nproc, device),
                      root=parse_num(args.root, "--root"), check=not args.no_check, timeout_s=timeout,
                      per_op=not args.no_per_op, per_op_columns=args.per_op_stats and not args.no_per_op,
                      format=args.format, json_path=args.json, csv_path=args.csv,
                      plot_path=args.plot, save_dir=None if args.no_save else args.save_dir,
                      progress=not args.no_progress, host_per_rank=args.host_per_rank,
                      trace_path=args.trace)
    if cfg.plan:
        from ..bench.harness import plan_collective
        coll = plan_collective(cfg)
        if not coll.sizes(cfg.sizes):
            raise UsageError(f"{cfg.plan}: no size of the sweep lies within the plan's message sizes "
                             f"({coll.plan.min_size}..{coll.plan.max_size} bytes): choose -b/-e there")
    return cfg


def _plan_settings(args, dtypes, ops):
    """What --plan fixes: the plan's collective, float32, sum; wirespeed's CPU ranks, as many as the
    plan has (-N must agree)."""
    from ..bench.collectives.plan import BENCH_NAMES, load_plan
    plan = load_plan(args.plan)
    if args.backend is None:
        args.backend = "wirespeed"
    if args.backend != "wirespeed" or args.device == "cuda":
        raise UsageError(f"--plan runs on wirespeed's CPU ranks (--backend wirespeed, --device cpu), "
                         f"not {args.backend} on {args.device or 'cpu'}")
    if dtypes != ["float32"] or ops != ["sum"]:
        raise UsageError("--plan moves float32 data and sums it: leave -d and -o out")
    from ..flagvalues import given
    if given(args.collective) and str(args.collective) != BENCH_NAMES.get(plan.collective):
        raise UsageError(f"{args.plan}: the plan is an {plan.collective} plan, -c asks for "
                         f"{args.collective}: --plan fixes the collective, leave -c out")
    if args.nproc is None:
        args.nproc = str(plan.nranks)
    elif parse_num(args.nproc, "--nproc") != plan.nranks:
        raise UsageError(f"{args.plan}: the plan is for {plan.nranks} ranks, -N asks for {args.nproc}: "
                         f"use -N {plan.nranks}")
    return [BENCH_NAMES[plan.collective]], dtypes, ops


def main(args, argv) -> int:
    return run_job(_job, args, argv)


def _job(args) -> Job:
    cfg = config_from_args(args)
    if args.fast_net:
        enable_fast_net(cfg.backend)
    return Job(cfg.backend, cfg.device, cfg.timeout_s, launch=partial(launch_local, cfg, args),
               before_start=partial(before_start, cfg), work=partial(run_as_rank, cfg))


def launch_local(cfg: BenchConfig, args, start) -> int:
    from ..backends import create
    from ..bench.memory import check_fits
    if args.cluster:  # ranks in the emulated cluster's namespaces (wirespeed.launch.cluster)
        from ..launch.cluster import cluster_nproc
        cfg.nproc = cluster_nproc(args.cluster, args.ranks_per_host, args.nproc, cfg.nproc)
    from ..bench.harness import check_something_runs
    adapter = create(cfg.backend, cfg.device)  # fail here, once, if the backend cannot run
    check_something_runs(cfg, adapter, cfg.nproc, cfg.device)
    validate_for_world(cfg, cfg.nproc)
    if cfg.plan:
        _check_plan_placement(cfg, args)
        _check_plan_fits(cfg)
        from ..bench.collectives.plan import warn_if_racy
        from ..bench.harness import plan_collective
        warn_if_racy(plan_collective(cfg))
    check_local_gpus(cfg.nproc, cfg.backend, _ranks_on_one_host(cfg, args.cluster, args.ranks_per_host))
    check_fits(cfg.collectives, cfg.dtypes, cfg.sizes, cfg.nproc, cfg.nproc, cfg.device)
    return start(cfg.nproc)


def _check_plan_placement(cfg: BenchConfig, args) -> None:
    """Where the ranks' hosts are known before they start (--cluster, --host-per-rank), a memory or
    switch channel between hosts is refused here, once, rather than by every rank."""
    from ..bench.harness import plan_collective
    from ..plans.execute import cross_host_channel
    if cfg.host_per_rank:
        hosts = [str(r) for r in range(cfg.nproc)]
    elif args.cluster:
        from ..launch.cluster import placement
        from ..netem import cluster as C
        n_hosts = len(C.require(C.check_name(args.cluster)).hosts)
        hosts = [str(h) for h in placement(cfg.nproc, n_hosts, args.ranks_per_host)]
    else:
        return
    bad = cross_host_channel(plan_collective(cfg).plan, hosts)
    if bad:
        raise UsageError(bad)


def _check_plan_fits(cfg: BenchConfig, free: int | None = None) -> None:
    """The plan's arenas (input, output and scratch of every rank, scratch often several times the
    message) must fit /dev/shm and memory at the sweep's largest size, or the sweep is refused
    here, naming the largest size that fits, rather than failing at that size."""
    from ..bench.harness import plan_collective
    from ..launch.memory import buffer_budget
    from ..plans.execute import SHM_DIR
    from ..plans.layout import WORD, Layout
    from ..sizes import format_size
    coll = plan_collective(cfg)
    sizes = sorted(coll.sizes(cfg.sizes))
    if free is None:
        st = os.statvfs(SHM_DIR)
        free = min(st.f_bavail * st.f_frsize, buffer_budget("cpu", cfg.nproc)[1])

    def need(size: int) -> int:
        return sum(Layout(coll.plan, size).arena) * WORD

    if not sizes or need(sizes[-1]) <= free:
        return
    fits = [s for s in sizes if need(s) <= free]
    hint = (f"the largest size that fits is {format_size(fits[-1])}: use -e {format_size(fits[-1])}"
            if fits else "use smaller sizes")
    raise UsageError(f"{cfg.plan}: at {format_size(sizes[-1])} the plan's arenas need {need(sizes[-1]) / (1 << 30):.1f} GiB "
                     f"of shared memory, {max(free, 0) / (1 << 30):.1f} GiB is free ({SHM_DIR}, memory); {hint}")


def _ranks_on_one_host(cfg: BenchConfig, cluster, ranks_per_host) -> int:
    from ..launch.gpus import most_ranks_on_one_host
    hosts = None
    if cluster:
        from ..netem import cluster as C
        hosts = len(C.require(C.check_name(cluster)).hosts)
    return most_ranks_on_one_host(cfg.nproc, hosts, ranks_per_host, cfg.host_per_rank)


