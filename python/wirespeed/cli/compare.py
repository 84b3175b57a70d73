"""`wirespeed compare`: backends x dtypes x devices x world sizes side by side (see docs/compare.md).

Each combination runs as its own `wirespeed bench` in fresh processes; the tables, summary and plots
are renderings of the records, which `--from` rebuilds later from a saved run.
"""
from __future__ import annotations

from ..errors import UsageError
from . import flags
from .common import add


def register(sub) -> None:
    p = sub.add_parser("compare", help="compare backends, dtypes, devices and world sizes side by side",
                       description="Run `wirespeed bench` for every combination of backend, dtype, "
                       "device and world size that exists here (listing the others with the reason), "
                       "then print one table per collective, a summary of who wins where, and plots.")
    add(p, "--backends", default=None,
        help="comma list of backends (default: every registered one, and wirespeed)")
    add(p, "--dtypes", default="float32,float16", help="comma list of dtypes")
    add(p, "--devices", default="cpu,cuda", help="comma list of cpu, cuda")
    add(p, "--nprocs", default="2,4,8", help="comma list of world sizes (local ranks)")
    add(p, "-c", "--collective", default="all_reduce", help="comma list of collectives, or all")
    add(p, "-o", "--op", default="sum", help="comma list of reduction ops")
    flags.sweep(p, minbytes="4K", factor="2")
    flags.iterations(p, warmup="5", iters="20", unit="iterations per size", who="a run fails")
    add(p, "--repeat", default="1",
        help="run the whole matrix this many times, interleaved; report median and spread")
    add(p, "--variant", default="best", choices=("best", "in-place", "out-of-place"),
        help="which variant fills a cell (best: the faster one the backend has)")
    flags.output(p, "--json", unused_with=("from_paths",), default=None,
                 help="write every record (JSON lines) here")
    flags.output(p, "--save-dir", what="dir", unused_with=("no_save", "from_paths"), default="runs",
                 help="records, summary, plots and logs go to SAVE_DIR/compare-<time>/")
    add(p, "--no-save", action="store_true", help="do not save under --save-dir")
    flags.output(p, "--plot-dir", what="dir", default=None, help="write the plots here (default: the saved run's directory)")
    flags.placement(p, what="every combination's ranks", rph="ranks per host (default 1, round robin)")
    p.add_argument("--from", dest="from_paths", nargs="+", default=None, metavar="RUNDIR",
                   help="rebuild tables, summary and plots from saved records instead of running")
    p.set_defaults(func=main)


def _int(text, flag, least):
    try:
        v = int(text)
    except (TypeError, ValueError):
        raise UsageError(f"{flag} must be a whole number, got {text!r}") from None
    if v < least:
        raise UsageError(f"{flag} must be at least {least}, got {v}")
    return v


def config_from_args(args):
    from ..backends.registry import BACKENDS
    from ..bench.collectives import parse_collectives
    from ..bench.dtypes import parse_dtypes, parse_ops
    from ..compare.plan import PLANNED, CompareConfig, parse_nprocs, split_list
    from .rankjob import parse_iters_timeout
    backends = split_list(args.backends, "--backends") if args.backends \
        else list(dict.fromkeys([*BACKENDS, *PLANNED]))
    dtypes = [d.name for d in parse_dtypes(args.dtypes)]
    sizes = flags.sizes(args)
    iters, timeout = parse_iters_timeout(args)
    return CompareConfig(
        backends=backends, dtypes=dtypes, devices=split_list(args.devices, "--devices"),
        nprocs=parse_nprocs(args.nprocs), collectives=[c.name for c in parse_collectives(args.collective)],
        ops=parse_ops(args.op), sizes=sizes, iters=iters,
        warmup_iters=_int(args.warmup_iters, "--warmup-iters", 0), timeout_s=timeout,
        repeat=_int(args.repeat, "--repeat", 1), variant=args.variant, json_path=args.json,
        save_dir=None if args.no_save else args.save_dir, plot_dir=args.plot_dir,
        cluster=args.cluster, host_per_rank=args.host_per_rank,
        ranks_per_host=args.ranks_per_host)


def main(args, argv) -> int:
    from ..compare.session import rebuild, run_compare
    from .rankjob import check_rank_flags
    if args.from_paths:
        return rebuild(args.from_paths, args.variant, args.plot_dir)
    check_rank_flags(args)
    cfg = config_from_args(args)
    return run_compare(cfg)
