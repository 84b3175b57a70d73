"""`monitored_barrier` through torch's store: rank 0 waits for each rank with the call's timeout and
names every rank that did not arrive, as gloo's does; the transport is not involved, so a missing
rank breaks nothing and the group stays usable after the error."""
from __future__ import annotations

import time
from datetime import timedelta

from .. import _native


def _wait(store, key: str, seconds: float) -> bool:
    try:
        if seconds <= 0:
            return store.check([key])
        store.wait([key], timedelta(seconds=seconds))
        return True
    except RuntimeError:   # the store's timeout (DistStoreError)
        return False


def _delete(store, keys) -> None:
    for k in keys:
        try:
            store.delete_key(k)
        except (RuntimeError, NotImplementedError):
            return      # a store without deletion keeps a few bytes per barrier


def monitored_barrier(store, rank: int, world: int, seq: int, timeout: timedelta, wait_all: bool) -> None:
    base = f"wirespeed/monitored/{seq}"
    ms = int(timeout.total_seconds() * 1000)
    if rank != 0:
        store.set(f"{base}/in/{rank}", b"1")
        if not _wait(store, f"{base}/out", timeout.total_seconds()):
            raise _native.CollectiveTimeout(
                f"Rank {rank} timed out in monitoredBarrier after {ms} ms: rank 0 did not release it "
                "(rank 0 is missing, or another rank did not arrive)")
        return
    deadline = time.monotonic() + timeout.total_seconds()
    missing = []
    for r in range(1, world):
        if not _wait(store, f"{base}/in/{r}", deadline - time.monotonic()):
            missing.append(r)
            if not wait_all:
                break
    if missing:
        who = (f"Rank {missing[0]}" if len(missing) == 1
               else "Ranks " + ", ".join(str(r) for r in missing))
        raise _native.CollectiveTimeout(f"{who} failed to pass monitoredBarrier in {ms} ms")
    store.set(f"{base}/out", b"1")
    # Every rank has left the previous barrier to arrive at this one: its keys can go.
    _delete(store, [f"{base}/in/{r}" for r in range(1, world)] + [f"wirespeed/monitored/{seq - 1}/out"])
