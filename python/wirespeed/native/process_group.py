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
registered for a compiled graph's wait_tensor (allow_inflight_collective_as_graph_input), and
always with TORCH_DIST_NAN_CHECK=1, so the NaN check sees every call.
"""
from __future__ import annotations

import os

import torch
import torch.distributed as dist

from .backend import WirespeedBackend

_CUSTOM = dist.ProcessGroup.BackendType.CUSTOM
_CPU = torch.device("cpu")


_inflight_as_graph_input = torch._C._distributed_c10d._allow_inflight_collective_as_graph_input


def _direct(name: str, opts_at: int):
    """A collective run on the backend directly, or through torch's ProcessGroup (dispatcher, hooks)
    when that is needed (see the module's doc). `opts_at`: where the options are among the arguments."""
    via_torch = getattr(dist.ProcessGroup, name)

    def call(self, *args, **kwargs):
        opts = kwargs.get("opts", args[opts_at] if len(args) > opts_at else None)
        if self._direct and opts is not None and (not opts.asyncOp or not _inflight_as_graph_input()):
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
        self._direct = os.environ.get("TORCH_DIST_NAN_CHECK", "0") != "1"

    allreduce = _direct("allreduce", 1)
    broadcast = _direct("broadcast", 1)
    reduce = _direct("reduce", 1)
    allgather = _direct("allgather", 2)
    all_gather_single = _direct("all_gather_single", 2)
    reduce_scatter = _direct("reduce_scatter", 2)
    reduce_scatter_single = _direct("reduce_scatter_single", 2)
    alltoall = _direct("alltoall", 2)
    all_to_all_single = _direct("all_to_all_single", 4)
    gather = _direct("gather", 2)
    scatter = _direct("scatter", 2)
    barrier = _direct("barrier", 0)

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
