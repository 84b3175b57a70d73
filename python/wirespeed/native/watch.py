"""One background thread that polls a list of entries until each says it is done: what admission's
watch of a job's claims note and observe's watch for a peer's flight-recorder dump both are. Each
reads a group's store every so often from a daemon thread, and the thread must be out of its
store calls before the interpreter tears torch's objects down, so the two share this one shape."""
from __future__ import annotations

import threading
import time


class Poller:
    """A daemon thread, started with the first entry, calling each entry's `poll(now)` every `tick`
    seconds; an entry leaves when poll returns True or raises (its group collected or closed, its
    store gone with the job: nothing left to watch). Stopped before the interpreter's shutdown."""

    def __init__(self, name: str, tick: float):
        self._name, self._tick = name, tick
        self._lock = threading.Lock()
        self._entries: list = []
        self._stop = threading.Event()
        self._thread = None

    def add(self, entry) -> None:
        with self._lock:
            self._entries.append(entry)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                # Stop before the interpreter's shutdown joins threads and finalizes: the thread
                # must not be inside a store call while torch's objects are torn down.
                threading._register_atexit(self.stop)
                self._thread.start()

    def drop(self, gone) -> None:
        """Stop polling, now, every entry for which `gone(entry)` is true."""
        with self._lock:
            self._entries = [e for e in self._entries if not gone(e)]

    def stop(self) -> None:
        self._stop.set()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout=1.0)

    def _run(self) -> None:
        while not self._stop.wait(self._tick):
            now = time.monotonic()
            with self._lock:
                entries = list(self._entries)
            for e in entries:
                if self._stop.is_set():
                    return
                try:
                    done = e.poll(now)
                except Exception:  # noqa: BLE001 (collected, closed, or its store is gone)
                    done = True
                if done:
                    with self._lock:
                        if e in self._entries:
                            self._entries.remove(e)
