"""The store rendezvous that makes a connected native group.

Through whatever store torch hands the backend (TCPStore, FileStore, already prefixed per group),
so torchrun, SLURM and `wirespeed bench -N` launches work unchanged: rank 0 publishes a random job
token; every rank publishes its host id (hostname + boot id) and reads everyone's, so all agree on
which ranks share a host; then every rank publishes (pid, memfd, TCP listening address when the
group spans hosts, host) and reads everyone's.

Every rank first claims its number (a counter in the store). A number claimed twice is an error on
every rank that sees it, naming both claimants, before connecting and again once connected (a late
second claimant is seen then): never a silent first-come, where the job would compute with
whichever process answered.
"""
from __future__ import annotations

import datetime
import os
import socket

from .. import _native
from ..errors import RankClaimedTwice


def _claim(store, rank: int) -> None:
    n = store.add(f"wirespeed/claims/{rank}", 1)
    store.set(f"wirespeed/claimant/{rank}/{n}", f"{socket.gethostname()} pid {os.getpid()}")
    if n > 1:
        _claimed_twice(store, rank)


def _claimed_twice(store, rank: int):
    first = store.get(f"wirespeed/claimant/{rank}/1").decode()
    second = store.get(f"wirespeed/claimant/{rank}/2").decode()
    raise RankClaimedTwice(f"rank {rank} was claimed twice, by {first} and by {second}: a rank of "
                           "another job (or a second copy of one) uses this job's rendezvous; end "
                           "it, or give this job its own MASTER_PORT")


def _check_claims(store, size: int) -> None:
    for r in range(size):
        if store.add(f"wirespeed/claims/{r}", 0) > 1:
            _claimed_twice(store, r)


def rendezvous(store, rank: int, size: int, timeout: datetime.timedelta):
    """A connected native group for `rank` of `size`, met through `store`."""
    _claim(store, rank)
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
    _check_claims(store, size)
    group.connect(infos)
    _check_claims(store, size)
    return group
