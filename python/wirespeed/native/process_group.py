"""The torch.distributed ProcessGroup for wirespeed: a Python subclass (torch's documented route
for out-of-tree backends) whose methods validate tensors and hand the op to the native engine.
A call torch will wait on at once (opts.asyncOp False, i.e. async_op=False) runs inline in the
caller's thread and returns None, as torch allows for backends that complete synchronously; an
async call is queued and returns a Work. The engine runs ops in order, in the background or
inline in whichever thread waits first, with the GIL released; `get_future()` is completed by one
helper thread per group.
"""
from __future__ import annotations

import queue
import threading

import torch
import torch.distributed as dist
from torch.futures import Future

from .. import _native
from .errors import UnsupportedError

# Codes shared with wirespeed-core (dtype.rs).
_DTYPES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2, torch.float64: 3,
           torch.int8: 4, torch.uint8: 5, torch.int32: 6, torch.int64: 7}
_SUPPORTED = "float32, float16, bfloat16, float64, int8, uint8, int32, int64"
_OPS = {dist.ReduceOp.SUM: 0, dist.ReduceOp.PRODUCT: 1, dist.ReduceOp.MIN: 2, dist.ReduceOp.MAX: 3,
        dist.ReduceOp.AVG: 4}
# By the enum's integer value: hashing a ReduceOp object costs several microseconds here.
_OP_VALUES = {op.op.value if hasattr(op, "op") else dist.ReduceOp(op).op.value: code for op, code in _OPS.items()}


def _check(t: torch.Tensor, what: str) -> torch.Tensor:
    # Cheapest tests first: this runs on every call, and small-message latency is the product.
    if t.is_cpu and t.layout == torch.strided and t.dtype in _DTYPES and t.is_contiguous():
        return t
    if not t.is_cpu:
        raise UnsupportedError(f"wirespeed: {what} is on {t.device}; the wirespeed backend handles CPU "
                               "tensors only (use nccl for GPU tensors, or a 'cpu:wirespeed,cuda:nccl' backend)")
    if t.layout != torch.strided:
        raise UnsupportedError(f"wirespeed: {what} is {t.layout}; only dense (strided) tensors are supported")
    if not t.is_contiguous():
        raise UnsupportedError(f"wirespeed: {what} is not contiguous; pass tensor.contiguous()")
    if t.dtype not in _DTYPES:
        raise UnsupportedError(f"wirespeed: {what} has dtype {t.dtype}; supported: {_SUPPORTED}")
    return t


def _buf(t: torch.Tensor) -> tuple[int, int]:
    return (t.data_ptr(), t.numel() * t.element_size())


_SUM = dist.ReduceOp.SUM
_STRIDED = torch.strided


def _op(opts) -> int:
    op = opts.reduceOp
    if op == _SUM:  # the common case, and the cheapest test (~0.2 us against ~1 us for a lookup)
        return 0
    code = _OP_VALUES.get(op.op.value)
    if code is None:
        for k, v in _OPS.items():  # ReduceOp objects compare by value
            if op == k:
                return v
        name = getattr(getattr(op, "op", None), "name", None) or str(op)
        raise UnsupportedError(f"wirespeed: reduce op {name} is not supported; use sum, prod, min, max or avg")
    return code


def _one(tensors, what: str) -> torch.Tensor:
    if len(tensors) != 1:
        raise UnsupportedError(f"wirespeed: {what} takes exactly one tensor per rank, got {len(tensors)}")
    return tensors[0]


class _Work(dist._Work):
    """Handle on queued ops (several for coalesced calls); they complete in order, so the last
    completing means all did, but each one's error is still raised."""

    def __init__(self, pg: "WirespeedProcessGroup", ids: list[int], result, keep):
        super().__init__()
        self._pg = pg
        self._ids = ids
        self._result = result
        self._keep = keep          # tensors the engine reads/writes: alive until completion
        self._future = None

    def wait(self, timeout=None):
        for i in self._ids:
            self._pg._group.wait(i)
        return True

    def is_completed(self):
        return all(self._pg._group.is_done(i) for i in self._ids)

    def is_success(self):
        try:
            self.wait()
            return True
        except _native.WirespeedError:
            return False

    def result(self):
        return self._result

    def get_future(self):
        if self._future is None:
            self._future = Future()
            self._pg._complete_later(self, self._future)
        return self._future


