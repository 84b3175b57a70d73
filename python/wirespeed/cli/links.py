"""`wirespeed links`: time every pair of ranks (or of hosts) point to point, in rounds that share no
link, print the GB/s and latency matrices, a heatmap, records, and a last line naming what is slow
(docs/links.md). Runs as a job like bench: local ranks, --cluster, or under torchrun/srun/mpirun."""
from __future__ import annotations

import os
import sys
import time
from functools import partial

from ..errors import UsageError
from . import flags
from .common import add
from ..report.records import record


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
                       by=args.by, timeout_s=timeout)


def main(args, argv) -> int:
    from .rankjob import run_job
    return run_job(_job, args, argv)


def _job(args):
    from .rankjob import Job
    cfg = config_from_args(args)
    return Job(cfg.backend, cfg.device, cfg.timeout_s, launch=partial(_launch, cfg, args),
               before_start=_before_start, work=partial(run_as_rank, cfg, args))


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


def run_as_rank(cfg, args, info, backend, device) -> int:
    from ..explain.links_rank import run_links
    from ..bench.watchdog import guarded_rank
    lead = info.rank == 0

    def say(text):
        if lead:
            print(text, flush=True)

    with guarded_rank(info.rank, cfg.timeout_s) as watchdog:
        result = run_links(cfg, info, backend, device, watchdog, say)
        watchdog.step("finishing")
        backend.barrier()
    if lead:
        report(cfg, result, args)
    return 0


def labels_of(result) -> tuple[list[str], list[str]]:
    """(a label per measured rank, a name per host): `h2` on the emulated cluster, the hostname
    elsewhere; ranks are told apart as `r5@h2` when a host has several."""
    from ..explain.fields import short_host
    hosts, units = result["hosts"], result["units"]
    host_names = []
    for r in units:
        name = short_host(hosts[r])
        if name not in host_names:
            host_names.append(name)
    one_each = len(set(result["host_of_unit"])) == len(units)
    labels = [short_host(hosts[r]) if one_each else f"r{r}@{short_host(hosts[r])}" for r in units]
    return labels, host_names


def records_of(cfg, result, run_id: str) -> list[dict]:
    from ..envinfo import record_env
    from ..launch.cluster import link_fields
    from ..explain.fields import short_host
    env = record_env()
    env["hosts"] = result["hosts"]
    units, hosts = result["units"], result["hosts"]
    out = []
    for (a, b), g in sorted(result["gbps"].items()):
        out.append(record("links", {"run_id": run_id, "backend": cfg.backend, "device": cfg.device,
                    "world_size": len(hosts), "src": units[a], "dst": units[b],
                    "src_host": short_host(hosts[units[a]]), "dst_host": short_host(hosts[units[b]]),
                    "same_host": hosts[units[a]] == hosts[units[b]], "bytes": cfg.nbytes,
                    "iters": cfg.iters, "gbps": g, "latency_us": result["lat_us"][(a, b)],
                    "lat_iters": cfg.lat_iters, **link_fields(), "env": env}))
    return out


def report(cfg, result, args) -> None:
    from ..explain.pairs import find_slow, matrix_text
    from ..explain.plots import plot_heatmaps
    from ..report.records import write_jsonl
    labels, host_names = labels_of(result)
    print(f"# bandwidth (GB/s, 1e9 B/s; {cfg.nbytes} B messages), row sends to column")
    print(matrix_text(labels, result["gbps"], ".3f"))
    print("# latency (us, half the round trip of 8 B)")
    print(matrix_text(labels, result["lat_us"], ".1f"))
    verdict = find_slow(labels, result["host_of_unit"], result["gbps"], host_names)
    run_id = time.strftime("%Y%m%d-%H%M%S")
    records = records_of(cfg, result, run_id)
    n = len(labels)
    grid_g = [[result["gbps"].get((i, j)) for j in range(n)] for i in range(n)]
    grid_l = [[result["lat_us"].get((i, j)) for j in range(n)] for i in range(n)]
    title = f"wirespeed links ({cfg.backend}, {cfg.nbytes} B messages)"
    if args.json:
        write_jsonl(args.json, records)
    if args.plot:
        plot_heatmaps(labels, grid_g, grid_l, args.plot, title)
    if not args.no_save:
        d = os.path.join(args.save_dir, f"links-{run_id}")
        if os.path.exists(d):
            d = f"{d}-{os.getpid()}"
        write_jsonl(os.path.join(d, "records.jsonl"), records)
        plot_heatmaps(labels, grid_g, grid_l, os.path.join(d, "heatmap.png"), title)
        print(f"# saved records and heatmap in {d}/")
    print(f"# {result['rounds']} rounds in {result['seconds']:.1f} s; rule: {verdict.compared}, "
          f"a host (or rank) is slow below half the median of the per-host medians "
          f"({verdict.median_gbps:.3g} GB/s)" + (f"; {verdict.note}" if verdict.note else ""))
    print(verdict.line())
    sys.stdout.flush()
