"""Every way torch reaches a process-group backend, driven as torch's own callers drive it, with the
inputs as temporaries dropped before the wait and the allocator churned in between.

Each case issues a few ops of several sizes and dtypes, drops what a caller like DTensor or FSDP
would drop (the temporary input; the Work, where torch keeps it itself), fills freshly allocated
tensors with garbage (likely the freed inputs' memory), then waits and checks: every result against
the collective's definition, and every garbage tensor untouched (an engine writing into freed memory
shows up there). Rank 1 starts each case late, so the others' ops sit queued while their inputs'
memory is freed and reused.

A case returns a list of problems (empty when right). CASES is shared by worker_entry_paths.py and
test_entry_paths.py, so each case is one named test.
"""
from __future__ import annotations

import time
import warnings
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

F = torch.ops._c10d_functional
# torch 2.6+ names; the older names (still what some callers use) are the same ops.
_rs_single = getattr(funcol, "reduce_scatter_single", None) or funcol.reduce_scatter_tensor
_ag_single = getattr(funcol, "all_gather_single", None) or funcol.all_gather_tensor
_rs_coalesced = getattr(funcol, "reduce_scatter_single_coalesced", None) or funcol.reduce_scatter_tensor_coalesced
_ag_coalesced = getattr(funcol, "all_gather_single_coalesced", None) or funcol.all_gather_into_tensor_coalesced
GARBAGE = -7
SIZES = (1, 300, 16_384)               # elements per rank's piece: inline, staged and read-in-place sizes
DTYPES = (torch.float32, torch.bfloat16, torch.int64)


class Ctx:
    def __init__(self, rank: int, world: int, group):
        self.rank, self.world, self.group = rank, world, group
        self.backend = dist.get_backend(group)
        self.name = group.group_name
        self._junk: list[torch.Tensor] = []
        self.problems: list[str] = []

    def late(self):
        if self.rank == 1:
            time.sleep(0.05)

    def churn(self):
        """Allocate and fill tensors of the sizes just freed: the memory an engine still using a
        dropped input would read or write."""
        for n in SIZES:
            for dt in DTYPES:
                for _ in range(3):
                    self._junk.append(torch.full((n * self.world,), GARBAGE, dtype=dt))
                    self._junk.append(torch.full((n,), GARBAGE, dtype=dt))

    def junk_intact(self):
        for j in self._junk:
            if not bool((j == GARBAGE).all()):
                self.problems.append(f"a tensor allocated after the inputs were dropped was written "
                                     f"({j.numel()} x {j.dtype})")
                break
        self._junk = []

    def same(self, what: str, got: torch.Tensor, want: torch.Tensor):
        if got.shape != want.shape or got.dtype != want.dtype or not torch.equal(got, want):
            bad = "shape" if got.shape != want.shape else int((got != want).sum())
            self.problems.append(f"{what}: wrong ({bad} elements differ)" if bad != "shape"
                                 else f"{what}: shape {tuple(got.shape)}, want {tuple(want.shape)}")


def data(rank: int, n: int, dtype, salt: int = 0) -> torch.Tensor:
    """Rank `rank`'s input: small integers (exact in every dtype, sums included)."""
    return ((torch.arange(n, dtype=torch.int64) * 7 + rank * 5 + salt) % 23 - 11).to(dtype)


def grid():
    for n in SIZES:
        for dt in DTYPES:
            yield n, dt, f"{n}x{str(dt).split('.')[-1]}"


def total(world, n, dt, salt=0):
    return sum(data(r, n, dt, salt) for r in range(world)).to(dt)


# ---- torch.distributed's public calls, async, inputs dropped ----

def dist_all_reduce(c: Ctx):
    c.late()
    kept = []
    for n, dt, tag in grid():
        x = data(c.rank, n, dt)
        w = dist.all_reduce(x, group=c.group, async_op=True)
        dist.all_reduce(data(c.rank, n, dt, 1), group=c.group, async_op=True)   # temporary, Work dropped
        kept.append((tag, x, w, total(c.world, n, dt)))
    c.churn()
    for tag, x, w, want in kept:
        w.wait()
        c.same(f"all_reduce {tag}", x, want)


