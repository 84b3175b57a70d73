"""`wirespeed batching`: one all_reduce of TOTAL bytes against k calls of TOTAL/k, for each k in --chunks,
checked, with the latency/bandwidth line t = a + b * bytes fitted by least squares.

Run by hand it spawns -N local ranks; under torchrun, srun or mpirun it is one rank of that job.
"""
from __future__ import annotations

import os
import sys
import time
from functools import partial

from ..errors import UsageError
from . import flags
from .rankjob import (Job, check_local_gpus, default_nproc, parse_iters_timeout,
                      parse_num, resolve_backend, run_job)
from ..bench.watchdog import guarded_rank
from ..sizes import format_size, human_bytes, parse_size
from .common import add
from ..report.records import record

MAX_DEFAULT_TOTAL = 4 << 30  # the 1 x 4 GB of the comparison, when the machine has room for it


def register(sub) -> None:
    p = sub.add_parser("batching", help="one big all_reduce vs many small ones of the same total",
                       description="All-reduce one buffer as 1, 10, 100, ... calls; time and check each, "
                       "fit t = a + b*bytes per call, and plot total time against the number of calls.")
    add(p, "--total", default=None, help="bytes reduced per step (e.g. 4G; default: the largest "
        "power of two up to 4G that fits this machine)")
    add(p, "--chunks", default="1,10,100,1000", help="comma list of call counts")
    add(p, "-d", "--dtype", default="float32", help="float32, float16, bfloat16, float64, int32, ...")
    flags.ranks(p, holds="the buffer")
    flags.iterations(p, warmup="1", iters="3", unit="steps per chunk count")
    flags.output(p, "--json", default=None, help="write one JSON-lines record per chunk count here")
    flags.output(p, "--plot", default=None, help="write a PNG of total time vs chunk count with the fit here")
    p.set_defaults(func=main)


def _config(args):
    from ..bench.dtypes import parse_dtypes
    dts = parse_dtypes(args.dtype)
    if len(dts) != 1:
        raise UsageError("--dtype takes one dtype for batching")
    try:
        chunks = [int(c) for c in args.chunks.split(",") if c.strip()]
    except ValueError:
        raise UsageError(f"--chunks must be a comma list of whole numbers, got {args.chunks!r}") from None
    if not chunks or min(chunks) < 1:
        raise UsageError("--chunks needs call counts of at least 1, e.g. 1,10,100,1000")
    iters, timeout = parse_iters_timeout(args)
    backend, device = resolve_backend(args.backend, args.device)
    return dict(dtype=dts[0], chunks=sorted(set(chunks)), backend=backend, device=device,
                nproc=default_nproc(args.nproc, device), warmup=parse_num(args.warmup_iters,
                "--warmup-iters"), iters=iters, timeout=timeout)


def _need(total: int, sharers: int) -> int:
    from ..bench.verifiable import CHUNK_ELEMS
    return (total + 5 * 8 * CHUNK_ELEMS) * sharers  # the buffer, plus the checker's temporaries


def pick_total(text, c, ranks_here: int) -> int:
    from ..launch.memory import buffer_budget
    sharers, budget = buffer_budget(c["device"], ranks_here)
    if text is None:
        total = MAX_DEFAULT_TOTAL
        while total > (1 << 20) and _need(total, sharers) > budget / 2:  # leave half for the rest
            total //= 2
    else:
        total = parse_size(text)
    itemsize = c["dtype"].itemsize
    if total < itemsize * max(c["chunks"]):
        raise UsageError(f"--total {format_size(total)} is too small for {max(c['chunks'])} chunks of "
                         f"{c['dtype'].name}: give at least {format_size(itemsize * max(c['chunks']))}")
    if _need(total, sharers) > budget:
        fit = 1 << 20
        while _need(fit * 2, sharers) <= budget:
            fit *= 2
        raise UsageError(f"--total {format_size(total)} needs {_need(total, sharers) / (1 << 30):.1f} GiB "
                         f"for {sharers} rank(s) but {max(budget, 0) / (1 << 30):.1f} GiB is available: "
                         f"use --total {format_size(fit)} or fewer ranks")
    return total - total % itemsize


def main(args, argv) -> int:
    return run_job(_job, args, argv)


def _job(args) -> Job:
    c = _config(args)
    return Job(c["backend"], c["device"], c["timeout"], launch=partial(_launch, c, args),
               before_start=partial(_before_start, c, args), work=partial(run_as_rank, c, args))


