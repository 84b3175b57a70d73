"""`wirespeed objects`: the "is every rank done?" flag via all_gather_object, all_reduce and all_gather,
per world size, checked every call, with the speed-up of the tensor collectives over the object one.

Run by hand it launches each world size of -N in turn on local ranks; under torchrun, srun or mpirun
it is one rank of that job (one world size).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from functools import partial

from ..errors import UsageError
from . import flags
from .rankjob import (Job, check_local_gpus, parse_iters_timeout, parse_num,
                      resolve_backend, run_job, uses_torch_distributed)
from ..bench.watchdog import guarded_rank
from ..report.records import record


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
    try:
        worlds = [int(n) for n in str(args.nproc).split(",") if n.strip()]
    except ValueError:
        raise UsageError(f"-N must be a comma list of world sizes, got {args.nproc!r}") from None
    if not worlds or min(worlds) < 1:
        raise UsageError("-N needs world sizes of at least 1, e.g. -N 2,4")
    iters, timeout = parse_iters_timeout(args)
    backend, device = resolve_backend(args.backend, args.device)
    return dict(worlds=worlds, backend=backend, device=device, iters=iters, timeout=timeout,
                warmup=parse_num(args.warmup_iters, "--warmup-iters"))


def main(args, argv) -> int:
    return run_job(_job, args, argv)


def _job(args) -> Job:
    c = _config(args)
    return Job(c["backend"], c["device"], c["timeout"], launch=partial(_launch, c, args),
               work=partial(run_as_rank, c, args))


def _launch(c, args, start) -> int:
    """Each world size of -N is a job of its own, started in turn; rank 0 of each hands its
    records back through --records-to, and the one table covers them all."""
    from ..backends import create
    if not uses_torch_distributed(create(c["backend"], c["device"])):
        raise UsageError(f"objects compares with torch.distributed's all_gather_object, which "
                         f"--backend {c['backend']} lacks: use gloo, nccl or wirespeed")
    from ..launch.memory import check_local_ranks
    for n in c["worlds"]:
        check_local_ranks(n)
        check_local_gpus(n, c["backend"])
    from ..report.records import read_records
    records, code = [], 0
    with tempfile.TemporaryDirectory(prefix="wirespeed-objects-") as tmp:
        for n in c["worlds"]:
            path = os.path.join(tmp, f"{n}.jsonl")
            code = start(n, ["-N", str(n), "--records-to", path])
            if code != 0:
                break
            records += read_records(path)  # rank 0's, handed back through --records-to
    if records:
        _report(c, records, args.json)
    return code


def run_as_rank(c, args, info, backend, device) -> int:
    from ..workloads.objects import run_objects
    with guarded_rank(info.rank, c["timeout"]) as watchdog:
        rows = run_objects(backend, info.rank, info.world_size, device, c["warmup"], c["iters"], watchdog)
        watchdog.step("finishing")
        backend.barrier()
    wrong = sum(r["wrong"] for r in rows)
    if info.rank == 0:
        from ..envinfo import record_env
        env = record_env()
        records = [record("objects", {"run_id": time.strftime("%Y%m%d-%H%M%S"),
                    "backend": c["backend"], "device": c["device"], **r, "env": env}) for r in rows]
        if args.records_to:
            with open(args.records_to, "w") as f:
                f.writelines(json.dumps(r) + "\n" for r in records)
        else:
            _report(c, records, args.json)
        if wrong:
            sys.stderr.write(f"wirespeed: error: {wrong} wrong answers to 'is every rank done?'\n")
    return 1 if wrong else 0


def _report(c, records, json_path) -> None:
    from ..report.records import write_jsonl
    print(f"# wirespeed objects: the 'is every rank done?' flag; backend {c['backend']}, device "
          f"{c['device']}; {c['iters']} timed calls per method after {c['warmup']} warm-up; "
          "time = median over calls of the slowest rank; every answer checked")
    print(f"{'ranks':>5} {'all_gather_object(us)':>22} {'all_reduce(us)':>15} {'all_gather(us)':>15} "
          f"{'speed-up ar':>12} {'speed-up ag':>12} {'#wrong':>7}")
    for n in sorted({r["world_size"] for r in records}):
        by = {r["method"]: r for r in records if r["world_size"] == n}
        obj, ar, ag = by["all_gather_object"], by["all_reduce"], by["all_gather"]
        for r, other in ((ar, obj), (ag, obj)):
            r["speedup_vs_object"] = other["time_us"] / r["time_us"] if r["time_us"] else None
        print(f"{n:>5} {obj['time_us']:>22.1f} {ar['time_us']:>15.1f} {ag['time_us']:>15.1f} "
              f"{ar['speedup_vs_object']:>11.2f}x {ag['speedup_vs_object']:>11.2f}x "
              f"{obj['wrong'] + ar['wrong'] + ag['wrong']:>7}")
    print("# speed-up = all_gather_object's time / the tensor collective's time")
    if json_path:
        write_jsonl(json_path, records)
    sys.stdout.flush()
