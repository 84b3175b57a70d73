"""Worker: every collective x dtype x op x size on wirespeed and on gloo with the same exact inputs,
for sub-groups of world sizes 1..5 and the whole job (8 ranks on 2 cores = oversubscribed).

Every result is compared bit for bit with gloo's and with the exact reference of
wirespeed.bench.verifiable (so a case gloo cannot run is still checked).
"""
import datetime
import os
import sys
import traceback

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # tests/
from native.ranks import report  # noqa: E402
import wirespeed.native  # noqa: E402,F401
from wirespeed.bench.dtypes import DTYPES  # noqa: E402
from wirespeed.bench.verifiable import fill, rank_values, reduce_values, to_dtype  # noqa: E402

OPS = {"sum": dist.ReduceOp.SUM, "prod": dist.ReduceOp.PRODUCT, "min": dist.ReduceOp.MIN,
       "max": dist.ReduceOp.MAX, "avg": dist.ReduceOp.AVG}
SIZES = [0, 7, 1000]
BIG = 100_003           # large enough for the cross-memory path, odd to test chunk edges

rank = int(os.environ["RANK"])
world = int(os.environ["WORLD_SIZE"])
dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
failures, gloo_skipped = [], []
checked: dict[str, int] = {}     # "collective w<world>" -> cases checked


def fail(msg):
    if len(failures) < 200:
        failures.append(msg)


def case_of(name: str) -> str:
    """"reduce (non-root untouched) w3 float32 n7 sum" -> "reduce w3": the test that owns it."""
    coll, rest = name.split(" w", 1)
    return f"{coll.split(' (')[0]} w{rest.split()[0]}"


def inputs(seed, n, dt, op, w, start=0):
    t = torch.empty(n, dtype=dt.torch)
    fill(t, seed, start, dt, op, w)
    return t


def same(name, got_ws, got_gloo, expect):
    checked[case_of(name)] = checked.get(case_of(name), 0) + 1
    if not torch.equal(got_ws, expect):
        bad = (got_ws != expect).nonzero()[:3].flatten().tolist()
        fail(f"{name}: wirespeed differs from the exact result at {bad}: "
             f"{got_ws.flatten()[bad].tolist()} vs {expect.flatten()[bad].tolist()}")
    if got_gloo is not None and not torch.equal(got_ws, got_gloo):
        fail(f"{name}: wirespeed differs from gloo")


def on_both(fn, ws, gl):
    """fn(group) on wirespeed, then on gloo; gloo may not support a case (None then)."""
    a = fn(ws)
    try:
        b = fn(gl)
    except RuntimeError as e:
        gloo_skipped.append(str(e).splitlines()[0][:80])
        b = None
    return a, b


