"""Registration with torch.distributed and the store rendezvous.

One registration, as torch registers its own backends: a named backend for the cpu device whose
creator takes torch's extended options (store, rank, size, timeout, group name). The creator
returns the group's ProcessGroup (process_group.py) with the wirespeed Backend registered in it.

Rendezvous goes through whatever store torch hands the creator (TCPStore, FileStore, already
prefixed per group), so torchrun, SLURM and `wirespeed bench -N` launches work unchanged: rank 0
publishes a random job token; every rank publishes its host id (hostname + boot id) and reads
everyone's, so all agree on which ranks share a host; then every rank publishes (pid, memfd, TCP
listening address when the group spans hosts, host) and reads everyone's.
"""
from __future__ import annotations

import datetime

import torch.distributed as dist

from .. import _native

BACKEND_NAME = "wirespeed"


def rendezvous(store, rank: int, size: int, timeout: datetime.timedelta):
    """A connected native group for `rank` of `size`, met through `store`."""
    if rank == 0:
        store.set("wirespeed/token", _native.random_token().hex())
    token = bytes.fromhex(store.get("wirespeed/token").decode())
    store.set(f"wirespeed/host/{rank}", _native.host_id())
    hosts = [store.get(f"wirespeed/host/{r}").decode() for r in range(size)]
    group = _native.Group(rank, size, token, max(timeout.total_seconds(), 0.001), hosts)
    pid, fd, host, addr = group.info()
    store.set(f"wirespeed/rank/{rank}", f"{pid},{fd},{addr},{host}")
    infos = []
    for r in range(size):
        p, f, a, h = store.get(f"wirespeed/rank/{r}").decode().split(",", 3)
        infos.append((int(p), int(f), h, a))
    group.connect(infos)
    return group


def _create(opts, backend_options=None):
    from .backend import WirespeedBackend
    from .process_group import WirespeedProcessGroup

    store, rank, size, timeout = opts.store, opts.group_rank, opts.group_size, opts.timeout
    pg = WirespeedProcessGroup(store, WirespeedBackend(rendezvous(store, rank, size, timeout), store, rank,
                                                       size, timeout))
    parent = opts.process_group      # the group torch built for this call: keep its device binding
    if parent is not None and parent.bound_device_id is not None:
        pg.bound_device_id = parent.bound_device_id
    return pg


def register() -> None:
    """Make "wirespeed" a torch.distributed backend for CPU tensors (idempotent)."""
    if BACKEND_NAME.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(BACKEND_NAME, _create, extended_api=True, devices=["cpu"])
