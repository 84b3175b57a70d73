"""A rank that waits on a dead or stuck peer must end with an error, not hang.

Backends have timeouts of their own, but not every wait honours them (a peer stopped mid-handshake,
a blocked device sync). The watchdog is the backstop: the harness names what it is doing before each
step, and marks each call of a loop done (`progress`); if neither happens within the timeout, the
rank prints what it was waiting for and exits. It watches progress, not loops: a loop of many calls
may last far longer than the timeout as long as every call ends within it.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from contextlib import contextmanager

from ..errors import PeerTimeout
from ..faults import rank_error

TICK_S = 0.25


class Watchdog:
    def __init__(self, timeout_s: float, rank: int):
        self.timeout_s = timeout_s
        self.rank = rank
        self._what = "starting"
        self._since = time.monotonic()
        self._calls = 0          # calls done, ever (bumped by progress, read by the thread)
        self._calls_at_step = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="wirespeed-watchdog", daemon=True)
        self._thread.start()

    def step(self, what: str) -> None:
        self._what = what
        self._calls_at_step = self._calls
        self._since = time.monotonic()

    def progress(self) -> None:
        """One more call of the current step is done. An increment and nothing else (no clock
        read): it runs once per timed call, so it must cost next to nothing beside the library."""
        self._calls += 1

    def close(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        # A fine tick, so a stalled rank ends within a quarter second of its timeout (the job
        # must end within the timeout plus about a second); the thread is idle otherwise.
        # A call seen done here counts from the tick that saw it: late by at most a tick, so the
        # watchdog errs toward patience, never toward killing a loop that moves.
        seen, moved_at = self._calls, time.monotonic()
        while not self._stop.wait(min(TICK_S, self.timeout_s / 8)):
            now = time.monotonic()
            if self._calls != seen:
                seen, moved_at = self._calls, now
            if now - max(self._since, moved_at) > self.timeout_s:
                done = self._calls - self._calls_at_step
                at = f" ({done} call{'s' if done != 1 else ''} of it done)" if done else ""
                sys.stderr.write(f"wirespeed: error: rank {self.rank}: no progress for "
                                 f"{self.timeout_s:g} s while {self._what}{at}: a peer hangs, is "
                                 "stopped or unreachable (raise --timeout if the job is just slow)\n")
                try:
                    sys.stdout.flush()
                    sys.stderr.flush()
                finally:
                    # At once, without the interpreter's teardown: torch's takes seconds, and a
                    # library thread may hold locks a clean exit would wait on.
                    os._exit(PeerTimeout.exit_code)


@contextmanager
def guarded_rank(rank: int, timeout_s: float):
    """The body of a rank's work under a watchdog (no step may outlast the timeout); a library
    exception leaves as one WirespeedError line naming the rank, never a traceback."""
    watchdog = Watchdog(timeout_s, rank)
    try:
        yield watchdog
    except Exception as e:   # wirespeed's own errors pass as they are; a library's (the transport's too) names its rank
        raise rank_error(rank, e) from None
    finally:
        watchdog.close()
