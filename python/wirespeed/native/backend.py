"""The wirespeed torch.distributed backend: a `torch._C._distributed_c10d.Backend` subclass (torch's
route for a backend written in Python), one per group, over one native engine (wirespeed._native).

torch wraps it in a ProcessGroup (see process_group.py), so everything built on a named backend
with device types works: group names, DeviceMesh, DTensor, FSDP2, functional collectives, splits.

A call torch will wait on at once (opts.asyncOp False, i.e. async_op=False) runs inline in the
caller's thread and returns None, as torch allows for a backend that completed the op already; an
async call is queued and returns a Work. The engine runs ops in order, in the background or
inline in whichever thread waits first, with the GIL released.

Every native call hands the engine what owns the memory behind its addresses (`keep`, the
argument after the op's own: the tensors, or the Staging's list of them and of its copies); the engine holds it until the op can
no longer touch it, whatever happens to the Work (docs/architecture.md, "Who owns a buffer").
"""
from __future__ import annotations

from datetime import timedelta

import torch

from . import monitored
from .anysource import Announcer, AnySourceWork
from .errors import UnsupportedError
from .observe import Ledger, instrument
from .rendezvous import rendezvous
from .tensors import REDUCE_DTYPES, SUM, Staging, buf, check, nbytes, reduction
from .work import FutureCompleter, Work

_C10dBackend = torch._C._distributed_c10d.Backend
NAME = "wirespeed"


def _one(tensors, what: str) -> torch.Tensor:
    if len(tensors) != 1:
        raise UnsupportedError(f"wirespeed: {what} takes exactly one tensor per rank, got {len(tensors)}")
    return tensors[0]


def _blocking(opts) -> bool:
    return opts is not None and not getattr(opts, "asyncOp", True)


def _dense(a, b) -> bool:
    """Both tensors on the CPU, strided and contiguous: what the flat native ops take as they are."""
    return (a.is_cpu and b.is_cpu and a.layout is torch.strided and b.layout is torch.strided
            and a.is_contiguous() and b.is_contiguous())


