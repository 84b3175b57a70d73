"""Scenarios for worker_clients.py: the torch.distributed API surface on a wirespeed default group.

Every result is compared with an exact reference each rank computes for itself (every rank's
inputs are a function of its rank), in Python integers or float64 on values whose sums, products
and averages are exact in every dtype; tensors in awkward layouts must come back equal to that
reference, and the memory around a strided view must be untouched.
"""
from __future__ import annotations

import datetime
import time

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

R = dist.ReduceOp
INT_DTYPES = {torch.int8: 8, torch.uint8: 8, torch.int16: 16, torch.uint16: 16, torch.int32: 32,
              torch.uint32: 32, torch.int64: 64, torch.uint64: 64}
FLOAT_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def values(rank: int, n: int, dtype: torch.dtype, op: str) -> list:
    """Rank `rank`'s inputs as Python numbers: small, so every reduction of them is exact."""
    if dtype == torch.bool:
        return [bool((i * 7 + rank * 3) % 5 < 2) for i in range(n)]
    if op == "prod":
        return [[1, 2, -1, 1][(i + rank) % 4] if dtype.is_signed or dtype.is_floating_point else [1, 2][(i + rank) % 2]
                for i in range(n)]
    if dtype.is_floating_point:
        return [float(((i * 5 + rank * 11) % 17) - 8) * 0.5 for i in range(n)]
    v = [(i * 37 + rank * 101) % 120 for i in range(n)]
    return [x - 60 for x in v] if dtype.is_signed else v


def _wrap(x: int, dtype: torch.dtype) -> int:
    bits = INT_DTYPES[dtype]
    x &= (1 << bits) - 1
    return x - (1 << bits) if dtype.is_signed and x >= 1 << (bits - 1) else x


def expected(world: int, n: int, dtype: torch.dtype, op: str, factor: float = 1.0) -> torch.Tensor:
    cols = list(zip(*[values(r, n, dtype, op) for r in range(world)]))
    out = []
    for c in cols:
        if dtype == torch.bool:
            out.append({"sum": any(c), "max": any(c), "bor": any(c), "prod": all(c), "min": all(c),
                        "band": all(c), "bxor": sum(c) % 2 == 1}[op])
            continue
        if op in ("sum", "avg", "premul"):
            s = sum(x * factor for x in c) if op == "premul" else sum(c)
            if op == "avg" and dtype.is_floating_point:
                s = s / world
            elif op == "avg":
                # the sum wraps at the kernels' accumulator width (32 bits for 8- and 16-bit
                # integers, the type's own above), then divides, truncating toward zero
                bits = max(INT_DTYPES[dtype], 32)
                s &= (1 << bits) - 1
                if dtype.is_signed and s >= 1 << (bits - 1):
                    s -= 1 << bits
                s = abs(s) // world * (1 if s >= 0 else -1)
        elif op == "prod":
            s = 1
            for x in c:
                s *= x
        elif op in ("min", "max"):
            s = min(c) if op == "min" else max(c)
        else:
            s = c[0]
            for x in c[1:]:
                s = {"band": s & x, "bor": s | x, "bxor": s ^ x}[op]
        out.append(s if dtype.is_floating_point else _wrap(int(s), dtype))
    if dtype.is_floating_point:
        return torch.tensor(out, dtype=torch.float64).to(dtype)
    return torch.tensor(out, dtype=torch.int64 if dtype != torch.uint64 else torch.uint64).to(dtype)


def _make(rank, n, dtype, op):
    return torch.tensor(values(rank, n, dtype, op), dtype=dtype)


OPS = {"sum": R.SUM, "prod": R.PRODUCT, "min": R.MIN, "max": R.MAX, "avg": R.AVG,
       "band": R.BAND, "bor": R.BOR, "bxor": R.BXOR}


