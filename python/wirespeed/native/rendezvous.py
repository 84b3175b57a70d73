"""The store rendezvous that makes a connected native group.

Through whatever store torch hands the backend (TCPStore, FileStore, already prefixed per group),
so torchrun, SLURM and `wirespeed bench -N` launches work unchanged: rank 0 publishes a random job
token; every rank publishes its host id (hostname + boot id) with its open-file room (the core's
hosts/fds.rs) and reads everyone's, so all agree on which ranks share a host and on the TCP
streams per peer that every rank's open-file limit holds; then every rank publishes (pid, memfd,
TCP listening address when the group spans hosts, host) and reads everyone's.

Every rank first claims its number (a counter in the store). A number claimed by two processes (a
stale rank of another job on the same port, a launcher that started a rank twice) is an error on
every rank that sees it, naming both claimants, before connecting and again once connected: never
a silent first-come, where the job would compute with whichever process answered. The same process
claiming again (destroy_process_group, then init on the same store) is a new round, not a duplicate,
and torchrun's restarts count as rounds of their own (TORCHELASTIC_RESTART_COUNT), since its store
outlives the workers. The checks cost each rank O(1) store requests, whatever the world size.
"""
from __future__ import annotations

import datetime
import os
import socket
import time

from .. import _native
from ..errors import RankClaimedTwice


def _round() -> str:
    # torchrun's store outlives its workers and torch reuses the group's prefix after a restart.
    return os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")


def _me() -> str:
    return f"{socket.gethostname()} pid {os.getpid()}"


def _claim(store, rank: int) -> int:
    """Claim `rank`; returns this claim's number (for _check_claims)."""
    g = _round()
    n = store.add(f"wirespeed/{g}/claims/{rank}", 1)
    store.set(f"wirespeed/{g}/claimant/{rank}/{n}", _me())
    if n > 1:
        before = store.get(f"wirespeed/{g}/claimant/{rank}/{n - 1}").decode()
        if before != _me():  # else this process re-initialises: a new round of its own
            _claimed_twice(store, rank, before, _me())
    return n


def _claimed_twice(store, rank: int, first: str, second: str):
    msg = (f"rank {rank} was claimed twice, by {first} and by {second}: a rank of another job (or "
           "a second copy of one) uses this job's rendezvous; end it, or give this job its own "
           "MASTER_PORT")
    store.set(f"wirespeed/{_round()}/duplicate", msg)  # every rank's check sees it
    raise RankClaimedTwice(msg)


def _check_claims(store, rank: int, n: int) -> None:
    g = _round()
    key = f"wirespeed/{g}/duplicate"
    if store.check([key]):
        raise RankClaimedTwice(store.get(key).decode())
    last = store.add(f"wirespeed/{g}/claims/{rank}", 0)
    if last > n:  # claimed again after this process did
        other = store.get(f"wirespeed/{g}/claimant/{rank}/{last}").decode()
        if other != _me():
            _claimed_twice(store, rank, _me(), other)


def _wait_count(store, key: str, seen: int, want: int, most_s: float) -> None:
    """Until the counter `key` (at `seen` when last read) reaches `want`, or `most_s` passed."""
    end = time.monotonic() + most_s
    try:
        while seen < want and time.monotonic() < end:
            time.sleep(0.01)
            seen = store.add(key, 0)
    except Exception:  # noqa: BLE001 (the store went away: nobody is left to wait for)
        pass


def rendezvous(store, rank: int, size: int, timeout: datetime.timedelta):
    """A connected native group for `rank` of `size`, met through `store`."""
    n = _claim(store, rank)
    # This round's keys: a re-init on the same store must not read the last round's token or
    # addresses (every rank of a re-initialising job is at the same claim number).
    at = f"wirespeed/{_round()}/{n}"
    if rank == 0:
        store.set(f"{at}/token", _native.random_token().hex())
    token = bytes.fromhex(store.get(f"{at}/token").decode())
    # With the host id, what this rank's open files allow (the core's FdRoom, text without a
    # comma): every rank hands all of them to the core, which picks the same TCP stream count on
    # every rank from them, or fails every rank alike when some rank's limit is too low.
    store.set(f"{at}/host/{rank}", f"{_native.fd_room()},{_native.host_id()}")
    rooms, hosts = zip(*(store.get(f"{at}/host/{r}").decode().split(",", 1) for r in range(size)))
    read = store.add(f"{at}/rooms-read", 1)
    try:
        group = _native.Group(rank, size, token, max(timeout.total_seconds(), 0.001), list(hosts), list(rooms))
    except Exception:
        # Every rank fails alike here (a limit too low, ranks that disagree), but rank 0, which
        # serves the store under wirespeed's launchers and torch's tcp:// init, must not leave
        # before the others have read what they decide from: they would meet a closed store
        # instead of the same one-line error. (Only rank 0 waits: a rank polling a store whose
        # server leaves gets torch's stack trace on stderr.)
        if rank == 0:
            _wait_count(store, f"{at}/rooms-read", read, size, min(timeout.total_seconds(), 10.0))
        raise
    pid, fd, host, addr = group.info()
    store.set(f"{at}/rank/{rank}", f"{pid},{fd},{addr},{host}")
    infos = []
    for r in range(size):
        p, f, a, h = store.get(f"{at}/rank/{r}").decode().split(",", 3)
        infos.append((int(p), int(f), h, a))
    _check_claims(store, rank, n)
    group.connect(infos)
    _check_claims(store, rank, n)
    return group