def _launch(c, args, start) -> int:
    from ..backends import create
    from ..launch.memory import check_local_ranks
    check_local_ranks(c["nproc"])
    create(c["backend"], c["device"])
    check_local_gpus(c["nproc"], c["backend"])
    total = pick_total(args.total, c, c["nproc"])
    return start(c["nproc"], ["--total", str(total)])


def _before_start(c, args, info) -> tuple:
    local = os.environ.get("_WIRESPEED_LOCAL_SPAWN") == "1"
    return (pick_total(args.total, c, 1 if local else info.local_world_size),)


def run_as_rank(c, args, info, backend, device, total: int) -> int:
    import torch

    from ..workloads.batching import measure_chunks
    dt = c["dtype"]
    # Under an outer launcher each host picked its own default: all use the smallest.
    total = int(min(r[0] for r in backend.allgather_floats([float(total)])))
    lead = info.rank == 0
    if lead:
        print(f"# wirespeed batching: {format_size(total)} of {dt.name} all_reduce (sum) as "
              f"{', '.join(map(str, c['chunks']))} calls; backend {c['backend']}, device {c['device']}, "
              f"{info.world_size} ranks")
        print(f"# {c['iters']} timed steps after {c['warmup']} warm-up; time = median over steps of the "
              "slowest rank; every chunk count checked with exact data")
        sys.stdout.flush()
    rows = []
    with guarded_rank(info.rank, c["timeout"]) as watchdog:
        buf = torch.empty(total // dt.itemsize, dtype=dt.torch, device=device)
        for k in c["chunks"]:
            rows.append(measure_chunks(backend, buf, k, dt, info.rank, info.world_size, c["warmup"],
                                       c["iters"], watchdog))
        watchdog.step("finishing")
        backend.barrier()
    wrong = sum(r["wrong"] for r in rows)
    if lead:
        _report(c, info, total, rows, args)
        if wrong:
            sys.stderr.write(f"wirespeed: error: {wrong} wrong elements: the backend returned wrong data\n")
    return 1 if wrong else 0


def _report(c, info, total, rows, args) -> None:
    from ..envinfo import record_env
    from ..report.records import write_jsonl
    from ..workloads.batching import fit_latency_bandwidth
    fit = fit_latency_bandwidth([(r["chunks"], r["time_us"] * 1e-6) for r in rows], total)
    print(f"{'calls':>7} {'bytes/call':>11} {'total(ms)':>11} {'per call(us)':>13} {'GB/s':>8} "
          f"{'fit(ms)':>9} {'#wrong':>7}")
    run_id = time.strftime("%Y%m%d-%H%M%S")
    env = record_env()
    records = []
    for r in rows:
        t = r["time_us"]
        model = (r["chunks"] * fit[0] + fit[1] * total) * 1e3 if fit else float("nan")
        print(f"{r['chunks']:>7} {human_bytes(r['chunk_bytes']):>11} {t / 1e3:>11.3f} "
              f"{t / r['chunks']:>13.1f} {total / (t * 1e-6) / 1e9 if t else 0:>8.3f} {model:>9.3f} "
              f"{r['wrong']:>7}")
        records.append(record("batching", {"run_id": run_id, "backend": c["backend"],
                        "device": c["device"], "dtype": c["dtype"].name, "world_size": info.world_size,
                        "total_bytes": total, **r, "per_call_us": t / r["chunks"],
                        "algbw_gbps": total / (t * 1e-6) / 1e9 if t else 0.0,
                        "fit_latency_us": fit[0] * 1e6 if fit else None,
                        "fit_bandwidth_gbps": 1 / fit[1] / 1e9 if fit and fit[1] > 0 else None,
                        "env": env}))
    if fit:
        bw = f"{1 / fit[1] / 1e9:.3f} GB/s" if fit[1] > 0 else "unbounded (b <= 0: noise dominates)"
        print(f"# fit over {len(rows)} points: t_call = a + b*bytes with a = {fit[0] * 1e6:.1f} us, "
              f"1/b = {bw}")
    else:
        print("# fit: needs at least two different chunk counts")
    if len(rows) > 1:
        lo, hi = rows[0], rows[-1]
        print(f"# {hi['chunks']} calls of {human_bytes(hi['chunk_bytes'])} took "
              f"{hi['time_us'] / lo['time_us']:.2f}x the time of {lo['chunks']} call(s) of "
              f"{human_bytes(lo['chunk_bytes'])}")
    if args.json:
        write_jsonl(args.json, records)
    if args.plot:
        from ..workloads.plots import plot_batching
        plot_batching(records, fit, total, args.plot)
        print(f"# plot written to {args.plot}")
    sys.stdout.flush()

