"""The "is every rank done?" flag, three ways: all_gather_object (pickles a Python bool on every rank,
as training loops often do), all_reduce of a one-element tensor (min), all_gather of a one-element
tensor. Every call's answer is checked against the flags' known pattern.

The flags vary per iteration so an answer cannot be right by accident: on iterations i with i % 3 == 0
rank i % world is not done, so the answer alternates between False and True.
all_gather_object is torch.distributed's own, so this runs on torch.distributed backends.
"""
from __future__ import annotations

import time

import torch

from ..bench.harness import summarize
from ..errors import UsageError

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
