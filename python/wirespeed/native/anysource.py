"""Receive from any source (`dist.recv(src=None)`) on a transport whose receives name their sender.

The native engine matches a receive to the next message from one named peer, and the bindings
offer no way to ask which peers have a message waiting. So senders say so through torch's store:
each rank counts the messages it sends to each peer, and a send whose Work has not completed
ANNOUNCE_AFTER_S after it was issued is announced by a background thread, which raises the store counter
`p2p/{src}->{dst}` to that send's number. Sends taken at once (almost all of them, when the
receiver names its source) cost no store traffic.

An any-source receive reads those counters for every peer and picks one whose counter is past
the number of messages already received from it (every receive, named or not, is counted): that
peer has a message waiting, and it is the next one from that peer, since messages between two
ranks arrive in the order sent. The receive then runs natively from that peer, so its tag and
size must match that message, as for any receive. The core should offer a probe of its incoming
queues (a peer's posted counter is in shared memory already); this module is the stand-in.
"""
from __future__ import annotations

import queue
import threading
import time
import weakref
from datetime import timedelta

from .. import _native
from .work import Work

ANNOUNCE_AFTER_S = 0.0005   # long enough that a waiting named receive takes the message first
_POLL_MAX_S = 0.005


def _key(src: int, dst: int) -> str:
    return f"wirespeed/p2p/{src}->{dst}"


class Announcer:
    """Sender side: counts sends per destination and announces the ones left waiting."""

    def __init__(self, store, rank: int):
        self._store = store
        self._rank = rank
        self.sent: dict[int, int] = {}
        self._announced: dict[int, int] = {}
        self._queue: queue.SimpleQueue | None = None
        self._lock = threading.Lock()

    def sent_one(self, dst: int, work: Work) -> None:
        n = self.sent.get(dst, 0) + 1
        self.sent[dst] = n
        if self._queue is None:
            with self._lock:
                if self._queue is None:
                    try:
                        store = self._store.clone()   # a connection of its own for the thread
                    except (RuntimeError, AttributeError):
                        store = self._store
                    self._queue = queue.SimpleQueue()
                    threading.Thread(target=self._loop, args=(self._queue, store), daemon=True,
                                     name="wirespeed-announce").start()
        self._queue.put((time.monotonic() + ANNOUNCE_AFTER_S, dst, n, weakref.ref(work)))

    def _loop(self, q: queue.SimpleQueue, store) -> None:
        while True:
            item = q.get()
            if item is None:
                return
            due, dst, n, work_ref = item
            delay = due - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            # Waited on and acknowledged: the receiver took it. (A send nobody waits on yet is
            # announced even if it was taken; the receiver's count tells those apart.)
            work = work_ref()
            if work is not None and work.completed_ok:
                continue
            try:
                # Raise the counter to n (the thread handles sends in order, so n only grows).
                store.add(_key(self._rank, dst), n - self._announced.get(dst, 0))
                self._announced[dst] = n
            except Exception:  # noqa: BLE001 - a closed group or store: nobody is left to receive
                return

    def close(self) -> None:
        if self._queue is not None:
            self._queue.put(None)


class AnySourceWork(Work):
    """A receive whose sender is found when it is waited on (so issuing it never blocks)."""

    def __init__(self, backend, st, buffer: tuple[int, int], tag: int, result):
        super().__init__(backend.native, [], result, st.finish, backend._futures)
        self._backend = backend
        self._keep = st.keep        # handed to the engine with the receive, once it is issued
        self._buffer = buffer
        self._tag = tag

    def _complete(self) -> None:
        if self._source >= 0:
            return
        b = self._backend
        src = find_sender(b.store, b.rank(), b.size(), b.received, b.timeout, not b.anysource_used)
        b.anysource_used = True
        b.received[src] = b.received.get(src, 0) + 1
        b.native.recv(src, self._buffer, self._tag, keep=self._keep, blocking=True)
        self._source = src

    def is_completed(self):
        return self._done


def find_sender(store, me: int, world: int, received: dict[int, int], timeout: timedelta,
                first: bool) -> int:
    """A peer with a message for `me` not yet received, waiting for one up to `timeout`.
    `first`: this rank's first any-source receive in the group, which creates the counters."""
    peers = [p for p in range(world) if p != me]
    if not peers:
        raise _native.UnsupportedError("wirespeed: a group of one rank has nobody to receive from")
    keys = [_key(p, me) for p in peers]
    if first:
        for k in keys:
            store.add(k, 0)     # creates the counters, so reading them never waits
    deadline = time.monotonic() + timeout.total_seconds()
    pause = 0.00005
    while True:
        for p, v in zip(peers, store.multi_get(keys)):
            if int(v) > received.get(p, 0):
                return p
        if time.monotonic() > deadline:
            raise _native.CollectiveTimeout(
                f"wirespeed: rank {me} waited {timeout.total_seconds():g} s in a receive from any source "
                "and no rank sent to it")
        time.sleep(pause)
        pause = min(pause * 2, _POLL_MAX_S)