def dtype_op_grid(rank, world, group):
    """all_reduce, reduce and reduce_scatter of every dtype with every op it defines."""
    wrong, checked = [], 0
    n = 37
    for dtype in list(FLOAT_DTYPES) + list(INT_DTYPES) + [torch.bool]:
        for name, op in OPS.items():
            if name.startswith("b") and dtype.is_floating_point:
                continue
            if dtype == torch.bool and name == "avg":
                continue
            exp = expected(world, n, dtype, name)
            t = _make(rank, n, dtype, name)
            dist.all_reduce(t, op=op, group=group)
            checked += 1
            if not torch.equal(t, exp):
                wrong.append(f"all_reduce {dtype} {name}")
            t = _make(rank, n, dtype, name)
            dist.reduce(t, dst=world - 1, op=op, group=group)
            checked += 1
            if rank == world - 1 and not torch.equal(t, exp):
                wrong.append(f"reduce {dtype} {name}")
            m = 5
            full = expected(world, m * world, dtype, name)
            out = torch.empty(m, dtype=dtype)
            dist.reduce_scatter_tensor(out, _make(rank, m * world, dtype, name), op=op, group=group)
            checked += 1
            if not torch.equal(out, full[rank * m:(rank + 1) * m]):
                wrong.append(f"reduce_scatter {dtype} {name}")
    # premul_sum: a sum of inputs each scaled by the factor first
    for dtype in FLOAT_DTYPES:
        t = _make(rank, n, dtype, "sum")
        dist.all_reduce(t, op=dist._make_nccl_premul_sum(0.25), group=group)
        checked += 1
        if not torch.equal(t, expected(world, n, dtype, "premul", 0.25)):
            wrong.append(f"premul_sum {dtype}")
    # complex sums as pairs of reals
    z = torch.complex(_make(rank, n, torch.float32, "sum"), _make(rank + 1, n, torch.float32, "sum"))
    dist.all_reduce(z, group=group)
    checked += 1
    ez = torch.complex(expected(world, n, torch.float32, "sum"),
                       torch.tensor([sum(values(r + 1, n, torch.float32, "sum")[i] for r in range(world))
                                     for i in range(n)]))
    if not torch.equal(z, ez):
        wrong.append("complex64 sum")
    # refusals: clear errors, raised alike on every rank, and the group stays usable
    refusals = {}
    for what, call in {"band_float": lambda: dist.all_reduce(torch.ones(3), op=R.BAND, group=group),
                       "avg_bool": lambda: dist.all_reduce(torch.ones(3, dtype=torch.bool), op=R.AVG, group=group),
                       "float8": lambda: dist.all_reduce(torch.ones(3).to(torch.float8_e5m2), group=group)}.items():
        try:
            call()
            refusals[what] = None
        except RuntimeError as e:
            refusals[what] = f"{type(e).__name__}: {e}"
    after = torch.ones(2)
    dist.all_reduce(after, group=group)
    return {"wrong": wrong, "checked": checked, "refusals": refusals, "after_refusals": after.tolist()}