def grid(ws, gl, me, w, dtypes, sizes):
    for dname in dtypes:
        dt = DTYPES[dname]
        for n in sizes:
            for opname, op in OPS.items():
                name = f"w{w} {dname} n{n} {opname}"
                # all_reduce
                # blocking calls run inline in the backend, async ones go through the engine's
                # worker and a Work: both forms are checked throughout the grid
                def ar(g):
                    t = inputs(me, n, dt, opname, w)
                    dist.all_reduce(t, op=op, group=g)
                    t2 = inputs(me, n, dt, opname, w)
                    dist.all_reduce(t2, op=op, group=g, async_op=True).wait()
                    return torch.cat([t, t2])
                a, b = on_both(ar, ws, gl)
                exp = reduce_values(range(w), 0, n, dt, opname, w)
                same("all_reduce " + name, a, b, torch.cat([exp, exp]))
                # reduce onto the last rank
                root = w - 1
                def rd(g):
                    t = inputs(me, n, dt, opname, w)
                    dist.reduce(t, dst=dist.get_global_rank(g, root), op=op, group=g)
                    return t
                a, b = on_both(rd, ws, gl)
                if me == root:
                    same("reduce " + name, a, b, reduce_values(range(w), 0, n, dt, opname, w))
                else:
                    same("reduce (non-root untouched) " + name, a, None, inputs(me, n, dt, opname, w))
                # reduce_scatter, tensor and list forms
                def rs(g):
                    src = inputs(me, n * w, dt, opname, w)
                    out = torch.empty(n, dtype=dt.torch)
                    dist.reduce_scatter_tensor(out, src, op=op, group=g)
                    out2 = torch.empty(n, dtype=dt.torch)
                    dist.reduce_scatter(out2, list(src.chunk(w)) if n else [src[:0]] * w, op=op, group=g,
                                        async_op=True).wait()
                    return torch.cat([out, out2])
                a, b = on_both(rs, ws, gl)
                exp = reduce_values(range(w), me * n, n, dt, opname, w)
                same("reduce_scatter " + name, a, b, torch.cat([exp, exp]))
            # copies: all_gather (tensor + list), broadcast, all_to_all (even, uneven, list), gather, scatter
            name = f"w{w} {dname} n{n}"
            mine = inputs(me, n, dt, None, w)
            def ag(g):
                out = torch.empty(n * w, dtype=dt.torch)
                dist.all_gather_into_tensor(out, mine, group=g)
                outs = [torch.empty(n, dtype=dt.torch) for _ in range(w)]
                dist.all_gather(outs, mine, group=g, async_op=True).wait()
                return torch.cat([out, *outs])
            a, b = on_both(ag, ws, gl)
            exp = torch.cat([inputs(r, n, dt, None, w) for r in range(w)])
            same("all_gather " + name, a, b, torch.cat([exp, exp]))
            def bc(g):
                t = mine.clone()
                dist.broadcast(t, src=dist.get_global_rank(g, w // 2), group=g)
                return t
            a, b = on_both(bc, ws, gl)
            same("broadcast " + name, a, b, inputs(w // 2, n, dt, None, w))
            # all_to_all: rank r sends (j + r + n) % 5 rows of 3 elements to rank j (uneven splits)
            splits_in = [(j + me + n) % 5 for j in range(w)]
            splits_out = [(me + j + n) % 5 for j in range(w)]
            src = inputs(me, 3 * sum(splits_in), dt, None, w).view(-1, 3)
            def a2a(g):
                out = torch.empty(sum(splits_out), 3, dtype=dt.torch)
                dist.all_to_all_single(out, src, splits_out, splits_in, group=g)
                even_in = inputs(me, n * w, dt, None, w)
                even_out = torch.empty(n * w, dtype=dt.torch)
                dist.all_to_all_single(even_out, even_in, group=g)
                outs = [torch.empty(n, dtype=dt.torch) for _ in range(w)]
                dist.all_to_all(outs, list(even_in.chunk(w)) if n else [even_in[:0]] * w, group=g,
                                async_op=True).wait()
                return torch.cat([out.flatten(), even_out, *outs])
            a, b = on_both(a2a, ws, gl)
            parts = []
            for j in range(w):
                offs = sum((k + j + n) % 5 for k in range(me))  # where j's piece for me starts
                parts.append(to_dtype(rank_values(j, 3 * offs, 3 * splits_out[j], dt, None, w), dt))
            even = torch.cat([to_dtype(rank_values(j, me * n, n, dt, None, w), dt) for j in range(w)])
            same("all_to_all " + name, a, b, torch.cat([*parts, even, even]))
            def ga(g):
                dst = dist.get_global_rank(g, 0)
                outs = [torch.empty(n, dtype=dt.torch) for _ in range(w)] if me == 0 else None
                dist.gather(mine, outs, dst=dst, group=g)
                t = torch.empty(n, dtype=dt.torch)
                ins = [inputs(100 + r, n, dt, None, w) for r in range(w)] if me == 0 else None
                dist.scatter(t, ins, src=dst, group=g)
                return torch.cat([*(outs or []), t])
            a, b = on_both(ga, ws, gl)
            exp = [exp] if me == 0 else []
            same("gather/scatter " + name, a, b, torch.cat([*exp, inputs(100 + me, n, dt, None, w)]))
            # send/recv around the ring, and barrier
            if w > 1:
                def p2p(g):
                    nxt = dist.get_global_rank(g, (me + 1) % w)
                    prv = dist.get_global_rank(g, (me - 1) % w)
                    got = torch.empty(n, dtype=dt.torch)
                    reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, mine, nxt, g),
                                                   dist.P2POp(dist.irecv, got, prv, g)])
                    for q in reqs:
                        q.wait()
                    dist.barrier(group=g)
                    dist.barrier(group=g, async_op=True).wait()
                    return got
                a, b = on_both(p2p, ws, gl)
                same("send/recv " + name, a, b, inputs((me - 1) % w, n, dt, None, w))


try:
    all_dtypes = list(DTYPES)
    for w in sorted({w for w in (1, 2, 3, 4, 5) if w <= world} | {world}):
        members = list(range(w))
        ws = dist.new_group(members, backend="wirespeed")
        gl = dist.new_group(members, backend="gloo")
        if rank < w:
            grid(ws, gl, rank, w, all_dtypes, SIZES)
            grid(ws, gl, rank, w, ["float32", "bfloat16"], [BIG])
    dist.barrier()
except Exception:  # noqa: BLE001 - reported to the test
    fail(traceback.format_exc())
report({"rank": rank, "failures": failures, "checked": checked,
        "gloo_skipped": sorted(set(gloo_skipped)), "gloo_skip_count": len(gloo_skipped)})
os._exit(0)
