"""The ProcessGroup a wirespeed group is to torch: torch's own ProcessGroup with the wirespeed
backend registered for CPU tensors, exactly as torch builds one for gloo (a default backend, a
device type, a group name set by torch), so DeviceMesh, DTensor, FSDP2 and functional
collectives find it by name, and torch's dispatcher reaches WirespeedBackend (backend.py) for
every device-type lookup and op it routes.

It is a Python subclass for what the C++ ProcessGroup cannot carry from a backend written in
Python: the sender of an any-source receive (torch reads it with Work._source_rank(), which the
C++ wrapper of a Python Work does not forward), so `recv_anysource` answers here with the
backend's own Work; sub-groups from `split_group`, built here so they are of this class too;
`gather_into_tensor`, which torch's Python-backend wrapper cannot route; and speed: torch's
dispatcher, its C++ wrappers of a Python Work and the flight recorder's hook cost 35-70 us per
call here (the call itself costs ~10 us blocking, ~20 us async with its wait, in a group of one),
so collectives called on this group go straight to the backend. torch's flight recorder and
collective hooks therefore do not see them. They take torch's path when an async op's Work must be
registered for a compiled graph's wait_tensor (allow_inflight_collective_as_graph_input), when the
call is one of torch's other overloads (`allreduce(tensor, op)`, `broadcast(tensor, root)`,
`barrier(timeout)`: no options object), and always with TORCH_DIST_NAN_CHECK=1, so the NaN check
sees every call.

`dist.all_reduce(t, group=g)` of one dense CPU tensor, summed and blocking, is the latency case (the
4 KiB benchmark, and every small blocking sum in a training loop): `allreduce` runs it here, in its
own frame, straight into the native call, rather than through the generic route and the backend's
method (a second Python call, a bound-method lookup, the arguments repacked, asyncOp read twice:
~0.4 us of the ~1.95 us this group added per call, measured in a group of one).
"""
from __future__ import annotations

import os
import weakref

import torch
import torch.autograd.profiler as _ap
import torch.distributed as dist

from .. import _native
from .backend import WirespeedBackend
from .tensors import REDUCE_DTYPES, SUM

_CUSTOM = dist.ProcessGroup.BackendType.CUSTOM
_CPU = torch.device("cpu")
_STRIDED = torch.strided
_C10D = torch._C._distributed_c10d
_AllreduceOptions = _C10D.AllreduceOptions


_inflight_as_graph_input = _C10D._allow_inflight_collective_as_graph_input


def _direct(name: str, opts_at: int, opts_type):
    """A collective run on the backend directly, or through torch's ProcessGroup (dispatcher, hooks)
    when that is needed (see the module's doc). `opts_at`: where the options are among the arguments;
    `opts_type`: their class. Only a call with such an options object goes direct: torch's other
    overloads of the method take an op, a root or a timeout there, which torch's binding translates."""
    via_torch = getattr(dist.ProcessGroup, name)

    def call(self, *args, **kwargs):
        opts = kwargs.get("opts", args[opts_at] if len(args) > opts_at else None)
        if self._direct and type(opts) is opts_type and (not opts.asyncOp or not _inflight_as_graph_input()):
            return getattr(self._backend, name)(*args, **kwargs)
        return via_torch(self, *args, **kwargs)
    # pybind11 runs the C++ base (torch's dispatcher) rather than this override again when it sees
    # the call come from a Python frame whose function has the method's name and the same self.
    call.__code__ = call.__code__.replace(co_name=name)
    call.__name__ = call.__qualname__ = name
    return call