def layouts(rank, world, group):
    """Every collective on non-contiguous tensors: results land in the caller's tensor, in place."""
    wrong = []

    def same(name, got, exp):
        if not torch.equal(got, exp):
            wrong.append(name)

    def mine(shape, r=rank, dtype=torch.float32):
        n = 1
        for s in shape:
            n *= s
        return torch.tensor(values(r, n, dtype, "sum"), dtype=dtype).reshape(shape)

    total = sum(mine((6, 8), r) for r in range(world))
    # all_reduce: a transposed view, a strided slice (the skipped elements must stay), channels_last
    t = mine((6, 8)).t()
    dist.all_reduce(t, group=group)
    same("all_reduce transposed", t, total.t())
    base = mine((6, 8))
    view = base[:, ::2]
    dist.all_reduce(view, group=group)
    same("all_reduce strided slice", view, total[:, ::2])
    same("all_reduce strided slice leaves the rest", base[:, 1::2], mine((6, 8))[:, 1::2])
    cl = mine((2, 3, 4, 4)).to(memory_format=torch.channels_last)
    dist.all_reduce(cl, group=group)
    same("all_reduce channels_last", cl, sum(mine((2, 3, 4, 4), r) for r in range(world)))
    h = mine((6, 8), dtype=torch.int16).t()
    dist.all_reduce(h, op=R.BXOR, group=group)
    ex = mine((6, 8), 0, torch.int16)
    for r in range(1, world):
        ex = ex ^ mine((6, 8), r, torch.int16)
    same("all_reduce int16 bxor transposed", h, ex.t())
    w = mine((6, 8)).t()
    dist.all_reduce(w, group=group, async_op=True).wait()
    same("all_reduce transposed async", w, total.t())
    # broadcast into a strided slice
    base = torch.full((10,), -1.0)
    b = base[::2] if rank else mine((5,), 0)
    dist.broadcast(b, src=0, group=group)
    same("broadcast strided", b, mine((5,), 0))
    if rank:
        same("broadcast strided leaves the rest", base[1::2], torch.full((5,), -1.0))
    # all_gather: non-contiguous input and outputs
    outs = [torch.zeros(8, 6)[:, ::2] for _ in range(world)]
    dist.all_gather(outs, mine((3, 8)).t(), group=group)
    for r in range(world):
        same(f"all_gather from {r}", outs[r], mine((3, 8), r).t())
    out = torch.zeros(4, world * 2).t()          # a transposed output for all_gather_into_tensor
    dist.all_gather_into_tensor(out, mine((2, 4)), group=group)
    same("all_gather_into_tensor transposed output", out, torch.cat([mine((2, 4), r) for r in range(world)]))
    # reduce_scatter_tensor: a column-major input and a strided output
    full = sum(mine((world * 3, 4), r) for r in range(world))
    inp = mine((world * 3, 4)).t().contiguous().t()     # logical (world*3, 4), column-major memory
    o = torch.zeros(4, 6)[:, ::2].t()                   # (3, 4) with strides (2, 6)
    dist.reduce_scatter_tensor(o, inp, group=group)
    same("reduce_scatter_tensor", o, full[rank * 3:(rank + 1) * 3])
    # all_to_all_single: a transposed input
    a_in = mine((world * 2, 3)).t().contiguous().t()     # logical (world*2, 3), column-major memory
    a_out = torch.zeros(3, world * 2).t()
    dist.all_to_all_single(a_out, a_in, group=group)
    same("all_to_all_single", a_out, torch.cat([mine((world * 2, 3), r)[rank * 2:(rank + 1) * 2] for r in range(world)]))
    # reduce to a strided root tensor
    base = mine((4, 6))
    rv = base[::2]
    dist.reduce(rv, dst=0, group=group)
    if rank == 0:
        same("reduce strided", rv, sum(mine((4, 6), r) for r in range(world))[::2])
        same("reduce strided leaves the rest", base[1::2], mine((4, 6))[1::2])
    # gather and scatter with strided tensors
    gl = [torch.zeros(4, 6).t() for _ in range(world)] if rank == 0 else None
    dist.gather(mine((4, 6)).t(), gl, dst=0, group=group)
    if rank == 0:
        for r in range(world):
            same(f"gather from {r}", gl[r], mine((4, 6), r).t())
    gt = torch.zeros(4, world * 6).t() if rank == 0 else None       # gather_into_tensor, transposed
    dist.gather_into_tensor(mine((6, 4)), gt, dst=0, group=group)
    if rank == 0:
        same("gather_into_tensor", gt, torch.cat([mine((6, 4), r) for r in range(world)]))
    so = torch.zeros(6, 4).t()
    dist.scatter(so, [mine((4, 6), r + 10).t().contiguous().t() for r in range(world)] if rank == 0 else None,
                 src=0, group=group)
    same("scatter", so, mine((4, 6), rank + 10))
    # send/recv of strided tensors (ring)
    dst, src = (rank + 1) % world, (rank - 1) % world
    rbase = torch.full((12,), 9.0)
    reqs = [dist.isend(mine((3, 2)).t(), dst, group=group), dist.irecv(rbase[::2].view(2, 3), src, group=group)]
    for q in reqs:
        q.wait()
    same("send/recv strided", rbase[::2].view(2, 3), mine((3, 2), src).t())
    same("recv leaves the rest", rbase[1::2], torch.full((6,), 9.0))
    got = torch.zeros(4)
    for q in dist.batch_isend_irecv([dist.P2POp(dist.isend, mine((4,)), dst, group=group),
                                     dist.P2POp(dist.irecv, got, src, group=group)]):
        q.wait()
    same("batch_isend_irecv", got, mine((4,), src))
    return {"wrong": wrong}