def issued(c: Ctx, what: str, issue):
    """`issue(n, dt)` -> (Work, outputs, expected) for every size and dtype of the grid, with the
    input a temporary; then churn, wait each Work and check its outputs (concatenated) as one."""
    c.late()
    kept = [(tag, *issue(n, dt)) for n, dt, tag in grid()]
    c.churn()
    for tag, w, outs, want in kept:
        w.wait()
        c.same(f"{what} {tag}", torch.cat(outs), want)


def mine_of(c: Ctx, t: torch.Tensor, n: int) -> torch.Tensor:
    """This rank's piece of n elements of a world-long tensor."""
    return t[c.rank * n:(c.rank + 1) * n]


def dist_reduce_scatter_tensor(c: Ctx):
    def issue(n, dt):
        out = torch.empty(n, dtype=dt)
        w = dist.reduce_scatter_tensor(out, data(c.rank, n * c.world, dt), group=c.group, async_op=True)
        return w, [out], mine_of(c, total(c.world, n * c.world, dt), n)
    issued(c, "reduce_scatter_tensor", issue)


def dist_all_gather_into_tensor(c: Ctx):
    def issue(n, dt):
        out = torch.empty(n * c.world, dtype=dt)
        w = dist.all_gather_into_tensor(out, data(c.rank, n, dt), group=c.group, async_op=True)
        return w, [out], torch.cat([data(r, n, dt) for r in range(c.world)])
    issued(c, "all_gather_into_tensor", issue)


def dist_all_gather_list(c: Ctx):
    def issue(n, dt):
        outs = [torch.empty(n, dtype=dt) for _ in range(c.world)]
        w = dist.all_gather(outs, data(c.rank, n, dt), group=c.group, async_op=True)
        return w, outs, torch.cat([data(r, n, dt) for r in range(c.world)])
    issued(c, "all_gather", issue)


def dist_reduce_scatter_list(c: Ctx):
    def issue(n, dt):
        out = torch.empty(n, dtype=dt)
        w = dist.reduce_scatter(out, list(data(c.rank, n * c.world, dt).chunk(c.world)), group=c.group,
                                async_op=True)
        return w, [out], mine_of(c, total(c.world, n * c.world, dt), n)
    issued(c, "reduce_scatter", issue)


def dist_all_to_all_single(c: Ctx):
    def issue(n, dt):
        out = torch.empty(n * c.world, dtype=dt)
        w = dist.all_to_all_single(out, data(c.rank, n * c.world, dt), group=c.group, async_op=True)
        return w, [out], torch.cat([mine_of(c, data(r, n * c.world, dt), n) for r in range(c.world)])
    issued(c, "all_to_all_single", issue)


def dist_all_to_all_list(c: Ctx):
    def issue(n, dt):
        outs = [torch.empty(n, dtype=dt) for _ in range(c.world)]
        w = dist.all_to_all(outs, list(data(c.rank, n * c.world, dt).chunk(c.world)), group=c.group,
                            async_op=True)
        return w, outs, torch.cat([mine_of(c, data(r, n * c.world, dt), n) for r in range(c.world)])
    issued(c, "all_to_all", issue)


def dist_broadcast_and_reduce(c: Ctx):
    c.late()
    kept = []
    root = c.world - 1
    for n, dt, tag in grid():
        b = data(c.rank, n, dt)
        wb = dist.broadcast(b, src=root, group=c.group, async_op=True)
        dist.broadcast(data(c.rank, n, dt, 2), src=0, group=c.group, async_op=True)  # temporary, dropped
        r = data(c.rank, n, dt, 3)
        wr = dist.reduce(r, dst=root, group=c.group, async_op=True)
        kept.append((tag, b, wb, data(root, n, dt), r, wr, total(c.world, n, dt, 3) if c.rank == root
                     else data(c.rank, n, dt, 3)))
    c.churn()
    for tag, b, wb, bwant, r, wr, rwant in kept:
        wb.wait()
        wr.wait()
        c.same(f"broadcast {tag}", b, bwant)
        if c.rank == root:
            c.same(f"reduce {tag}", r, rwant)