class WirespeedBackend(_C10dBackend):
    def __init__(self, native, store, rank: int, size: int, timeout: timedelta):
        super().__init__(rank, size)
        self.native = native               # wirespeed._native.Group
        self.store = store                 # this group's (prefixed) torch store
        self.timeout = timeout
        self._rank, self._size = rank, size
        # Bound once: the fast paths' native calls.
        self._all_reduce = native.all_reduce
        self._reduce_scatter_flat = native.reduce_scatter_flat
        self._all_gather_flat = native.all_gather_flat
        self._options = _C10dBackend.Options(NAME, timeout)
        self._futures = FutureCompleter()
        self._announcer = Announcer(store, rank)
        self.received: dict[int, int] = {}     # messages received per peer (any-source bookkeeping)
        self.anysource_used = False
        self._monitored_seq = 0
        self._ledger = Ledger(store, rank, size)   # profiler spans, op numbers, failure reports

    # ---- identity and capabilities (torch reads these through the C++ Backend) ----
    def getBackendName(self):
        return NAME

    @property
    def options(self):
        return self._options

    # Each capability torch asks about is answered here: torch's trampoline reads a property it
    # finds on the class and would recurse into itself on the inherited C++ one.
    supports_splitting = property(lambda self: True)
    supports_coalescing = property(lambda self: False)
    supports_shrinking = property(lambda self: False)
    supports_reconfigure = property(lambda self: False)
    supports_window = property(lambda self: False)
    _supports_time_estimate = property(lambda self: False)

    def shutdown(self):
        from .admission import unwatch
        unwatch(self.native)
        self._ledger.closed = True
        self._announcer.close()
        self.native.close()

    abort = shutdown

    # ---- running ops ----
    def _peer(self, r, what: str) -> int:
        if not isinstance(r, int) or isinstance(r, bool) or not 0 <= r < self._size:
            raise UnsupportedError(f"wirespeed: {what} rank {r} is not in this group of {self._size} "
                                   f"(valid: 0 to {self._size - 1})")
        return r

    def _run(self, opts, call, args, result, st: Staging):
        """Run one native op over the Staging's buffers (which the engine keeps): inline when torch
        waits at once (returns None), else queued (a Work that copies staged results back)."""
        if _blocking(opts):
            call(*args, st.keep, True)
            st.finish()
            return None
        return self._work(call(*args, st.keep), result, st)

    def _work(self, op_id: int, result, st: Staging) -> Work:
        return Work(self.native, [op_id], result, st.finish if st.back else None, self._futures)

    def _world_times(self, big, big_name: str, small, small_name: str) -> None:
        """Refuse a tensor that must hold one `small` per rank and does not."""
        if big.numel() != small.numel() * self._size:
            raise UnsupportedError(f"wirespeed: {big_name} holds {big.numel()} elements; it must hold "
                                   f"world size x {small_name} = {self._size * small.numel()}")

    def _per_rank(self, whole, n: int) -> list:
        """`whole`, flat, as one run of `n` elements per rank, in rank order."""
        whole = whole.reshape(-1)
        return [whole[r * n:(r + 1) * n] for r in range(self._size)]

    def _flat(self, opts, call, args, input, output):
        """A fast path's native op over two dense CPU tensors (both kept by the engine): inline
        when torch waits at once (None), else its Work."""
        if not opts.asyncOp:
            call(*args, (input, output), True)
            return None
        return Work(self.native, [call(*args, (input, output))], [output], None, self._futures)

    def _many(self, opts, issue, items, result):
        """Several ops under one Work (coalesced calls); None when they all ran inline."""
        works = [issue(*it) for it in items]
        if _blocking(opts):
            return None
        if not works:
            return Work(self.native, [], result, None, self._futures)
        return Work.joined(works, result, self._futures)

    # ---- reductions ----
    def allreduce(self, tensors, opts):
        # The single contiguous tensor summed is the latency benchmark and the common case (DDP's
        # buckets too): keep its path to a handful of attribute reads (each costs ~0.1-0.2 us on a
        # pybind object), blocking or not.
        if len(tensors) == 1:
            t = tensors[0]
            code = REDUCE_DTYPES.get(t.dtype)
            if (code is not None and opts.reduceOp == SUM and t.is_cpu and t.layout is torch.strided
                    and t.is_contiguous()):
                if not opts.asyncOp:
                    self._all_reduce(t.data_ptr(), t.numel(), code, 0, t, True)
                    return None
                return Work(self.native, [self._all_reduce(t.data_ptr(), t.numel(), code, 0, t)], tensors,
                            None, self._futures)
        t = _one(tensors, "allreduce")
        return self._allreduce_one(t, opts, "the all_reduce tensor")

    def _allreduce_one(self, t, opts, what):
        check(t, what)
        dcode, ocode, factor, esize = reduction(t, opts.reduceOp, what)
        st = Staging()
        if factor is None:
            b = st.update(t)
        else:
            b = st.scaled(t, factor)
            st.result(t, b)
        return self._run(opts, self.native.all_reduce, (b.data_ptr(), nbytes(b) // esize, dcode, ocode),
                         [t], st)

    def allreduce_coalesced(self, tensors, opts):
        return self._many(opts, lambda t: self._allreduce_one(t, opts, "an all_reduce tensor"),
                          [(t,) for t in tensors], tensors)

    def allreduce_sparse(self, tensors, opts):
        raise UnsupportedError("wirespeed: sparse all_reduce is not supported; densify with tensor.to_dense()")

    def reduce(self, tensors, opts):
        t = _one(tensors, "reduce")
        check(t, "the reduce tensor")
        root = self._peer(opts.rootRank, "the reduce root")
        dcode, ocode, factor, esize = reduction(t, opts.reduceOp, "the reduce tensor")
        st = Staging()
        if factor is not None:
            b = st.scaled(t, factor)
            if self._rank == root:
                st.result(t, b)
        else:
            b = st.update(t) if self._rank == root else st.read(t)
        return self._run(opts, self.native.reduce, (b.data_ptr(), nbytes(b) // esize, dcode, ocode, root),
                         tensors, st)

    def _reduce_scatter_pieces(self, out, pieces, opts, what, st: Staging | None = None):
        """out = op over ranks of their pieces[my rank]; pieces: one tensor per rank, any layout."""
        check(out, f"the {what} output")
        dcode, ocode, factor, esize = reduction(out, opts.reduceOp, f"the {what} output")
        for p in pieces:
            check(p, f"a {what} input")
            if p.dtype != out.dtype:
                raise UnsupportedError(f"wirespeed: a {what} input has dtype {p.dtype} but the output is {out.dtype}")
            if p.numel() != out.numel():
                raise UnsupportedError(f"wirespeed: {what} inputs hold {p.numel()} elements each; each must "
                                       f"hold as many as the output ({out.numel()})")
        st = st or Staging()
        ins = [st.scaled(p, factor) if factor is not None else st.read(p) for p in pieces]
        o = st.write(out)
        return self._run(opts, self.native.reduce_scatter,
                         ([buf(i) for i in ins], o.data_ptr(), nbytes(o) // esize, dcode, ocode), [out], st)

    def reduce_scatter(self, outputs, input_lists, opts):
        out = _one(outputs, "reduce_scatter")
        ins = _one(input_lists, "reduce_scatter")
        if len(ins) != self._size:
            raise UnsupportedError(f"wirespeed: reduce_scatter takes {self._size} inputs (one per rank), got {len(ins)}")
        return self._reduce_scatter_pieces(out, ins, opts, "reduce_scatter")

    def reduce_scatter_single(self, output, input, opts):
        # reduce_scatter_tensor of contiguous tensors, summed (FSDP's gradients, the benchmark):
        # the native call lays the pieces out itself; the generic route below costs ~8 us more.
        code = REDUCE_DTYPES.get(output.dtype)
        if (code is not None and input.dtype == output.dtype and opts.reduceOp == SUM and _dense(input, output)
                and input.numel() == output.numel() * self._size):
            return self._flat(opts, self._reduce_scatter_flat,
                              (input.data_ptr(), output.data_ptr(), output.numel(), code, 0), input, output)
        check(input, "the reduce_scatter input")
        self._world_times(input, "reduce_scatter input", output, "output")
        st = Staging()
        pieces = self._per_rank(st.read(input), output.numel())
        return self._reduce_scatter_pieces(output, pieces, opts, "reduce_scatter", st)

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts):
        return self._many(opts, lambda o, i: self._raw_reduce_scatter_single(o, i, opts), list(zip(outputs, inputs)),
                          outputs)

    # ---- data movement (any dtype: bytes) ----
    def broadcast(self, tensors, opts):
        t = _one(tensors, "broadcast")
        check(t, "the broadcast tensor")
        root = self._peer(opts.rootRank, "the broadcast root")
        st = Staging()
        b = st.read(t) if self._rank == root else st.write(t)
        return self._run(opts, self.native.broadcast, (buf(b), root), tensors, st)

    def _same(self, ts, like, what):
        for t in ts:
            check(t, what)
            if t.dtype != like.dtype:
                raise UnsupportedError(f"wirespeed: {what} has dtype {t.dtype} but the input is {like.dtype}")
            if t.numel() != like.numel():
                raise UnsupportedError(f"wirespeed: {what} holds {t.numel()} elements; it must hold as many "
                                       f"as the input ({like.numel()})")

    def _gather_list(self, outs, t, opts):
        """all_gather of t into the list outs (one tensor per rank)."""
        check(t, "the all_gather input")
        if len(outs) != self._size:
            raise UnsupportedError(f"wirespeed: all_gather takes {self._size} outputs (one per rank), got {len(outs)}")
        self._same(outs, t, "an all_gather output")
        st = Staging()
        i = st.read(t)
        os_ = [st.write(o) for o in outs]
        return self._run(opts, self.native.all_gather, (buf(i), [buf(o) for o in os_]), [outs], st)

    def allgather(self, output_lists, inputs, opts):
        t = _one(inputs, "allgather")
        return self._gather_list(_one(output_lists, "allgather"), t, opts)

    def allgather_coalesced(self, output_lists, inputs, opts):
        if len(output_lists) != len(inputs):
            raise UnsupportedError(f"wirespeed: all_gather_coalesced takes one output list per input, got "
                                   f"{len(output_lists)} lists for {len(inputs)} inputs")
        return self._many(opts, lambda outs, t: self._gather_list(outs, t, opts), list(zip(output_lists, inputs)),
                          output_lists)

    def all_gather_single(self, output, input, opts):
        # all_gather_into_tensor of contiguous tensors (FSDP's parameters, the benchmark): as
        # reduce_scatter_single's fast path.
        if (input.dtype == output.dtype and _dense(input, output)
                and output.numel() == input.numel() * self._size):
            return self._flat(opts, self._all_gather_flat,
                              (input.data_ptr(), output.data_ptr(), input.numel() * input.element_size()),
                              input, output)
        check(input, "the all_gather input")
        check(output, "the all_gather output")
        if output.dtype != input.dtype:
            raise UnsupportedError(f"wirespeed: the all_gather output has dtype {output.dtype} but the input is {input.dtype}")
        self._world_times(output, "all_gather output", input, "input")
        st = Staging()
        i = st.read(input)
        o = st.write(output)
        n = nbytes(i)
        base = o.data_ptr()
        return self._run(opts, self.native.all_gather, (buf(i), [(base + r * n, n) for r in range(self._size)]),
                         [output], st)

    def all_gather_single_coalesced(self, outputs, inputs, opts):
        return self._many(opts, lambda o, i: self._raw_all_gather_single(o, i, opts), list(zip(outputs, inputs)),
                          outputs)

    def _root_list(self, lists, like, root, what: str, kind: str):
        """The root's list of one tensor per rank, each like `like` (gather's outputs, scatter's
        inputs); empty on the other ranks."""
        if self._rank != root:
            return []
        ts = _one(lists, what)
        if len(ts) != self._size:
            raise UnsupportedError(f"wirespeed: {what} takes {self._size} {kind}s on the root, got {len(ts)}")
        self._same(ts, like, f"a {what} {kind}")
        return ts

    def _rooted(self, mine, roots, opts, what: str, my_kind: str, root_kind: str):
        """A gather's or a scatter's tensor on every rank, its root, and the root's list of
        world-size tensors like it (empty elsewhere), checked."""
        t = _one(mine, what)
        check(t, f"the {what} {my_kind}")
        root = self._peer(opts.rootRank, f"the {what} root")
        return t, root, self._root_list(roots, t, root, what, root_kind)

    def gather(self, output_lists, inputs, opts):
        t, root, outs = self._rooted(inputs, output_lists, opts, "gather", "input", "output")
        st = Staging()
        i = st.read(t)
        os_ = [st.write(o) for o in outs]
        return self._run(opts, self.native.gather, (buf(i), [buf(o) for o in os_], root), output_lists, st)

    def gather_single(self, output, input, opts):
        """gather_into_tensor: the root's output holds every rank's input, in rank order."""
        check(output, "the gather output")
        if self._rank == self._peer(opts.rootRank, "the gather root"):
            self._world_times(output, "gather output", input, "input")
            st = Staging()
            work = self._raw_gather([[p.view(input.shape) for p in self._per_rank(st.write(output), input.numel())]],
                                    [input], opts)
            if work is None:
                st.finish()
                return None
            return work.then(st.finish)
        return self._raw_gather([], [input], opts)

    def scatter(self, outputs, input_lists, opts):
        t, root, ins = self._rooted(outputs, input_lists, opts, "scatter", "output", "input")
        st = Staging()
        is_ = [st.read(i) for i in ins]
        o = st.write(t)
        return self._run(opts, self.native.scatter, ([buf(i) for i in is_], buf(o), root), outputs, st)

    def alltoall(self, outputs, inputs, opts):
        if len(outputs) != self._size or len(inputs) != self._size:
            raise UnsupportedError(f"wirespeed: all_to_all takes {self._size} input and output tensors "
                                   f"(one per rank), got {len(inputs)} and {len(outputs)}")
        for t in list(inputs) + list(outputs):
            check(t, "an all_to_all tensor")
            if t.dtype != inputs[0].dtype:
                raise UnsupportedError(f"wirespeed: an all_to_all tensor has dtype {t.dtype} but the first "
                                       f"input is {inputs[0].dtype}")
        st = Staging()
        is_ = [st.read(i) for i in inputs]
        os_ = [st.write(o) for o in outputs]
        return self._run(opts, self.native.all_to_all, ([buf(i) for i in is_], [buf(o) for o in os_]), outputs, st)

    def all_to_all_single(self, output, input, output_splits, input_splits, opts):
        check(input, "the all_to_all input")
        check(output, "the all_to_all output")
        if output.dtype != input.dtype:
            raise UnsupportedError(f"wirespeed: the all_to_all output has dtype {output.dtype} but the input is {input.dtype}")
        w = self._size
        st = Staging()
        i = st.read(input)
        o = st.write(output)

        def pieces(t, splits, what):
            if t.dim() == 0:
                raise UnsupportedError(f"wirespeed: all_to_all {what} must have at least one dimension")
            row = (t.numel() // t.shape[0] if t.shape[0] else 0) * t.element_size()
            if not splits:
                if t.shape[0] % w:
                    raise UnsupportedError(f"wirespeed: all_to_all {what}'s first dimension ({t.shape[0]}) "
                                           f"must divide by the world size {w}, or pass split sizes")
                splits = [t.shape[0] // w] * w
            if len(splits) != w or sum(splits) != t.shape[0]:
                raise UnsupportedError(f"wirespeed: all_to_all {what} split sizes {list(splits)} must be "
                                       f"{w} numbers summing to {t.shape[0]}")
            out, off = [], t.data_ptr()
            for s in splits:
                out.append((off, s * row))
                off += s * row
            return out

        send = pieces(i, list(input_splits), "input")
        recv = pieces(o, list(output_splits), "output")
        return self._run(opts, self.native.all_to_all, (send, recv), [output], st)

    # ---- synchronization ----
    def barrier(self, opts):
        if _blocking(opts):
            self.native.barrier(blocking=True)
            return None
        return Work(self.native, [self.native.barrier()], [], None, self._futures)

    def monitored_barrier(self, opts, wait_all_ranks=False):
        timeout = opts.timeout if opts.timeout.total_seconds() > 0 else self.timeout
        self._monitored_seq += 1
        monitored.monitored_barrier(self.store, self._rank, self._size, self._monitored_seq, timeout,
                                    wait_all_ranks)

    # ---- point to point ----
    def _tag(self, tag) -> int:
        if tag < 0:
            raise UnsupportedError(f"wirespeed: message tag {tag} is negative; tags are 0 or more")
        return tag

    def _p2p_tensor(self, tensors, peer, kind: str):
        """The one tensor of a send or a receive, checked, with its peer (not this rank)."""
        t = _one(tensors, kind)
        check(t, f"the {kind} tensor")
        to = "send to" if kind == "send" else "receive from"
        self._peer(peer, to)
        if peer == self._rank:
            raise UnsupportedError(f"wirespeed: rank {peer} cannot {to} itself")
        return t

    def send(self, tensors, dst, tag):
        t = self._p2p_tensor(tensors, dst, "send")
        st = Staging()
        b = st.read(t)
        work = self._work(self.native.send(dst, buf(b), self._tag(tag), keep=st.keep), tensors, st)
        self._announcer.sent_one(dst, work)
        return work

    def recv(self, tensors, src, tag):
        t = self._p2p_tensor(tensors, src, "recv")
        st = Staging()
        b = st.write(t)
        op_id = self.native.recv(src, buf(b), self._tag(tag), keep=st.keep)
        self.received[src] = self.received.get(src, 0) + 1
        return self._work(op_id, tensors, st)

    def recv_anysource(self, tensors, tag):
        t = _one(tensors, "recv")
        check(t, "the recv tensor")
        st = Staging()
        b = st.write(t)
        return AnySourceWork(self, st, buf(b), self._tag(tag), tensors)

    # ---- new groups ----
    def split(self, store, ranks, opts):
        """This rank's backend for the sub-group `ranks` (ranks of this group, in the new order), or
        None when it is not a member. torch calls it on every rank of this group."""
        return self.split_ranks(store, ranks, getattr(opts, "_timeout", None))

    def split_ranks(self, store, ranks, timeout: timedelta | None):
        ranks = list(ranks)
        if self._rank not in ranks:
            return None
        timeout = timeout or self.timeout
        me = ranks.index(self._rank)
        return WirespeedBackend(rendezvous(store, me, len(ranks), timeout), store, me, len(ranks), timeout)


# Each public op as torch's tools see it (observe.py): method -> (the collective's name in spans and
# reports, point-to-point?, the argument holding its inputs, the one holding its outputs). A
# coalesced call is one op; its parts call the `_raw_` methods so that they are not counted again.
instrument(WirespeedBackend, {
    "allreduce": ("all_reduce", False, 0, None),
    "allreduce_coalesced": ("all_reduce_coalesced", False, 0, None),
    "reduce": ("reduce", False, 0, None),
    "reduce_scatter": ("reduce_scatter", False, 1, 0),
    "reduce_scatter_single": ("reduce_scatter", False, 1, 0),
    "reduce_scatter_single_coalesced": ("reduce_scatter_coalesced", False, 1, 0),
    "broadcast": ("broadcast", False, 0, None),
    "allgather": ("all_gather", False, 1, 0),
    "allgather_coalesced": ("all_gather_coalesced", False, 1, 0),
    "all_gather_single": ("all_gather", False, 1, 0),
    "all_gather_single_coalesced": ("all_gather_coalesced", False, 1, 0),
    "gather": ("gather", False, 1, 0),
    "gather_single": ("gather", False, 1, 0),
    "scatter": ("scatter", False, 1, 0),
    "alltoall": ("all_to_all", False, 1, 0),
    "all_to_all_single": ("all_to_all", False, 1, 0),
    "barrier": ("barrier", False, None, None),
    "send": ("send", True, 0, None),
    "recv": ("recv", True, None, 0),
    "recv_anysource": ("recv", True, None, 0),
})
