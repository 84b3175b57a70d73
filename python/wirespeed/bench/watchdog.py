"""A rank that waits on a dead or stuck peer must end with an error, not hang.

Backends have timeouts of their own, but not every wait honours them (a peer stopped mid-handshake,
a blocked device sync). The watchdog is the backstop: the harness names what it is doing before each
step, and if no step finishes within the timeout, the rank prints what it was waiting for and exits.
"""
from __future__ import annotations

import os
import sys
import threading
import time

from ..errors import PeerTimeout

TICK_S = 0.25


class Watchdog:
    def __init__(self, timeout_s: float, rank: int):
        self.timeout_s = timeout_s
        self.rank = rank
        self._what = "starting"
        self._since = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="wirespeed-watchdog", daemon=True)
        self._thread.start()

    def step(self, what: str) -> None:
        self._what = what
        self._since = time.monotonic()

    def close(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        # A fine tick, so a stalled rank ends within a quarter second of its timeout (the job
        # must end within the timeout plus about a second); the thread is idle otherwise.
        while not self._stop.wait(min(TICK_S, self.timeout_s / 8)):
            if time.monotonic() - self._since > self.timeout_s:
                sys.stderr.write(f"wirespeed: error: rank {self.rank}: no progress for "
                                 f"{self.timeout_s:g} s while {self._what}: a peer hangs, is "
                                 "stopped or unreachable (raise --timeout if the job is just slow)\n")
                try:
                    sys.stdout.flush()
                    sys.stderr.flush()
                finally:
                    # At once, without the interpreter's teardown: torch's takes seconds, and a
                    # library thread may hold locks a clean exit would wait on.
                    os._exit(PeerTimeout.exit_code)
