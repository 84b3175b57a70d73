"""`wirespeed bench`: the collective benchmark (nccl-tests' flags, any torch.distributed backend).

Run by hand it spawns -N local ranks; under torchrun, srun or mpirun it is one rank of that job.
"""
from __future__ import annotations

import os
import sys
import time
from functools import partial

from ..bench.config import BenchConfig
from ..bench.dtypes import parse_dtypes, parse_ops
from ..errors import UsageError
from ..sizes import sizes_from_flags
from . import flags
from .rankjob import (Job, check_local_gpus, default_nproc, parse_iters_timeout, parse_num,
                      rank_error, resolve_backend, run_job)
from .common import add
from ..report.records import record


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
    add(p, "-b", "--minbytes", default="8", help="smallest size (8, 32K, 128M, 1G; binary units)")
    add(p, "-e", "--maxbytes", default="64M", help="largest size")
    add(p, "-f", "--stepfactor", default="2", help="multiply the size by this each step")
    add(p, "-i", "--stepbytes", default=None, help="add this many bytes each step instead of -f")
    add(p, "--sizes", default=None, help="explicit comma list of sizes instead of -b/-e/-f")
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
    sizes = sizes_from_flags(args.sizes, args.minbytes, args.maxbytes, args.stepfactor, args.stepbytes)
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
                      progress=not args.no_progress, host_per_rank=args.host_per_rank)
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
        _enable_fast_net(cfg.backend)
    return Job(cfg.backend, cfg.device, cfg.timeout_s, launch=partial(launch_local, cfg, args),
               before_start=partial(_before_start, cfg), work=partial(run_as_rank, cfg))


def _enable_fast_net(backend: str) -> None:
    """Point NCCL at the wirespeed network plugin for this process and the ranks it starts (they
    inherit the environment); a rank started by another launcher only needs the absolute path."""
    if backend != "nccl":
        raise UsageError(f"--fast-net makes NCCL use the wirespeed network plugin; this run uses "
                         f"{backend}: add --backend nccl (GPU tensors)")
    from ..netplugin import fast_net_env
    env = fast_net_env()
    if os.environ.get("NCCL_NET_PLUGIN") == env["NCCL_NET_PLUGIN"]:
        env.pop("LD_LIBRARY_PATH")  # set already by the launching process
    os.environ.update(env)
    # NCCL falls back to its sockets without a word when a plugin does not load: have it log
    # which network it took, to a file per process, which each rank reads after the run.
    from ..nccl_log import LOG_DIR_VAR, debug_env
    os.environ.update(debug_env(os.environ))
    if os.environ.get(LOG_DIR_VAR):
        # NCCL writes to stdout instead where the folder is missing; ranks on other machines make
        # it again before their backend starts (_before_start).
        os.makedirs(os.environ[LOG_DIR_VAR], exist_ok=True)


def _fast_net_unproven(backend, info) -> bool:
    """With --fast-net, whether NCCL's own logs fail to show that the plugin carried the traffic
    (docs/plugin.md): every rank's NCCL must have taken network wirespeed, and the job's
    connections between hosts gone through it. Every rank must call it (one allgather); each
    rank names its own problem, rank 0 the job's."""
    from ..nccl_log import LOG_DIR_VAR, NET_NAME, own_log_findings
    log_dir = os.environ.get(LOG_DIR_VAR)
    if not log_dir or os.environ.get("NCCL_NET") != NET_NAME or info.world_size < 2:
        return False   # not --fast-net, or one rank alone (train's scaling run): nothing to carry
    problem, conns = own_log_findings(log_dir)
    rows = backend.allgather_floats([1.0 if problem else 0.0, float(conns)])
    bad = [r for r, row in enumerate(rows) if row[0]]
    total = int(sum(row[1] for row in rows))
    if problem:
        sys.stderr.write(f"wirespeed: error: --fast-net: rank {info.rank}: {problem}\n")
    if info.rank == 0:
        if bad:
            sys.stderr.write(f"wirespeed: error: --fast-net: NCCL did not use the wirespeed plugin "
                             f"in rank{'s' if len(bad) > 1 else ''} {','.join(map(str, bad))}: "
                             "the numbers above are not the plugin's\n")
        elif total == 0:
            sys.stderr.write("wirespeed: error: --fast-net: NCCL loaded the wirespeed plugin but no "
                             f"connection went through it (no 'via NET/{NET_NAME}' in its logs, "
                             f"{log_dir}): the ranks shared a host, so NCCL used shared memory or "
                             "P2P; put them on different hosts (--cluster, --host-per-rank)\n")
        else:
            print(f"# NCCL's logs ({log_dir}): every rank took network {NET_NAME}; {total} "
                  f"connection setups via NET/{NET_NAME}")
    return bool(bad) or total == 0


