"""A progress bar over the sweep on a terminal; silent when stderr is not one (CI, pipes, files)."""
from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, total: int, enabled: bool = True, stream=None):
        self.stream = stream or sys.stderr
        self.total = max(total, 1)
        self.done = 0
        self.enabled = enabled and self.stream.isatty()
        self.start = time.monotonic()

    def advance(self, label: str = "") -> None:
        self.done += 1
        if not self.enabled:
            return
        width = 30
        filled = int(width * self.done / self.total)
        elapsed = time.monotonic() - self.start
        self.stream.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} "
                          f"{elapsed:5.0f}s {label[:40]:<40}")
        self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\r" + " " * 90 + "\r")
            self.stream.flush()