def data_dtypes(rank, world, group):
    """Data movement of dtypes no reduction defines (moved as bytes)."""
    wrong = []
    for dtype in (torch.bool, torch.int16, torch.complex128, torch.float8_e4m3fn, torch.uint32):
        src = (torch.arange(10, dtype=torch.float32) + rank).to(dtype)
        outs = [torch.empty_like(src) for _ in range(world)]
        dist.all_gather(outs, src, group=group)
        for r in range(world):
            if not torch.equal(outs[r].view(torch.uint8), (torch.arange(10, dtype=torch.float32) + r).to(dtype).view(torch.uint8)):
                wrong.append(f"all_gather {dtype} from {r}")
    return {"wrong": wrong}


def api_surface(rank, world):
    """Names, device types, splits, subgroups, any-source receive, monitored_barrier, bad peers."""
    out = {}
    w = dist.group.WORLD
    out["group_name"] = w.group_name
    out["device_types"] = [str(d) for d in w._device_types]
    out["backend"] = dist.get_backend(w)
    out["world_class"] = type(w).__name__
    # split_group: pairs, ranks listed in reverse order (position = new rank)
    pairs = [[r + 1, r] for r in range(0, world, 2)]
    sg = dist.split_group(split_ranks=pairs)
    t = torch.tensor([float(rank)])
    dist.all_reduce(t, group=sg)
    pair = [p for p in pairs if rank in p][0]
    out["split"] = [sg.rank(), sg.size(), t.item(), pair.index(rank), float(sum(pair))]
    # new_subgroups: consecutive groups of 2
    cur, subs = dist.new_subgroups(group_size=2)
    t = torch.tensor([1.0 + rank])
    dist.all_reduce(t, group=cur)
    out["subgroups"] = [len(subs), dist.get_backend(cur), t.item(), float(sum(1 + r for r in range(rank - rank % 2, rank - rank % 2 + 2)))]
    # any-source receive: every other rank sends its rank to rank 0, in whatever order they come
    if rank == 0:
        got = []
        for _ in range(world - 1):
            buf = torch.zeros(3)
            src = dist.recv(buf)
            got.append([src, buf.tolist()])
        out["anysource"] = sorted(got)
        out["anysource_expected"] = sorted([[r, [float(r)] * 3] for r in range(1, world)])
    else:
        time.sleep(0.05 * (world - rank))      # senders arrive in reverse rank order
        dist.send(torch.full((3,), float(rank)), dst=0)
    # a named receive after any-source ones still pairs with the right message
    if rank == 1:
        dist.send(torch.tensor([7.0, 8.0]), dst=0)
    if rank == 0:
        b = torch.zeros(2)
        dist.recv(b, src=1)
        out["named_after_any"] = b.tolist()
    # monitored_barrier: passes when all arrive; names the missing rank when one does not
    dist.monitored_barrier(timeout=datetime.timedelta(seconds=30))
    mb = dist.new_group(backend="wirespeed")
    if rank != world - 1:
        t0 = time.monotonic()
        try:
            dist.monitored_barrier(group=mb, timeout=datetime.timedelta(seconds=1.5))
            out["monitored_missing"] = None
        except RuntimeError as e:
            out["monitored_missing"] = [type(e).__name__, str(e), time.monotonic() - t0]
    dist.barrier()
    # bad peer numbers: one clear error
    errs = {}
    for what, call in {"send_minus_1": lambda: dist.send(torch.ones(1), dst=-1),
                       "send_world": lambda: dist.send(torch.ones(1), dst=world)}.items():
        try:
            call()
            errs[what] = None
        except (RuntimeError, ValueError) as e:
            errs[what] = f"{type(e).__name__}: {e}"
    out["bad_peer"] = errs
    return out


