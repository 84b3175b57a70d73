"""Worker: the lifetime fuzzer. A seeded random mix of async collectives (public dist.* calls,
_c10d_functional ops waited later with wait_tensor, coalesced functional calls, p2p on a ring) of
random kinds, sizes, dtypes and layouts; inputs dropped at random points, Works sometimes dropped
too, waits in random order from a window of pending ops, the allocator churned with garbage
tensors that must stay garbage. Every result is checked against the collective's definition.

argv: seed, number of ops. Collective choices come from one generator seeded alike on every rank
(the ranks must call the same collectives); local choices (layouts, what to drop, wait order,
churn) from one seeded per rank. Reports {ops, checked, problems (first 20), seed}.
"""
import datetime
import os
import random
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # tests/
from native.ranks import report  # noqa: E402
import wirespeed.native  # noqa: E402,F401

torch.set_num_threads(1)
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
seed, count = int(sys.argv[1]), int(sys.argv[2])
dist.init_process_group("wirespeed", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
G = dist.group.WORLD
NAME = G.group_name
F = torch.ops._c10d_functional
shared = random.Random(seed)              # same on every rank: which collective, size, dtype, root
local = random.Random(seed * 1000 + rank)  # this rank's: layouts, drops, wait order, churn
SIZES = (1, 7, 64, 1000, 5000, 40_000)
DTYPES = (torch.float32, torch.bfloat16, torch.float64, torch.int32, torch.int64)
GARBAGE = -5
problems: list[str] = []


def data(r, op, n, dt):
    return ((torch.arange(n, dtype=torch.int64) * 3 + r * 7 + op * 11) % 17 - 8).to(dt)


def every(op, n, dt):
    return [data(r, op, n, dt) for r in range(world)]


def laid_out(t: torch.Tensor, one_d: bool = False) -> torch.Tensor:
    """The values of `t` (1-D) in row-major order, in a random layout: contiguous, a 2-D view
    stored column-major, a stepped slice, or a view a few elements into a larger storage."""
    kind = local.randrange(4)
    n = t.numel()
    if kind == 1 and n % 2 == 0 and not one_d:
        return t.reshape(n // 2, 2).t().contiguous().t()     # (n/2, 2), column-major in memory
    if kind == 2:
        big = torch.empty(2 * n, dtype=t.dtype)
        big[::2] = t
        return big[::2]
    if kind == 3:
        big = torch.empty(n + 3, dtype=t.dtype)
        big[3:] = t
        return big[3:]
    return t.clone()


def out_like(n, dt) -> torch.Tensor:
    """An output of n elements, contiguous or a stepped view."""
    if local.random() < 0.3:
        return torch.full((2 * n,), 99, dtype=dt)[::2]
    return torch.full((n,), 99, dtype=dt)


junk: list[torch.Tensor] = []


def churn():
    for _ in range(local.randrange(1, 5)):
        n = local.choice(SIZES) * local.choice((1, world))
        junk.append(torch.full((n,), GARBAGE, dtype=local.choice(DTYPES)))
    while len(junk) > 48:
        check_junk(junk.pop(local.randrange(len(junk))))


def check_junk(j):
    if not bool((j == GARBAGE).all()):
        problems.append(f"seed {seed}: a garbage tensor ({j.numel()} x {j.dtype}) allocated after dropped inputs was written")


def issue(op: int):
    """Issue one random op; returns (what, wait, [(got, want)]) or None for a fire-and-forget."""
    kind = shared.choice(("all_reduce", "reduce_scatter_tensor", "all_gather_into_tensor", "broadcast", "reduce",
                          "all_to_all_single", "all_gather", "f_all_reduce", "f_reduce_scatter",
                          "f_all_gather", "f_coalesced", "ring"))
    n, dt = shared.choice(SIZES), shared.choice(DTYPES)
    root = shared.randrange(world)
    what = f"op {op}: {kind} {n} x {dt}"
    ev = every(op, n, dt)
    mine = lambda: laid_out(data(rank, op, n, dt))  # noqa: E731
    if kind == "all_reduce":
        x = mine()
        w = dist.all_reduce(x, group=G, async_op=True)
        return what, w.wait, [(x, sum(ev).to(dt))]
    if kind == "reduce":
        x = mine()
        w = dist.reduce(x, dst=root, group=G, async_op=True)
        return what, w.wait, [(x, sum(ev).to(dt) if rank == root else ev[rank])]
    if kind == "broadcast":
        x = mine()
        w = dist.broadcast(x, src=root, group=G, async_op=True)
        return what, w.wait, [(x, ev[root])]
    big = every(op, n * world, dt)
    piece = lambda t, r: t[r * n:(r + 1) * n]  # noqa: E731
    if kind == "reduce_scatter_tensor":
        o = out_like(n, dt)
        w = dist.reduce_scatter_tensor(o, laid_out(big[rank]), group=G, async_op=True)
        return what, w.wait, [(o, piece(sum(big).to(dt), rank))]
    if kind == "all_gather_into_tensor":
        o = out_like(n * world, dt)
        w = dist.all_gather_into_tensor(o, mine(), group=G, async_op=True)
        return what, w.wait, [(o, torch.cat(ev))]
    if kind == "all_gather":
        outs = [out_like(n, dt) for _ in range(world)]
        w = dist.all_gather(outs, mine(), group=G, async_op=True)
        return what, w.wait, [(o, e) for o, e in zip(outs, ev)]
    if kind == "all_to_all_single":
        o = out_like(n * world, dt)
        # 1-D: all_to_all splits its input's first dimension by rank
        w = dist.all_to_all_single(o, laid_out(big[rank], one_d=True), group=G, async_op=True)
        return what, w.wait, [(o, torch.cat([piece(big[r], rank) for r in range(world)]))]
    if kind == "f_all_reduce":
        t = F.all_reduce(mine(), "sum", NAME)
        return what, lambda: F.wait_tensor(t), [(t, sum(ev).to(dt))]
    if kind == "f_reduce_scatter":
        t = F.reduce_scatter_tensor(laid_out(big[rank], one_d=True), "sum", world, NAME)   # splits dim 0
        return what, lambda: F.wait_tensor(t), [(t, piece(sum(big).to(dt), rank))]
    if kind == "f_all_gather":
        t = F.all_gather_into_tensor(mine(), world, NAME)
        return what, lambda: F.wait_tensor(t), [(t, torch.cat(ev))]
    if kind == "f_coalesced":
        ts = F.reduce_scatter_tensor_coalesced([laid_out(big[rank], True), laid_out(big[rank] * 2, True)], "sum",
                                               world, NAME)
        ts += F.all_gather_into_tensor_coalesced([mine(), mine()], world, NAME)
        want = [piece(sum(big).to(dt), rank), piece((sum(big) * 2).to(dt), rank), torch.cat(ev), torch.cat(ev)]

        def wait():
            for t in ts:
                F.wait_tensor(t)
        return what, wait, list(zip(ts, want))
    # ring: send this rank's data to the next rank, receive the previous rank's
    to, frm = (rank + 1) % world, (rank - 1) % world
    got = out_like(n, dt)
    ws = dist.isend(mine(), dst=to, group=G)
    wr = dist.irecv(got, src=frm, group=G)

    def wait():
        wr.wait()
        ws.wait()
    return what, wait, [(got, ev[frm])]


def check(what, pairs):
    for k, (got, want) in enumerate(pairs):
        # compared in row-major order (an input laid out 2-D gives a 2-D functional result)
        if got.numel() != want.numel() or not torch.equal(got.reshape(-1), want.reshape(-1)):
            bad = int((got.reshape(-1) != want.reshape(-1)).sum()) if got.numel() == want.numel() else "shape"
            problems.append(f"seed {seed}: {what} result {k}: {bad} elements wrong")


pending = []
checked = 0
for op in range(count):
    if world == 1:
        break
    what, wait, pairs = issue(op)
    if local.random() < 0.3:
        churn()
    pending.append((what, wait, pairs))
    while len(pending) > local.randrange(1, 9):     # waits in random order, a window of up to 8
        what, wait, pairs = pending.pop(local.randrange(len(pending)))
        wait()
        check(what, pairs)
        checked += 1
for what, wait, pairs in pending:
    wait()
    check(what, pairs)
    checked += 1
for j in junk:
    check_junk(j)
dist.barrier(group=G)
report({"ops": count, "checked": checked, "problems": problems[:20], "seed": seed})
dist.destroy_process_group()
os._exit(0)
