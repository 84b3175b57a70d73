"""Handles on queued native ops, as torch.distributed's Work.

A Work covers one or more native op ids (a coalesced call queues several); the engine completes
ops in order, but each one's error is still raised. When the ops are done, `wait` runs the
Work's finisher once (copying staged results back into the caller's tensors) before anyone can
see the result. `get_future()` futures are completed by one helper thread per backend.

A failed Work's future must fail in C++, not only in Python. torch's `Future.set_exception` does
not mark the C++ future as failed: it stores the exception as the future's *value* and has Python's
`wait()` raise it. C++ readers of the value see a completed future holding an exception object;
DDP's reducer (no comm hook) reads that value as its bucket's tensors, finds none and indexes the
first: a SIGSEGV in `parseCppCommHookResult` on every survivor of a dead peer. So the future handed
out is the child of a `then` that re-raises: torch sets a raising callback's error on the child's
C++ future, which every reader, C++ or Python, then raises. Its text is torch's "Got the following
error when running the callback: PeerDiedError: ..."; faults.py reads the wirespeed error back.

A Work owns no buffer: the memory an op reads or writes was handed to the engine with the op
(`keep=` on every native call) and is held there until nobody can touch it (the engine's
"Ownership" note), so dropping, joining or wrapping Works can never free memory in use. What a
Work carries is what only Python can do once the ops are done: the finishers.
"""
from __future__ import annotations

import queue
import threading
from typing import Callable

import torch.distributed as dist
from torch.futures import Future

from .. import _native
from .observe import finished


class Work(dist._Work):
    # (ledger, collective, seq, open profiler span) when the backend's instrumented method made
    # this Work (observe.py): its wait closes the span and explains a failure.
    _op = None

    def __init__(self, group, ids: list[int], result, finish: Callable[[], None] | None = None,
                 futures: "FutureCompleter | None" = None, source: int = -1):
        super().__init__()
        self._group = group          # the native group
        self._ids = ids
        self._result = result        # what result() and the future give: the output tensors
        self._finish = finish        # runs once, after the ops succeeded
        self._futures = futures
        self._future = None
        self._source = source
        self._lock = threading.Lock()
        self._done = False

    @classmethod
    def joined(cls, works: "list[Work]", result, futures: "FutureCompleter") -> "Work":
        """One Work for several (a coalesced call): every op id, and every finisher in order."""
        finishers = [w._finish for w in works if w._finish is not None]

        def finish():
            for f in finishers:
                f()
        return cls(works[0]._group, [i for w in works for i in w._ids], result,
                   finish if finishers else None, futures)

    def then(self, after: Callable[[], None]) -> "Work":
        """This Work, with `after` run once its own finisher has."""
        inner = self._finish

        def finish():
            if inner is not None:
                inner()
            after()
        self._finish = finish
        return self

    def _complete(self) -> None:
        for i in self._ids:
            self._group.wait(i)

    def wait(self, timeout=None):
        if self._done:
            return True
        try:
            self._complete()
        except _native.WirespeedError as e:
            if self._op is None:
                raise
            raise finished(self, e) from None
        with self._lock:          # the futures thread and the caller may both wait
            if not self._done:
                if self._finish is not None:
                    self._finish()
                    self._finish = None
                self._done = True
            op = self._op
            # a profiler span to close (observe.finished), once: under the lock, as the futures
            # thread and the caller may both get here
            if op is not None and op[3] is not None:
                finished(self, None)
        return True

    @property
    def completed_ok(self) -> bool:
        """Waited on, and succeeded (no native call: safe from any thread)."""
        return self._done

    def is_completed(self):
        return self._done or all(self._group.is_done(i) for i in self._ids)

    def is_success(self):
        try:
            self.wait()
            return True
        except _native.WirespeedError:
            return False

    def result(self):
        return self._result

    def _source_rank(self):
        return self._source

    source_rank = _source_rank

    def get_future(self):
        if self._future is None:
            source = Future()
            self._future = source.then(_reraise)    # failed in C++ when the Work failed (see above)
            self._futures.complete_later(self, source)
        return self._future


def _reraise(source: Future):
    """The source future's result, or its exception raised (set_exception's unwrap raises it)."""
    return source.value()


class FutureCompleter:
    """One daemon thread per backend, started on the first `get_future()`, that waits on Works in
    order and completes their futures (DDP's comm hooks chain on them).

    A future's `then` callbacks run in this thread when it completes the future; a callback that
    issues another op and waits on its future (the quantization hooks do) would wait on this very
    thread, so a future asked for here is completed at once, inline."""

    def __init__(self):
        self._queue: queue.SimpleQueue | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def complete_later(self, work: Work, fut: Future) -> None:
        if threading.current_thread() is self._thread:
            self._complete(work, fut)
            return
        with self._lock:
            if self._queue is None:
                self._queue = queue.SimpleQueue()
                self._thread = threading.Thread(target=self._loop, args=(self._queue,), name="wirespeed-futures",
                                                daemon=True)
                self._thread.start()
        self._queue.put((work, fut))

    @staticmethod
    def _complete(work: Work, fut: Future) -> None:
        try:
            work.wait()
        except Exception as e:  # noqa: BLE001 - handed to whoever awaits the future
            fut.set_exception(e)
        else:
            fut.set_result(work.result())

    @classmethod
    def _loop(cls, q: queue.SimpleQueue) -> None:
        while True:
            cls._complete(*q.get())
