"""The ProcessGroup a wirespeed group is to torch: torch's own ProcessGroup with the wirespeed
backend registered for CPU tensors, exactly as torch builds one for gloo (a default backend, a
device type, a group name set by torch), so DeviceMesh, DTensor, FSDP2 and functional
collectives find it by name and every collective goes through torch's dispatcher to
WirespeedBackend (backend.py).

It is a Python subclass for two things the C++ ProcessGroup cannot carry from a backend written
in Python: the sender of an any-source receive (torch reads it with Work._source_rank(), which the
C++ wrapper of a Python Work does not forward), so `recv_anysource` answers here with the
backend's own Work; and sub-groups from `split_group`, built here so they are of this class too.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from .backend import WirespeedBackend

_CUSTOM = dist.ProcessGroup.BackendType.CUSTOM
_CPU = torch.device("cpu")


class WirespeedProcessGroup(dist.ProcessGroup):
    def __init__(self, store, backend: WirespeedBackend):
        super().__init__(store, backend.rank(), backend.size())
        self._store = store
        self._backend = backend
        self._children: list[WirespeedProcessGroup] = []
        self._set_default_backend(_CUSTOM)
        self._register_backend(_CPU, _CUSTOM, backend)

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
