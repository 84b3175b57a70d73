"""The interface the harness drives. Buffers are 1-D torch tensors on the backend's device.

Every collective takes (send, recv): in place, `send` is `recv` or a view into it (see each
collective module for the layout). An adapter says per case whether it can run it (`unsupported`)
rather than emulating a missing variant with extra copies, so a timed figure is always the library's.
"""
from __future__ import annotations

import functools
from typing import Callable

import torch

from ..launch.environment import RankInfo  # noqa: F401 - adapters and callers name it here


class Backend:
    name = ""

    def init(self, info: RankInfo, device: str, timeout_s: float) -> None:
        raise NotImplementedError

    def shutdown(self) -> None:
        pass

    def device_for(self, info: RankInfo, device: str) -> str:
        """The torch device string this rank's buffers live on."""
        if device == "cuda":
            return f"cuda:{info.local_rank % max(torch.cuda.device_count(), 1)}"
        return "cpu"

    def unsupported(self, collective: str, dtype: str, op: str | None, inplace: bool,
                    device: str, world: int | None = None) -> str | None:
        """None when the case can run, else a short reason shown in place of the figures. `world`:
        the job's rank count, for a check before the ranks start (else the started job's)."""
        return None

    def version(self) -> str:
        return ""

    def synchronize(self) -> None:
        """Wait for the device to finish queued work, so a host timer covers the whole collective."""

    def start_line(self) -> None:
        """Every rank at one point: the harness's barrier before (and at the start of) a timed
        loop, whose clock counts it once per loop. The library's barrier, called as directly as
        the adapter can (the `barrier` collective, timed as such, stays the user's call)."""
        self.barrier()

    def bind(self, name: str, *args) -> Callable[[], object]:
        """One call of collective `name` (a method below) on these arguments, as a callable with no
        arguments: what a timed loop calls again and again. An adapter resolves here once what its
        method would translate on every call (the op's enum, MPI's buffer views), so the loop pays
        the library's call alone. Valid while the tensors in `args` live."""
        return functools.partial(getattr(self, name), *args)

    # The collectives.
    def all_reduce(self, send, recv, op): raise NotImplementedError
    def all_gather(self, send, recv): raise NotImplementedError
    def reduce_scatter(self, send, recv, op): raise NotImplementedError
    def broadcast(self, send, recv, root): raise NotImplementedError
    def reduce(self, send, recv, op, root): raise NotImplementedError
    def all_to_all(self, send, recv): raise NotImplementedError
    def send_recv(self, send, recv, to, frm): raise NotImplementedError
    def barrier(self): raise NotImplementedError

    def allgather_floats(self, values: list[float]) -> list[list[float]]:
        """Every rank's list of floats (same length on every rank), for timing and error totals."""
        raise NotImplementedError

    def allgather_text(self, text: str) -> list[str]:
        """Every rank's string (its first 63 bytes), in rank order: host names, GPU ids."""
        name = text.encode()[:63]
        rows = self.allgather_floats([float(len(name))] + [float(b) for b in name.ljust(63, b"\0")])
        return [bytes(int(x) for x in row[1:1 + int(row[0])]).decode(errors="replace") for row in rows]

    def host_names(self) -> list[str]:
        """Every rank's host name, in rank order (an emulated host's is its own: cluster.py)."""
        import socket
        return self.allgather_text(socket.gethostname())
