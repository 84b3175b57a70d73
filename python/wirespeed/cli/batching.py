"""`wirespeed batching`: one all_reduce of TOTAL bytes against k calls of TOTAL/k, for each k in --chunks,
checked, with the latency/bandwidth line t = a + b * bytes fitted by least squares.

Run by hand it spawns -N local ranks; under torchrun, srun or mpirun it is one rank of that job.
"""
from __future__ import annotations

from functools import partial

from ..errors import UsageError
from ..flagvalues import whole_numbers
from . import flags
from .rankjob import (Job, check_local_start, default_nproc, parse_iters_timeout,
                      parse_num, resolve_backend, run_job)
from ..sizes import format_size, parse_size
from .common import add

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
    chunks = whole_numbers(args.chunks, "--chunks", "call counts", "1,10,100,1000")
    iters, timeout = parse_iters_timeout(args)
    backend, device = resolve_backend(args.backend, args.device)
    from ..workloads.config import BatchingConfig
    return BatchingConfig(dtype=dts[0], chunks=sorted(set(chunks)), backend=backend, device=device,
                          nproc=default_nproc(args.nproc, device), warmup=parse_num(args.warmup_iters,
                          "--warmup-iters"), iters=iters, timeout=timeout, json_path=args.json,
                          plot_path=args.plot)


def _need(total: int, sharers: int) -> int:
    from ..bench.verifiable import CHUNK_ELEMS
    return (total + 5 * 8 * CHUNK_ELEMS) * sharers  # the buffer, plus the checker's temporaries


def pick_total(text, c, ranks_here: int) -> int:
    from ..launch.memory import buffer_budget
    sharers, budget = buffer_budget(c.device, ranks_here)
    if text is None:
        total = MAX_DEFAULT_TOTAL
        while total > (1 << 20) and _need(total, sharers) > budget / 2:  # leave half for the rest
            total //= 2
    else:
        total = parse_size(text)
    itemsize = c.dtype.itemsize
    if total < itemsize * max(c.chunks):
        raise UsageError(f"--total {format_size(total)} is too small for {max(c.chunks)} chunks of "
                         f"{c.dtype.name}: give at least {format_size(itemsize * max(c.chunks))}")
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
    return Job(c.backend, c.device, c.timeout, launch=partial(_launch, c, args),
               before_start=partial(_before_start, c, args), work=partial(_run_as_rank, c))


def _launch(c, args, start) -> int:
    check_local_start(c.nproc, c.backend, c.device)
    total = pick_total(args.total, c, c.nproc)
    return start(c.nproc, ["--total", str(total)])


def _before_start(c, args, info) -> tuple:
    from ..launch.environment import spawned_here
    local = spawned_here()
    return (pick_total(args.total, c, 1 if local else info.local_world_size),)


def _run_as_rank(c, info, backend, device, total: int) -> int:
    from ..workloads.batching import run_as_rank   # imports torch: in the ranks only
    return run_as_rank(c, info, backend, device, total)