def dist_gather_scatter(c: Ctx):
    c.late()
    kept = []
    root = 0
    for n, dt, tag in grid():
        outs = [torch.empty(n, dtype=dt) for _ in range(c.world)] if c.rank == root else None
        wg = dist.gather(data(c.rank, n, dt), outs, dst=root, group=c.group, async_op=True)
        so = torch.empty(n, dtype=dt)
        ins = list(data(root, n * c.world, dt, 4).chunk(c.world)) if c.rank == root else None
        ws = dist.scatter(so, ins, src=root, group=c.group, async_op=True)
        del ins
        kept.append((tag, n, dt, outs, wg, so, ws))
    c.churn()
    for tag, n, dt, outs, wg, so, ws in kept:
        wg.wait()
        ws.wait()
        if c.rank == root:
            c.same(f"gather {tag}", torch.cat(outs), torch.cat([data(r, n, dt) for r in range(c.world)]))
        c.same(f"scatter {tag}", so, data(root, n * c.world, dt, 4)[c.rank * n:(c.rank + 1) * n])


def dist_send_recv(c: Ctx):
    c.late()
    kept = []
    to, frm = (c.rank + 1) % c.world, (c.rank - 1) % c.world
    sends = []
    for n, dt, tag in grid():
        # A temporary, and its Work dropped, as a fire-and-forget sender does. gloo cancels a send
        # whose Work is dropped, so there (the control) the Works are kept.
        w = dist.isend(data(c.rank, n, dt, 5), dst=to, group=c.group)
        if c.backend == "gloo":
            sends.append(w)
        del w
        got = torch.empty(n, dtype=dt)
        kept.append((tag, got, dist.irecv(got, src=frm, group=c.group), data(frm, n, dt, 5)))
    c.churn()
    for tag, got, w, want in kept:
        w.wait()
        c.same(f"isend/irecv {tag}", got, want)
    dist.barrier(group=c.group)     # every send taken before the next case