class WirespeedProcessGroup(dist.ProcessGroup):
    def __init__(self, store, backend: WirespeedBackend):
        super().__init__(store, backend.rank(), backend.size())
        self._store = store
        self._backend = backend
        self._children: list[WirespeedProcessGroup] = []
        self._set_default_backend(_CUSTOM)
        self._register_backend(_CPU, _CUSTOM, backend)
        # torch's path also when the user asked for torch's flight recorder (observe.py), so its hook
        # records every op.
        self._ledger = backend._ledger
        self._direct = os.environ.get("TORCH_DIST_NAN_CHECK", "0") != "1" and not self._ledger.recorded
        self._ledger.group = weakref.ref(self)
        # The native blocking all_reduce, for `allreduce`'s latency case; None: no such case.
        self._sum_now = backend.native.all_reduce if self._direct else None

    _allreduce = _direct("allreduce", 1, _AllreduceOptions)

    def allreduce(self, *args, **kwargs):
        # The latency case (module doc): dist.all_reduce's allreduce([t], opts), blocking, summed,
        # one dense contiguous CPU tensor of a reducible dtype: the same checks as the backend's
        # fast path (WirespeedBackend.allreduce), cheapest first, asyncOp and reduceOp read once
        # (reduceOp, a new pybind object per read, costs ~0.3 us of the path). Anything else takes
        # the generic route, which passes async ops, other ops and layouts to the backend whole.
        # While torch's profiler records, the backend's method runs it, as a span (observe.py).
        if len(args) == 2 and not kwargs and self._sum_now is not None and not _ap._is_profiler_enabled:
            tensors, opts = args
            if (type(opts) is _AllreduceOptions and type(tensors) is list and len(tensors) == 1
                    and not opts.asyncOp):
                t = tensors[0]
                code = REDUCE_DTYPES.get(t.dtype)
                if (code is not None and t.is_cpu and t.layout is _STRIDED and t.is_contiguous()
                        and opts.reduceOp == SUM):
                    led = self._ledger
                    led.seq += 1
                    try:
                        self._sum_now(t.data_ptr(), t.numel(), code, 0, t, True)
                    except _native.WirespeedError as e:
                        raise led.explain(e, "all_reduce", led.seq) from None
                    return None
        return self._allreduce(*args, **kwargs)

    broadcast = _direct("broadcast", 1, _C10D.BroadcastOptions)
    reduce = _direct("reduce", 1, _C10D.ReduceOptions)
    allgather = _direct("allgather", 2, _C10D.AllgatherOptions)
    all_gather_single = _direct("all_gather_single", 2, _C10D.AllgatherOptions)
    reduce_scatter = _direct("reduce_scatter", 2, _C10D.ReduceScatterOptions)
    reduce_scatter_single = _direct("reduce_scatter_single", 2, _C10D.ReduceScatterOptions)
    alltoall = _direct("alltoall", 2, _C10D.AllToAllOptions)
    all_to_all_single = _direct("all_to_all_single", 4, _C10D.AllToAllOptions)
    gather = _direct("gather", 2, _C10D.GatherOptions)
    scatter = _direct("scatter", 2, _C10D.ScatterOptions)
    barrier = _direct("barrier", 0, _C10D.BarrierOptions)

    def gather_single(self, output, input, opts):
        return self._backend.gather_single(output, input, opts)

    @property
    def native(self):
        """The native group (wirespeed._native.Group) for direct use without torch dispatch."""
        return self._backend.native

    @property
    def backend(self) -> WirespeedBackend:
        return self._backend

    def recv_anysource(self, tensors, tag):
        return self._backend.recv_anysource(tensors, tag)

    def splitGroup(self, ranks, timeout=None, opts=None, group_name=None, group_desc=None, devices=None):
        """torch's split_group (and DeviceMesh) land here on every rank of this group; members
        rendezvous under the new group's name and get a new native group; others get None."""
        if devices is not None and any(torch.device(d).type != "cpu" for d in devices):
            raise ValueError("wirespeed: split_group of a wirespeed group can only keep its cpu backend")
        ranks = list(ranks)
        if self.rank() not in ranks:
            return None
        name = group_name or f"{self.group_name}:split:{ranks}"
        store = dist.PrefixStore(f"{name}/", self._store)
        child = WirespeedProcessGroup(store, self._backend.split_ranks(store, ranks, timeout))
        child._set_group_name(name)
        child._set_group_desc(group_desc or f"{self.group_desc}:split")
        # torch keeps only the C++ object it is handed; holding the Python one keeps its class.
        self._children.append(child)
        return child
