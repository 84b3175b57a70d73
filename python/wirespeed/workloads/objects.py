"""The "is every rank done?" flag, three ways: all_gather_object (pickles a Python bool on every rank,
as training loops often do), all_reduce of a one-element tensor (min), all_gather of a one-element
tensor. Every call's answer is checked against the flags' known pattern.

The flags vary per iteration so an answer cannot be right by accident: on iterations i with i % 3 == 0
rank i % world is not done, so the answer alternates between False and True.
all_gather_object is torch.distributed's own, so this runs on torch.distributed backends.
"""
from __future__ import annotations

import sys
import time

import torch

from ..bench.harness import summarize
from ..errors import UsageError
from ..report.records import record, write_jsonl
from .config import ObjectsConfig

METHODS = ("all_gather_object", "all_reduce", "all_gather")


def done_flag(i: int, rank: int, world: int) -> bool:
    return not (i % 3 == 0 and rank == i % world)


def every_rank_done(i: int, world: int) -> bool:
    return i % 3 != 0


def run_objects(backend, rank: int, world: int, device: str, warmup: int, iters: int,
                watchdog) -> list[dict]:
    import torch.distributed as dist
    if not dist.is_available() or not dist.is_initialized():
        raise UsageError("wirespeed objects compares with torch.distributed's all_gather_object: "
                         "choose a torch.distributed backend (gloo or nccl)")
    one = torch.zeros(1, dtype=torch.int32, device=device)
    gathered = torch.zeros(world, dtype=torch.int32, device=device)
    objs: list = [None] * world

    def via_objects(flag):
        dist.all_gather_object(objs, flag)
        return all(objs)

    def via_all_reduce(flag):
        one.fill_(int(flag))
        backend.all_reduce(one, one, "min")
        return bool(one.item())

    def via_all_gather(flag):
        one.fill_(int(flag))
        backend.all_gather(one, gathered)
        return bool(gathered.all().item())

    out = []
    for name, fn in zip(METHODS, (via_objects, via_all_reduce, via_all_gather)):
        wrong = 0
        for i in range(warmup):
            fn(done_flag(i, rank, world))
            watchdog.progress()
        backend.barrier()
        times = []
        watchdog.step(f"timing {name}")
        for i in range(iters):
            flag = done_flag(i, rank, world)
            t0 = time.perf_counter()
            answer = fn(flag)  # .item() / the unpickled list: the answer is on the host, synced
            times.append(time.perf_counter() - t0)
            watchdog.progress()
            wrong += answer != every_rank_done(i, world)
        rows = backend.allgather_floats([float(wrong), *times])
        m = summarize([r[1:] for r in rows])
        m.update(method=name, wrong=int(sum(r[0] for r in rows)), world_size=world, iters=iters)
        out.append(m)
    return out


# `wirespeed objects`' rank, its backend started (cli/objects.py parses the flags and starts each
# world size in turn): every method timed, and on rank 0 the records, handed back or reported.


def run_as_rank(c: ObjectsConfig, info, backend, device) -> int:
    from ..bench.watchdog import guarded_rank
    with guarded_rank(info.rank, c.timeout) as watchdog:
        rows = run_objects(backend, info.rank, info.world_size, device, c.warmup, c.iters, watchdog)
        watchdog.step("finishing")
        backend.barrier()
    wrong = sum(r["wrong"] for r in rows)
    if info.rank == 0:
        from ..envinfo import record_env
        env = record_env()
        records = [record("objects", {"run_id": time.strftime("%Y%m%d-%H%M%S"),
                    "backend": c.backend, "device": c.device, **r, "env": env}) for r in rows]
        if c.records_to:
            write_jsonl(c.records_to, records)
        else:
            report(c, records)
        if wrong:
            sys.stderr.write(f"wirespeed: error: {wrong} wrong answers to 'is every rank done?'\n")
    return 1 if wrong else 0


def report(c: ObjectsConfig, records) -> None:
    from ..report.records import write_jsonl
    print(f"# wirespeed objects: the 'is every rank done?' flag; backend {c.backend}, device "
          f"{c.device}; {c.iters} timed calls per method after {c.warmup} warm-up; "
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
    if c.json_path:
        write_jsonl(c.json_path, records)
    sys.stdout.flush()
