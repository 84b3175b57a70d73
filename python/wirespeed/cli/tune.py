"""`wirespeed tune`: sweep a backend's knobs over sizes and say what to export (docs/tune.md)."""
from __future__ import annotations

from . import flags
from .common import add


def register(sub) -> None:
    p = sub.add_parser("tune", help="sweep a backend's knobs (NCCL_*, WIRESPEED_*) and say what to export",
                       description="Run `wirespeed bench` once per knob setting (knobs are read when a "
                       "library starts), repeats interleaved, every result checked; print each "
                       "setting's time per size, the best setting per size range with its gain over "
                       "the defaults, and the export lines.")
    flags.ranks(p, backends="nccl or wirespeed", default_backend="nccl with GPUs, else wirespeed", nproc="2",
                nproc_help="ranks", port=False)
    add(p, "-c", "--collective", default="all_reduce", help="comma list of collectives")
    add(p, "-d", "--dtype", default="float32", help="comma list of dtypes")
    add(p, "-o", "--op", default="sum", help="comma list of reduction ops")
    flags.sweep(p, minbytes="4K", factor="4")
    add(p, "--repeat", default="3", help="run every setting this many times, interleaved")
    flags.iterations(p, warmup="5", iters="20", unit="calls per size", timed="calls per size in each run",
                     who="a run fails")
    add(p, "--knobs", default=None,
        help="comma list of knobs to sweep (default: the backend's usual subset; --list shows all)")
    add(p, "--all-knobs", action="store_true", help="sweep every knob of the backend that acts here")
    p.add_argument("--values", action="append", default=None, metavar="NAME=V1,V2",
                   help="values to try for a knob instead of the table's (repeatable)")
    add(p, "--list", action="store_true", help="print the knob table and exit")
    flags.placement(p, rph="ranks per host (default 1, round robin)")
    flags.output(p, "--json", unused_with=("list",), default=None,
                 help="write every record (JSON lines) here")
    flags.output(p, "--save-dir", what="dir", unused_with=("no_save", "list"), default="runs",
                 help="records, verdict and logs go to SAVE_DIR/tune-<time>/")
    add(p, "--no-save", action="store_true", help="do not save under --save-dir")
    p.set_defaults(func=main)


def list_knobs() -> int:
    from ..tune.knobs import KNOBS
    print(f"{'backend':<10} {'knob':<24} {'acts':<13} {'default':<8} {'group':<8} values  (meaning)")
    for k in KNOBS:
        print(f"{k.backend:<10} {k.name:<24} {k.where:<13} {'yes' if k.default else 'no':<8} "
              f"{k.group or '-':<8} {','.join(k.values)}  ({k.meaning})")
    return 0


def config_from_args(args):
    from ..backends.registry import BACKENDS, availability
    from ..bench.collectives import parse_collectives
    from ..bench.dtypes import parse_dtypes, parse_ops
    from ..errors import UsageError
    from ..launch.gpus import most_ranks_on_one_host
    from ..compare.runner import BenchRun
    from .rankjob import parse_iters_timeout, parse_num
    from ..tune.knobs import parse_values, select
    from ..tune.sweep import TuneConfig
    backend = args.backend or ("nccl" if availability("nccl") is None else "wirespeed")
    if backend not in BACKENDS:
        raise UsageError(f"unknown backend {backend!r}: choose from {', '.join(BACKENDS)}")
    device = args.device or BACKENDS[backend].devices[0]
    nproc = parse_num(args.nproc, "--nproc")
    if nproc < 1:
        raise UsageError("--nproc must be at least 1")
    repeat = parse_num(args.repeat, "--repeat")
    if repeat < 1:
        raise UsageError("--repeat must be at least 1")
    iters, timeout = parse_iters_timeout(args)
    hosts = None
    if args.cluster:
        from ..netem import cluster as C
        hosts = len(C.require(C.check_name(args.cluster)).hosts)
    per_host = most_ranks_on_one_host(nproc, hosts, args.ranks_per_host, args.host_per_rank)
    names = [n.strip() for n in args.knobs.split(",") if n.strip()] if args.knobs else None
    knobs, notes = select(backend, names, args.all_knobs, across_hosts=per_host < nproc,
                          one_host=per_host > 1, values=parse_values(args.values))
    # Loop timing only: the single-call phase would double the time and the verdict reads the loop's.
    run = BenchRun(backend, device, nproc, [c.name for c in parse_collectives(args.collective)],
                   [d.name for d in parse_dtypes(args.dtype)], parse_ops(args.op),
                   flags.sizes(args), iters,
                   parse_num(args.warmup_iters, "--warmup-iters"), timeout, args.cluster, args.ranks_per_host,
                   args.host_per_rank, extra=("--no-per-op",))
    cfg = TuneConfig(run=run, knobs=knobs, repeat=repeat, json_path=args.json,
                     save_dir=None if args.no_save else args.save_dir)
    return cfg, notes


def main(args, argv) -> int:
    if args.list:
        return list_knobs()
    from ..backends import create
    from ..tune.session import run_tune
    cfg, notes = config_from_args(args)
    create(cfg.run.backend, cfg.run.device)  # fail here, once, if the backend cannot run
    cfg.run.check_resources()  # every setting runs the same ranks and buffers
    return run_tune(cfg, notes)
