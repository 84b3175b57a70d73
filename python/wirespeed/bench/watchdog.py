"""A rank that waits on a dead or stuck peer must end with an error, not hang.

Backends have timeouts of their own, but not every wait honours them (a peer stopped mid-handshake,
a blocked device sync). The watchdog is the backstop: the harness names what it is doing before each
step, and marks each call of a loop done (`progress`); if neither happens within the timeout, the
rank prints what it was waiting for and exits. It watches progress, not loops: a loop of many calls
may last far longer than the timeout as long as every call ends within it.

A single step can outlast the timeout on a healthy job (a 64 MiB check on a slow link, a large
allocation), and its rank cannot tell that from a dead peer by its own clock. So before it blames a
peer, the watchdog asks them (`PeerBeats`): every rank's watchdog leaves a sign of life in the job's
store every quarter of the timeout (0.25-5 s), from a thread of its own that no stuck library call
blocks. A rank whose peers all show life waits on, up to PATIENCE times the timeout; a peer that
missed two signs (stopped, killed, unreachable) is named. Without a store (mpi4py's backend) or while it cannot be read, the watchdog
blames as before.
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
# How many timeouts a rank whose peers all show signs of life waits in one step before it gives
# up all the same: a call that never ends on live ranks is a library's hang, not a slow step (the
# backends' own timeouts, gloo's and wirespeed's, end most of those at --timeout already). Whether
# a live rank is working cannot be told from outside it (CPU time was tried: a rank filling a
# buffer on a loaded machine read as idle), so live peers get this much patience.
PATIENCE = 10
BEAT_MIN_S, BEAT_MAX_S = 0.25, 5.0


def _default_store():
    """The job's store, once torch.distributed has a default group (None before, or without)."""
    try:
        import torch.distributed as dist
        if dist.is_available() and dist.is_initialized():
            from torch.distributed.distributed_c10d import _get_default_store
            return _get_default_store(), dist.get_world_size()
    except Exception:  # noqa: BLE001 (no store: the watchdog blames as it did)
        pass
    return None


class PeerBeats:
    """Signs of life through the job's store: this rank's counter, written every `period` s, and
    when each peer's last changed. Store calls run in a thread of their own, so a store that stops
    answering (its server stopped) delays only this thread, and the answers go stale."""

    def __init__(self, rank: int, period_s: float, find_store=_default_store):
        self.rank = rank
        self.period_s = period_s
        self._find = find_store
        self._changed: dict[int, tuple[str, float]] = {}   # peer -> (its value, when it changed)
        self.read_at = None                                 # when every peer was last read
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="wirespeed-beats", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        found, n = None, 0
        while not self._stop.wait(self.period_s if found else TICK_S):
            if found is None:
                found = self._find()
                if found is None:
                    continue
            store, world = found
            n += 1
            keys = [f"wirespeed/watchdog/{r}" for r in range(world) if r != self.rank]
            try:
                store.set(f"wirespeed/watchdog/{self.rank}", str(n))
                # Read only once every peer has written (a get waits for a missing key): one
                # request a period, whatever the world, until then.
                if keys and not store.check(keys):
                    continue
                many = getattr(store, "multi_get", None)
                vals = many(keys) if many is not None else [store.get(k) for k in keys]
            except Exception:  # noqa: BLE001 (the store is gone: its job is ending)
                return
            now = time.monotonic()
            for k, v in zip(keys, vals):
                peer = int(k.rsplit("/", 1)[1])
                if self._changed.get(peer, (None,))[0] != v:
                    self._changed[peer] = (v, now)
            self.read_at = now

    def silent(self, for_s: float) -> list[int] | None:
        """The peers with no sign of life for `for_s` seconds; None when this rank cannot tell
        (no store, or its last complete read is older than that)."""
        now = time.monotonic()
        if self.read_at is None or now - self.read_at > for_s:
            return None
        return sorted(p for p, (_, at) in self._changed.items() if now - at > for_s)


class Watchdog:
    def __init__(self, timeout_s: float, rank: int):
        self.timeout_s = timeout_s
        self.rank = rank
        self._what = "starting"
        self._since = time.monotonic()
        self._calls = 0          # calls done, ever (bumped by progress, read by the thread)
        self._calls_at_step = 0
        self._stop = threading.Event()
        self._beats = PeerBeats(rank, min(max(timeout_s / 4, BEAT_MIN_S), BEAT_MAX_S))
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
        self._beats.close()

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
            still = now - max(self._since, moved_at)
            if still > self.timeout_s:
                # A live peer's beat changes every period; two missed (and a slow tick) is silence,
                # so a peer stopped when progress stopped is named at the timeout, not later.
                silent = self._beats.silent(2 * self._beats.period_s + 0.5)
                if silent == [] and still <= PATIENCE * self.timeout_s:
                    continue   # every peer is alive: a slow step, not a dead peer
                done = self._calls - self._calls_at_step
                at = f" ({done} call{'s' if done != 1 else ''} of it done)" if done else ""
                if silent:
                    who = ", ".join(map(str, silent))
                    why = (f"rank{'s' if len(silent) > 1 else ''} {who} gave no sign of life since "
                           f"{2 * self._beats.period_s + 0.5:.1f} s or more: stopped, killed or unreachable")
                elif silent == []:
                    why = (f"every peer is alive, yet nothing moved for {PATIENCE} times the timeout: a "
                           "call that does not end (raise --timeout if the job is just slow)")
                else:
                    why = "a peer hangs, is stopped or unreachable (raise --timeout if the job is just slow)"
                sys.stderr.write(f"wirespeed: error: rank {self.rank}: no progress for "
                                 f"{still:.0f} s while {self._what}{at}: {why}\n")
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
