"""`wirespeed links`: time every pair of ranks (or of hosts) point to point, in rounds that share no
link, print the GB/s and latency matrices, a heatmap, records, and a last line naming what is slow
(docs/links.md). Runs as a job like bench: local ranks, --cluster, or under torchrun/srun/mpirun."""
from __future__ import annotations

from functools import partial

from ..errors import UsageError
from . import flags
from .common import add


def register(sub) -> None:
    p = sub.add_parser("links", help="time every pair of ranks or hosts; name the slow host or link",
                       description="Point-to-point bandwidth and latency between every pair of ranks "
                       "(or of hosts, one rank each), in rounds where no host is in two pairs; prints "
                       "the matrices and `slow: ...` (a host below half the median), writes a heatmap "
                       "and JSON records.")
    add(p, "--size", default="16M", help="bytes per bandwidth message (K/M/G binary suffixes)")
    add(p, "--lat-iters", default="20", help="timed round trips per pair for the latency")
    add(p, "--by", default="auto", choices=("auto", "rank", "host"),
        help="pairs of ranks, or of hosts (one rank each); auto: ranks up to 16, else hosts")
    flags.ranks(p, backends="gloo, nccl or wirespeed")
    flags.iterations(p, warmup="1", iters="5", unit="messages each way per pair")
    flags.output(p, "--json", default=None, help="write the pair records (JSON lines) here")
    flags.output(p, "--plot", default=None, help="write the heatmap PNG here")
    flags.output(p, "--save-dir", what="dir", unused_with=("no_save",), default="runs",
                 help="records and heatmap also go to SAVE_DIR/links-<time>/")
    add(p, "--no-save", action="store_true", help="do not save under --save-dir")
    flags.placement(p, rph="ranks per host", host_per_rank=False)
    p.set_defaults(func=main)


def config_from_args(args):
    from ..explain.links_rank import LinksConfig
    from .rankjob import parse_iters_timeout, parse_num, resolve_backend
    from ..sizes import parse_size
    backend, device = resolve_backend(args.backend, args.device)
    if backend == "mpi":
        raise UsageError("links runs on torch.distributed backends (gloo, nccl, wirespeed); "
                         "use --backend gloo to time the same links")
    nbytes = parse_size(args.size)
    if nbytes < 4:
        raise UsageError("--size must be at least 4 bytes (one float32)")
    iters, timeout = parse_iters_timeout(args)
    lat = parse_num(args.lat_iters, "--lat-iters")
    if lat < 1:
        raise UsageError("--lat-iters must be at least 1")
    return LinksConfig(backend=backend, device=device, nbytes=nbytes - nbytes % 4, iters=iters,
                       warmup_iters=parse_num(args.warmup_iters, "--warmup-iters"), lat_iters=lat,
                       by=args.by, timeout_s=timeout, json_path=args.json, plot_path=args.plot,
                       save_dir=None if args.no_save else args.save_dir)


def main(args, argv) -> int:
    from .rankjob import run_job
    return run_job(_job, args, argv)


def _job(args):
    from ..explain.links_rank import run_as_rank
    from .rankjob import Job
    cfg = config_from_args(args)
    return Job(cfg.backend, cfg.device, cfg.timeout_s, launch=partial(_launch, cfg, args),
               before_start=_before_start, work=partial(run_as_rank, cfg))


def _launch(cfg, args, start) -> int:
    from .rankjob import default_nproc
    nproc = default_nproc(args.nproc, cfg.device)
    if args.cluster:
        from ..launch.cluster import cluster_nproc
        nproc = cluster_nproc(args.cluster, args.ranks_per_host, args.nproc, nproc)
    if nproc < 2:
        raise UsageError("links needs 2 ranks or more (-N)")
    if args.by == "host" and not args.cluster:
        # Our own spawn puts every rank on this host: one host has no pair to time (the matrices
        # would be empty). Under an outer launcher run_links refuses the same once hosts are known.
        raise UsageError("--by host times pairs of hosts, and every rank started here runs on this "
                         "one host: use --by rank, or --cluster (or a launcher across machines)")
    from ..backends import create
    create(cfg.backend, cfg.device)  # fail here, once, if the backend cannot run
    return start(nproc)


def _before_start(info) -> None:
    if info.world_size < 2:
        raise UsageError("links needs 2 ranks or more")