def done(t):
    """A functional collective's result, waited for."""
    return t.wait() if isinstance(t, funcol.AsyncCollectiveTensor) else t


def functional(rank, world, group):
    """torch.distributed._functional_collectives on the group, by object, by name and by mesh."""
    wrong = []
    from torch.distributed.device_mesh import DeviceMesh
    mesh = DeviceMesh.from_group(group, "cpu")
    x = torch.tensor(values(rank, 12, torch.float32, "sum")).reshape(3, 4)
    total = sum(torch.tensor(values(r, 12, torch.float32, "sum")).reshape(3, 4) for r in range(world))
    for name, g in (("group", group), ("name", group.group_name), ("mesh", mesh)):
        if not torch.equal(done(funcol.all_reduce(x, "sum", g)), total):
            wrong.append(f"all_reduce by {name}")
    got = funcol.all_gather_tensor(x, 0, group)
    if not torch.equal(done(got), torch.cat([torch.tensor(values(r, 12, torch.float32, "sum")).reshape(3, 4)
                                                        for r in range(world)])):
        wrong.append("all_gather_tensor")
    big = torch.tensor(values(rank, 4 * world, torch.float32, "sum")).reshape(world, 4)
    rs = funcol.reduce_scatter_tensor(big, "sum", 0, group)
    exp = sum(torch.tensor(values(r, 4 * world, torch.float32, "sum")).reshape(world, 4) for r in range(world))[rank:rank + 1]
    if not torch.equal(done(rs), exp):
        wrong.append("reduce_scatter_tensor")
    a2a = funcol.all_to_all_single(big, None, None, group)
    exp = torch.cat([torch.tensor(values(r, 4 * world, torch.float32, "sum")).reshape(world, 4)[rank:rank + 1]
                     for r in range(world)])
    if not torch.equal(done(a2a), exp):
        wrong.append("all_to_all_single")
    bc = funcol.broadcast(x if rank == 0 else torch.zeros(3, 4), 0, group)
    if not torch.equal(done(bc), torch.tensor(values(0, 12, torch.float32, "sum")).reshape(3, 4)):
        wrong.append("broadcast")
    co = funcol.all_reduce_coalesced([x, x * 2], "sum", group)
    if not (torch.equal(done(co[0]), total) and torch.equal(done(co[1]), total * 2)):
        wrong.append("all_reduce_coalesced")
    wrong += dropped_inputs(rank, world, group)
    return {"wrong": wrong}


def dropped_inputs(rank, world, group):
    """Async reduce_scatter_tensor / all_gather_into_tensor on a temporary input the caller drops
    at once (`torch.cat(grads)` style): the op must still read it. Rank 1 comes late, so the ops
    sit queued on the others while their inputs' memory is freed and reused; 4 MiB inputs are read
    where they lie (not staged), by the owner and by its peers."""
    wrong = []
    n = 1 << 20
    if rank == 1:
        time.sleep(0.3)
    rs_out, ag_out = torch.empty(n // world), torch.empty(n * world)
    w1 = dist.reduce_scatter_tensor(rs_out, torch.full((n,), float(rank + 1)), group=group, async_op=True)
    w2 = dist.all_gather_into_tensor(ag_out, torch.full((n,), float(rank + 1)), group=group, async_op=True)
    junk = [torch.full((n,), -7.0) for _ in range(6)]      # likely the freed inputs' memory
    w1.wait()
    w2.wait()
    del junk
    if not torch.equal(rs_out, torch.full((n // world,), world * (world + 1) / 2)):
        wrong.append("async reduce_scatter_tensor of a dropped input")
    if not torch.equal(ag_out, torch.cat([torch.full((n,), float(r + 1)) for r in range(world)])):
        wrong.append("async all_gather_into_tensor of a dropped input")
    return wrong