def dist_sync_strided(c: Ctx):
    """The blocking calls on views whose elements are not one run (transposed, stepped)."""
    for n, dt, tag in grid():
        m = max(n // 4, 1)
        x = data(c.rank, 2 * m * c.world, dt).reshape(2, m * c.world).t()     # (m*world, 2), not contiguous
        dist.all_reduce(x, group=c.group)
        c.same(f"all_reduce transposed {tag}", x, total(c.world, 2 * m * c.world, dt).reshape(2, m * c.world).t())
        out = torch.empty(2, m * c.world, dtype=dt).t()
        dist.all_gather_into_tensor(out, data(c.rank, 2 * m, dt).reshape(2, m).t(), group=c.group)
        want = torch.cat([data(r, 2 * m, dt).reshape(2, m).t() for r in range(c.world)])
        c.same(f"all_gather_into_tensor transposed {tag}", out, want)
        big = data(c.rank, 2 * m * c.world, dt)[::2]
        rs = torch.empty(m, dtype=dt)
        dist.reduce_scatter_tensor(rs, big, group=c.group)
        c.same(f"reduce_scatter_tensor stepped {tag}", rs,
               total(c.world, 2 * m * c.world, dt)[::2][c.rank * m:(c.rank + 1) * m])


def pg_methods(c: Ctx):
    """The ProcessGroup's own methods, in each of torch's overloads (options; a list and an op; one
    tensor and an op; one tensor and a root; a timeout), blocking and not, as DDP's C++ reducer and
    hand-written callers use them: the wirespeed group runs some straight on its backend, and must
    pass the others to torch's binding whole."""
    pg = c.group
    ops = ((dist.ReduceOp.SUM, lambda ts: sum(ts)), (dist.ReduceOp.MAX, lambda ts: torch.stack(ts).amax(0)))

    def waited(w):
        if w is not None:        # a blocking call may complete inline and return None
            w.wait()

    for n, dt, tag in grid():
        ins = [data(r, n, dt) for r in range(c.world)]
        for op, want_of in ops:
            want = want_of(ins).to(dt)
            for blocking in (True, False):
                opts = dist.AllreduceOptions()
                opts.reduceOp, opts.asyncOp = op, not blocking
                x = data(c.rank, n, dt)
                waited(pg.allreduce([x], opts))
                c.same(f"pg.allreduce([t], opts) {op} blocking={blocking} {tag}", x, want)
            x = data(c.rank, n, dt)
            waited(pg.allreduce([x], op))
            c.same(f"pg.allreduce([t], op) {op} {tag}", x, want)
            x = data(c.rank, n, dt)
            waited(pg.allreduce(x, op))
            c.same(f"pg.allreduce(t, op) {op} {tag}", x, want)
        x = data(c.rank, n, dt, 3)
        waited(pg.broadcast(x, c.world - 1))
        c.same(f"pg.broadcast(t, root) {tag}", x, data(c.world - 1, n, dt, 3))
    waited(pg.barrier(timedelta(seconds=30)))


# ---- _coalescing_manager (what FSDP1 and DDP's coalesced paths use) ----

def coalescing_manager(c: Ctx):
    c.late()
    for n, dt, tag in grid():
        ars = [data(c.rank, n, dt, k) for k in range(3)]
        rs_out = [torch.empty(n, dtype=dt) for _ in range(2)]
        ag_out = [torch.empty(n * c.world, dtype=dt) for _ in range(2)]
        with dist._coalescing_manager(group=c.group, async_ops=True) as cm:
            for t in ars:
                dist.all_reduce(t, group=c.group)
        cm.wait()
        for k, t in enumerate(ars):
            c.same(f"coalesced all_reduce {tag} #{k}", t, total(c.world, n, dt, k))
        with dist._coalescing_manager(group=c.group, async_ops=True) as cm:
            for k, o in enumerate(rs_out):
                dist.reduce_scatter_tensor(o, data(c.rank, n * c.world, dt, k))
        c.churn()
        cm.wait()
        for k, o in enumerate(rs_out):
            c.same(f"coalesced reduce_scatter_tensor {tag} #{k}", o,
                   total(c.world, n * c.world, dt, k)[c.rank * n:(c.rank + 1) * n])
        with dist._coalescing_manager(group=c.group, async_ops=True) as cm:
            for k, o in enumerate(ag_out):
                dist.all_gather_into_tensor(o, data(c.rank, n, dt, k))
        c.churn()
        cm.wait()
        for k, o in enumerate(ag_out):
            c.same(f"coalesced all_gather_into_tensor {tag} #{k}", o,
                   torch.cat([data(r, n, dt, k) for r in range(c.world)]))


# ---- torch.ops._c10d_functional, waited later with wait_tensor (DTensor's route) ----

def c10d_functional(c: Ctx):
    c.late()
    pend = []
    w, g = c.world, c.name
    for n, dt, tag in grid():
        pend.append((f"all_reduce {tag}", F.all_reduce(data(c.rank, n, dt) * 1, "sum", g), total(w, n, dt)))
        pend.append((f"reduce_scatter_tensor {tag}", F.reduce_scatter_tensor(data(c.rank, n * w, dt) * 1, "sum", w, g),
                     total(w, n * w, dt)[c.rank * n:(c.rank + 1) * n]))
        pend.append((f"all_gather_into_tensor {tag}", F.all_gather_into_tensor(data(c.rank, n, dt) * 1, w, g),
                     torch.cat([data(r, n, dt) for r in range(w)])))
        pend.append((f"all_to_all_single {tag}", F.all_to_all_single(data(c.rank, n * w, dt) * 1, [n] * w, [n] * w, g),
                     torch.cat([data(r, n * w, dt)[c.rank * n:(c.rank + 1) * n] for r in range(w)])))
        pend.append((f"broadcast {tag}", F.broadcast(data(c.rank, n, dt) * 1, 0, g), data(0, n, dt)))
        for k, t in enumerate(F.all_reduce_coalesced([data(c.rank, n, dt, s) * 1 for s in range(2)], "sum", g)):
            pend.append((f"all_reduce_coalesced {tag} #{k}", t, total(w, n, dt, k)))
        for k, t in enumerate(F.all_gather_into_tensor_coalesced([data(c.rank, n, dt, s) * 1 for s in range(2)], w, g)):
            pend.append((f"all_gather_into_tensor_coalesced {tag} #{k}", t,
                         torch.cat([data(r, n, dt, k) for r in range(w)])))
        for k, t in enumerate(F.reduce_scatter_tensor_coalesced([data(c.rank, n * w, dt, s) * 1 for s in range(2)],
                                                                "sum", w, g)):
            pend.append((f"reduce_scatter_tensor_coalesced {tag} #{k}", t,
                         total(w, n * w, dt, k)[c.rank * n:(c.rank + 1) * n]))
    c.churn()
    for what, t, want in reversed(pend):     # waited in the other order than issued
        F.wait_tensor(t)
    for what, t, want in pend:
        c.same(what, t, want)


# ---- torch.distributed._functional_collectives (funcol; DTensor, TP, FSDP2 call these) ----

def funcol_calls(c: Ctx):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)    # the deprecated names are exercised too
        _funcol_calls(c)