def _validate_for_world(cfg: BenchConfig, world: int) -> None:
    if cfg.plan:
        from ..bench.harness import plan_collective
        plan = plan_collective(cfg).plan
        if plan.nranks != world:
            raise UsageError(f"{cfg.plan}: the plan is for {plan.nranks} ranks, the job has {world}")
    if cfg.root >= world:
        raise UsageError(f"--root {cfg.root} is not a rank of a {world}-rank job (ranks 0..{world - 1})")


def launch_local(cfg: BenchConfig, args, start) -> int:
    from ..backends import create
    from ..bench.memory import check_fits
    if args.cluster:  # ranks in the emulated cluster's namespaces (wirespeed.launch.cluster)
        from ..launch.cluster import cluster_nproc
        cfg.nproc = cluster_nproc(args.cluster, args.ranks_per_host, args.nproc, cfg.nproc)
    from ..bench.harness import check_something_runs
    adapter = create(cfg.backend, cfg.device)  # fail here, once, if the backend cannot run
    check_something_runs(cfg, adapter, cfg.nproc, cfg.device)
    _validate_for_world(cfg, cfg.nproc)
    if cfg.plan:
        _check_plan_placement(cfg, args)
        _check_plan_fits(cfg)
        from ..bench.collectives.plan import warn_if_racy
        warn_if_racy(cfg)
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


def _gpu_sharing(backend, device: str, cfg: BenchConfig) -> list[str]:
    """Header lines when ranks share a GPU (launch/gpus.py); every rank must call it."""
    from ..launch.gpus import gpu_id, host_id, mps_running, sharing_lines
    hosts, gpus = backend.allgather_text(host_id()), backend.allgather_text(gpu_id(device))
    return sharing_lines(hosts, gpus, cfg.backend, mps_running())


def _before_start(cfg: BenchConfig, info) -> None:
    from ..bench.memory import check_fits
    _validate_for_world(cfg, info.world_size)
    if os.environ.get("_WIRESPEED_LOCAL_SPAWN") != "1":
        # Under an outer launcher nobody checked memory yet; each host's ranks check their share.
        check_fits(cfg.collectives, cfg.dtypes, cfg.sizes, info.world_size, info.local_world_size,
                   cfg.device)
    if cfg.host_per_rank:
        from ..launch.gpus import set_host_per_rank
        set_host_per_rank(info.rank)  # before the backend starts: libraries read it at init
    from ..nccl_log import LOG_DIR_VAR
    if cfg.backend == "nccl" and os.environ.get(LOG_DIR_VAR):
        # Here too: a rank on another machine (ssh, srun) has no folder the launcher made.
        os.makedirs(os.environ[LOG_DIR_VAR], exist_ok=True)


def run_as_rank(cfg: BenchConfig, info, backend, device) -> int:
    """One rank of the job, its backend started: run every case, and on rank 0 report."""
    from ..bench.harness import run_rank, steps
    from ..envinfo import record_env
    from ..report.progress import Progress

    lead = info.rank == 0
    records = []
    env = record_env() if lead else {}
    from ..launch.cluster import host_link_sent_bytes, link_fields
    link = link_fields()  # link_rate_gbps etc. when the ranks run on the emulated cluster
    run_id = time.strftime("%Y%m%d-%H%M%S")
    progress = Progress(sum(1 for _ in steps(cfg)), enabled=lead and cfg.progress)
    try:
        env["hosts"] = backend.host_names()
        from ..bench.agreement import check_same_settings
        check_same_settings(backend, cfg, info.rank)  # else a rank would meet the wrong collective
        shared = _gpu_sharing(backend, device, cfg) if cfg.device == "cuda" else []
        if lead:
            _print_header(cfg, info, env, shared)

        def keep(m):
            if lead:
                records.append(record("bench", {"run_id": run_id, "backend": cfg.backend,
                                "device": cfg.device, "world_size": info.world_size, **m, **link, "env": env}))
        total_wrong = run_rank(cfg, info, backend, device, keep, progress.advance,
                               host_link_sent_bytes())
    except Exception as e:   # wirespeed's own errors pass as they are; a library's (the transport's too) names its rank
        progress.close()
        raise rank_error(info.rank, e) from None
    finally:
        progress.close()
    if lead:
        _report(cfg, records, run_id)
    if cfg.backend == "nccl" and _fast_net_unproven(backend, info):
        return 1
    if total_wrong:
        if lead:
            sys.stderr.write(f"wirespeed: error: {total_wrong} wrong elements: the backend returned "
                             "wrong data (see the #wrong column)\n")
        return 1
    return 0


