"""`wirespeed objects`: the "is every rank done?" flag via all_gather_object, all_reduce and all_gather,
per world size, checked every call, with the speed-up of the tensor collectives over the object one.

Run by hand it launches each world size of -N in turn on local ranks; under torchrun, srun or mpirun
it is one rank of that job (one world size).
"""
from __future__ import annotations

import argparse
import os
import tempfile
from functools import partial

from ..errors import UsageError
from ..flagvalues import whole_numbers
from . import flags
from .rankjob import (Job, check_local_gpus, parse_iters_timeout, parse_num,
                      resolve_backend, run_job, uses_torch_distributed)


def register(sub) -> None:
    p = sub.add_parser("objects", help="all_gather_object vs all_reduce/all_gather for a done flag",
                       description="Time the 'is every rank done?' flag as all_gather_object, as an "
                       "all_reduce of one element and as an all_gather of one element, per world size.")
    flags.ranks(p, holds="the flag tensors", backends="gloo, nccl", nproc="2,4",
                nproc_help="comma list of world sizes to launch locally")
    flags.iterations(p, warmup="20", iters="200", unit="calls per method", timeout="120")
    flags.output(p, "--json", default=None, help="write one JSON-lines record per world size and method here")
    p.add_argument("--records-to", default=None, help=argparse.SUPPRESS)  # launcher <- rank 0
    p.set_defaults(func=main)


def _config(args):
    worlds = whole_numbers(args.nproc, "-N", "world sizes", "2,4")
    iters, timeout = parse_iters_timeout(args)
    backend, device = resolve_backend(args.backend, args.device)
    from ..workloads.config import ObjectsConfig
    return ObjectsConfig(worlds=worlds, backend=backend, device=device, iters=iters, timeout=timeout,
                         warmup=parse_num(args.warmup_iters, "--warmup-iters"), json_path=args.json,
                         records_to=args.records_to)


def main(args, argv) -> int:
    return run_job(_job, args, argv)


def _job(args) -> Job:
    c = _config(args)
    return Job(c.backend, c.device, c.timeout, launch=partial(_launch, c, args),
               work=partial(_run_as_rank, c))


def _launch(c, args, start) -> int:
    """Each world size of -N is a job of its own, started in turn; rank 0 of each hands its
    records back through --records-to, and the one table covers them all."""
    from ..backends import create
    if not uses_torch_distributed(create(c.backend, c.device)):
        raise UsageError(f"objects compares with torch.distributed's all_gather_object, which "
                         f"--backend {c.backend} lacks: use gloo, nccl or wirespeed")
    from ..launch.memory import check_local_ranks
    for n in c.worlds:
        check_local_ranks(n)
        check_local_gpus(n, c.backend)
    from ..report.records import read_records
    records, code = [], 0
    with tempfile.TemporaryDirectory(prefix="wirespeed-objects-") as tmp:
        for n in c.worlds:
            path = os.path.join(tmp, f"{n}.jsonl")
            code = start(n, ["-N", str(n), "--records-to", path])
            if code != 0:
                break
            records += read_records(path)  # rank 0's, handed back through --records-to
    if records:
        from ..workloads.objects import report
        report(c, records)
    return code


def _run_as_rank(c, info, backend, device) -> int:
    from ..workloads.objects import run_as_rank   # imports torch: in the ranks only
    return run_as_rank(c, info, backend, device)