def _funcol_calls(c: Ctx):
    c.late()
    pend = []
    w, g = c.world, c.group
    for n, dt, tag in grid():
        m = max(n // 2, 1)
        a = lambda s=0: data(c.rank, 2 * m * w, dt, s).reshape(2, m * w)     # noqa: E731
        every = [data(r, 2 * m * w, dt).reshape(2, m * w) for r in range(w)]
        pend.append((f"reduce_scatter_single dim 1 {tag}", _rs_single(a(), "sum", 1, g),
                     sum(every).to(dt)[:, c.rank * m:(c.rank + 1) * m]))
        pend.append((f"reduce_scatter_tensor dim 0 {tag}", funcol.reduce_scatter_tensor(a().t(), "sum", 0, g),
                     sum(every).to(dt).t()[c.rank * m:(c.rank + 1) * m]))
        pend.append((f"all_gather_single dim 1 {tag}", _ag_single(a()[:, :m], 1, g),
                     torch.cat([e[:, :m] for e in every], 1)))
        pend.append((f"all_gather_tensor dim 0 {tag}", funcol.all_gather_tensor(a().t()[:m], 0, g),
                     torch.cat([e.t()[:m] for e in every], 0)))
        pend.append((f"broadcast {tag}", funcol.broadcast(a(), w - 1, g), every[w - 1]))
        ring = [(i + 1) % w for i in range(w)]      # rank i sends to ring[i]
        pend.append((f"permute_tensor {tag}", funcol.permute_tensor(a().reshape(-1), ring, g),
                     every[(c.rank - 1) % w].reshape(-1)))
        pend.append((f"all_reduce {tag}", funcol.all_reduce(a(), "sum", g), sum(every).to(dt)))
        pend.append((f"all_to_all_single {tag}", funcol.all_to_all_single(a().t().contiguous(), None, None, g),
                     torch.cat([e.t()[c.rank * m:(c.rank + 1) * m] for e in every])))
        for k, t in enumerate(_rs_coalesced([a(s) for s in range(2)], "sum", [1, 1], g)):
            want = sum(data(r, 2 * m * w, dt, k).reshape(2, m * w) for r in range(w)).to(dt)
            pend.append((f"reduce_scatter_tensor_coalesced dim 1 {tag} #{k}", t, want[:, c.rank * m:(c.rank + 1) * m]))
        for k, t in enumerate(_ag_coalesced([a(s)[:, :m].contiguous() for s in range(2)], g)):
            want = torch.cat([data(r, 2 * m * w, dt, k).reshape(2, m * w)[:, :m] for r in range(w)])
            pend.append((f"all_gather_into_tensor_coalesced {tag} #{k}", t, want))
        for k, t in enumerate(funcol.all_reduce_coalesced([a(s) for s in range(2)], "sum", g)):
            pend.append((f"all_reduce_coalesced {tag} #{k}", t,
                         sum(data(r, 2 * m * w, dt, k).reshape(2, m * w) for r in range(w)).to(dt)))
    c.churn()
    for what, t, want in pend:
        got = t.wait() if isinstance(t, funcol.AsyncCollectiveTensor) else t
        c.same(what, got, want)


CASES = {
    "dist.all_reduce[async]": dist_all_reduce,
    "dist.reduce_scatter_tensor[async]": dist_reduce_scatter_tensor,
    "dist.all_gather_into_tensor[async]": dist_all_gather_into_tensor,
    "dist.all_gather[async]": dist_all_gather_list,
    "dist.reduce_scatter[async]": dist_reduce_scatter_list,
    "dist.all_to_all_single[async]": dist_all_to_all_single,
    "dist.all_to_all[async]": dist_all_to_all_list,
    "dist.broadcast+reduce[async]": dist_broadcast_and_reduce,
    "dist.gather+scatter[async]": dist_gather_scatter,
    "dist.isend+irecv": dist_send_recv,
    "dist.*[sync,strided]": dist_sync_strided,
    "ProcessGroup methods[overloads]": pg_methods,
    "_coalescing_manager": coalescing_manager,
    "_c10d_functional+wait_tensor": c10d_functional,
    "_functional_collectives": funcol_calls,
}


def run_case(name: str, rank: int, world: int, group) -> list[str]:
    c = Ctx(rank, world, group)
    CASES[name](c)
    c.junk_intact()
    return c.problems