def _print_header(cfg, info, env, shared=()) -> None:
    v = env.get("versions", {})
    print(f"# wirespeed {v.get('wirespeed')} bench: backend {cfg.backend}, device {cfg.device}, "
          f"{info.world_size} ranks, torch {v.get('torch')}")
    print(f"# iters {cfg.iters}, warmup {cfg.warmup_iters}, check {'on' if cfg.check else 'off'}, "
          f"timeout {cfg.timeout_s:g} s; {time_method_text(cfg)}; GB/s = 1e9 B/s")
    if cfg.backend == "nccl" and os.environ.get("NCCL_NET") == "wirespeed":
        print(f"# NCCL network: the wirespeed plugin {os.environ.get('NCCL_NET_PLUGIN')} (--fast-net)")
    for r, h in enumerate(env.get("hosts", [])):
        print(f"#  Rank {r:3d} on {h}")
    if cfg.host_per_rank:
        print("# --host-per-rank: every rank has a host id of its own (NCCL_HOSTID, WIRESPEED_HOSTID), "
              "so the backends connect the ranks as nodes of a cluster, over the network stack")
    for line in shared:
        print(line)
    if cfg.plan:
        from ..bench.harness import plan_collective
        coll = plan_collective(cfg)
        p = coll.plan
        print(f"# plan {p.name!r} ({cfg.plan}): {p.collective}, {p.protocol}, "
              f"{'in place' if p.inplace else 'out of place'}, executed by {p.nranks} CPU ranks "
              "(shared memory on a host, wirespeed's engine for port channels)")
        coll.sizes(cfg.sizes)   # what it rounds or skips, said once, here
        for note in coll.notes:
            print(f"# plan {note}")
    print("#")
    sys.stdout.flush()


def time_method_text(cfg: BenchConfig) -> str:
    from ..bench.harness import LOOPS
    text = (f"time = median of up to {LOOPS} loops of {cfg.iters} calls back to back (a loop: one sync, "
            f"elapsed / {cfg.iters}, slowest rank; nccl-tests' mean over ranks in records)")
    if cfg.per_op_columns:
        text += "; p50/p99 = of single calls, each synced, slowest rank per call"
    return text


def _report(cfg: BenchConfig, records, run_id) -> None:
    from ..report.plot import plot_records
    from ..report.records import write_csv, write_jsonl
    from ..report.table import footer, markdown_table, nccl_table
    print(markdown_table(records) if cfg.format == "md" else nccl_table(records, cfg.per_op_columns))
    print(footer(records))
    from ..launch.cluster import link_summary
    if link_summary(records):
        print(link_summary(records))
    if cfg.json_path:
        write_jsonl(cfg.json_path, records)
    if cfg.csv_path:
        write_csv(cfg.csv_path, records)
    if cfg.plot_path:
        plot_records(records, cfg.plot_path, title=f"wirespeed bench ({cfg.backend}, {cfg.device})")
    if cfg.save_dir:
        d = os.path.join(cfg.save_dir, run_id)
        if os.path.exists(d):
            d = f"{d}-{os.getpid()}"
        write_jsonl(os.path.join(d, "records.jsonl"), records)
        plot_records(records, os.path.join(d, "plot.png"), title=f"wirespeed bench ({cfg.backend}, {cfg.device})")
        print(f"# saved records and plot in {d}/")
    sys.stdout.flush()
