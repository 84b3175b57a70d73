"""The store rendezvous that makes a connected native group.

Through whatever store torch hands the backend (TCPStore, FileStore, already prefixed per group),
so torchrun, SLURM and `wirespeed bench -N` launches work unchanged: rank 0 publishes a random job
token; every rank publishes its host id (hostname + boot id) and reads everyone's, so all agree on
which ranks share a host; then every rank publishes (pid, memfd, TCP listening address when the
group spans hosts, host) and reads everyone's.
"""
from __future__ import annotations

import datetime

from .. import _native


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