class WirespeedProcessGroup(dist.ProcessGroup):
    def __init__(self, group, rank: int, size: int):
        super().__init__(rank, size)
        self._group = group
        self._all_reduce = group.all_reduce  # bound once: the fast path's only native call
        self._futures: queue.SimpleQueue | None = None
        self._lock = threading.Lock()

    # ---- identity ----
    def getBackendName(self):
        return "wirespeed"

    def _get_backend(self, device):
        # torch asks a group's per-device backend for capabilities (batch_isend_irecv checks
        # `supports_coalescing`); this group is its own backend for CPU and coalesces nothing.
        return self

    @property
    def native(self):
        """The native group (wirespeed._native.Group) for direct use without torch dispatch."""
        return self._group

    # ---- futures ----
    def _complete_later(self, work: _Work, fut: Future) -> None:
        with self._lock:
            if self._futures is None:
                self._futures = queue.SimpleQueue()
                threading.Thread(target=self._complete_loop, args=(self._futures,),
                                 name="wirespeed-futures", daemon=True).start()
        self._futures.put((work, fut))

    @staticmethod
    def _complete_loop(q: queue.SimpleQueue) -> None:
        while True:
            work, fut = q.get()
            try:
                work.wait()
            except Exception as e:  # noqa: BLE001 - handed to whoever awaits the future
                fut.set_exception(e)
            else:
                fut.set_result(work._result)

    def _work(self, ids, result, keep) -> _Work:
        return _Work(self, ids if isinstance(ids, list) else [ids], result, keep)

    def _coalesced(self, works, result, keep):
        """One Work over several issued ops (None when they all ran inline)."""
        if works and all(w is None for w in works):
            return None
        return self._work([i for w in works for i in w._ids], result, keep)

    def _issue(self, opts, call, args, result, keep):
        """Run one native op. torch marks calls it will wait on at once (async_op=False) with
        opts.asyncOp False and accepts None from a backend that completed the op already: run
        it inline then (no worker wake-up, no Work object, no second call to wait), which is
        most of a small collective's cost. Otherwise queue it and hand back a Work."""
        if opts is not None and not getattr(opts, "asyncOp", True):
            call(*args, True)
            return None
        return _Work(self, [call(*args)], result, keep)

    # ---- collectives ----
    def allreduce(self, tensors, opts=None):
        # The blocking single-tensor call is the latency benchmark and the common case: keep its
        # path to a handful of attribute reads (each costs ~0.1-0.2 us on a pybind object).
        if opts is not None and len(tensors) == 1 and not getattr(opts, "asyncOp", True):
            t = tensors[0]
            code = _DTYPES.get(t.dtype)
            if code is not None and t.is_cpu and t.layout is _STRIDED and t.is_contiguous():
                self._all_reduce(t.data_ptr(), t.numel(), code, 0 if opts.reduceOp == _SUM else _op(opts), True)
                return None
        t = _check(_one(tensors, "allreduce"), "the all_reduce tensor")
        op = _op(opts) if opts is not None else 0
        return self._issue(opts, self._group.all_reduce, (t.data_ptr(), t.numel(), _DTYPES[t.dtype], op),
                           tensors, tensors)

    def allreduce_coalesced(self, tensors, opts=None):
        op = _op(opts) if opts is not None else 0
        blocking = opts is not None and not getattr(opts, "asyncOp", True)
        ids = [self._group.all_reduce(_check(t, "an all_reduce tensor").data_ptr(), t.numel(),
                                      _DTYPES[t.dtype], op, blocking) for t in tensors]
        return None if blocking else self._work(ids, tensors, tensors)

    def broadcast(self, tensors, opts):
        t = _check(_one(tensors, "broadcast"), "the broadcast tensor")
        return self._issue(opts, self._group.broadcast, (_buf(t), opts.rootRank), tensors, tensors)

    def reduce(self, tensors, opts):
        t = _check(_one(tensors, "reduce"), "the reduce tensor")
        return self._issue(opts, self._group.reduce, (t.data_ptr(), t.numel(), _DTYPES[t.dtype], _op(opts),
                                                      opts.rootRank), tensors, tensors)

    def _same_dtype(self, ts, dtype, what):
        for t in ts:
            _check(t, what)
            if t.dtype != dtype:
                raise UnsupportedError(f"wirespeed: {what} has dtype {t.dtype} but the input is {dtype}")

    def allgather(self, output_lists, inputs, opts=None):
        t = _check(_one(inputs, "allgather"), "the all_gather input")
        outs = _one(output_lists, "allgather")
        self._same_dtype(outs, t.dtype, "an all_gather output")
        return self._issue(opts, self._group.all_gather, (_buf(t), [_buf(o) for o in outs]), output_lists,
                           (output_lists, inputs))

    def all_gather_single(self, output, input, opts=None):
        _check(input, "the all_gather input")
        self._same_dtype([output], input.dtype, "the all_gather output")
        n = input.numel() * input.element_size()
        if output.numel() * output.element_size() != n * self.size():
            raise UnsupportedError(f"wirespeed: all_gather output holds {output.numel()} elements; it must "
                                   f"hold world size x input = {self.size() * input.numel()}")
        base = output.data_ptr()
        recv = [(base + r * n, n) for r in range(self.size())]
        return self._issue(opts, self._group.all_gather, (_buf(input), recv), [output], (output, input))

    _allgather_base = all_gather_single

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        return self._coalesced([self.all_gather_single(o, i, opts) for o, i in zip(outputs, inputs)],
                               outputs, (outputs, inputs))

    all_gather_single_coalesced = allgather_into_tensor_coalesced

    def gather(self, output_lists, inputs, opts):
        t = _check(_one(inputs, "gather"), "the gather input")
        root = opts.rootRank
        outs = _one(output_lists, "gather") if self.rank() == root else []
        self._same_dtype(outs, t.dtype, "a gather output")
        return self._issue(opts, self._group.gather, (_buf(t), [_buf(o) for o in outs], root), output_lists,
                           (output_lists, inputs))

    def scatter(self, outputs, input_lists, opts):
        t = _check(_one(outputs, "scatter"), "the scatter output")
        root = opts.rootRank
        ins = _one(input_lists, "scatter") if self.rank() == root else []
        self._same_dtype(ins, t.dtype, "a scatter input")
        return self._issue(opts, self._group.scatter, ([_buf(i) for i in ins], _buf(t), root), outputs,
                           (outputs, input_lists))

    def reduce_scatter(self, outputs, input_lists, opts):
        out = _check(_one(outputs, "reduce_scatter"), "the reduce_scatter output")
        ins = _one(input_lists, "reduce_scatter")
        self._same_dtype(ins, out.dtype, "a reduce_scatter input")
        return self._issue(opts, self._group.reduce_scatter, ([_buf(i) for i in ins], out.data_ptr(), out.numel(),
                                                              _DTYPES[out.dtype], _op(opts)),
                           outputs, (outputs, input_lists))

    def reduce_scatter_single(self, output, input, opts):
        _check(output, "the reduce_scatter output")
        self._same_dtype([input], output.dtype, "the reduce_scatter input")
        if input.numel() != output.numel() * self.size():
            raise UnsupportedError(f"wirespeed: reduce_scatter input holds {input.numel()} elements; it "
                                   f"must hold world size x output = {self.size() * output.numel()}")
        n = output.numel() * output.element_size()
        base = input.data_ptr()
        send = [(base + r * n, n) for r in range(self.size())]
        return self._issue(opts, self._group.reduce_scatter, (send, output.data_ptr(), output.numel(),
                                                              _DTYPES[output.dtype], _op(opts)),
                           [output], (output, input))

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts):
        return self._coalesced([self.reduce_scatter_single(o, i, opts) for o, i in zip(outputs, inputs)],
                               outputs, (outputs, inputs))

    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced

    def alltoall(self, outputs, inputs, opts=None):
        if len(outputs) != self.size() or len(inputs) != self.size():
            raise UnsupportedError(f"wirespeed: all_to_all takes {self.size()} input and output tensors "
                                   f"(one per rank), got {len(inputs)} and {len(outputs)}")
        self._same_dtype(list(outputs) + list(inputs), inputs[0].dtype, "an all_to_all tensor")
        return self._issue(opts, self._group.all_to_all, ([_buf(i) for i in inputs], [_buf(o) for o in outputs]),
                           outputs, (outputs, inputs))

    def all_to_all_single(self, output, input, output_splits, input_splits, opts=None):
        _check(input, "the all_to_all input")
        self._same_dtype([output], input.dtype, "the all_to_all output")
        w = self.size()

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

        send = pieces(input, list(input_splits), "input")
        recv = pieces(output, list(output_splits), "output")
        return self._issue(opts, self._group.all_to_all, (send, recv), [output], (output, input))

    alltoall_base = all_to_all_single

    def barrier(self, opts=None):
        return self._issue(opts, self._group.barrier, (), [], None)

    def send(self, tensors, dst, tag):
        t = _check(_one(tensors, "send"), "the send tensor")
        return self._work(self._group.send(dst, _buf(t), tag), tensors, tensors)

    def recv(self, tensors, src, tag):
        t = _check(_one(tensors, "recv"), "the recv tensor")
        return self._work(self._group.recv(src, _buf(t), tag), tensors, tensors)
