"""What every collective module provides to the harness: sizes, busbw factor, buffers, call, check.

A module owns only what differs between collectives. Sizes follow nccl-tests: the size column is the
largest buffer a rank touches (max of send and receive bytes) and the count column is the per-rank
element count handed to the library.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from ..dtypes import DType


@dataclass(frozen=True)
class Case:
    """One measured configuration, as seen by one rank."""

    collective: str
    dtype: DType
    op: str | None          # None for collectives that do not reduce
    root: int               # -1 for collectives without a root
    inplace: bool
    count: int              # the count column (elements per rank, as nccl-tests prints it)
    send_count: int
    recv_count: int
    rank: int
    world: int
    device: str

    @property
    def nbytes(self) -> int:
        return max(self.send_count, self.recv_count) * self.dtype.itemsize


@dataclass
class Buffers:
    send: torch.Tensor
    recv: torch.Tensor


class Collective:
    name = ""
    reduces = False    # takes a reduction op
    rooted = False     # takes a root rank
    # Whether the out-of-place / in-place variants mean anything for this collective at all.
    variants = (False, True)

    def busbw_factor(self, world: int) -> float:
        raise NotImplementedError

    # What a collective that is more than a library call (an execution plan) hooks in; the
    # library collectives need none of it.
    def begin(self, backend, info) -> None:
        """Once per job, on every rank, before its first case."""

    def end(self) -> None:
        """Once per job, on every rank, after its last case (not after a failure)."""

    def sizes(self, sizes: list[int]) -> list[int]:
        """The sizes of the sweep this collective runs."""
        return sizes

    def record_fields(self) -> dict:
        """Fields its records carry besides (or instead of) the harness's."""
        return {}

    def counts(self, nbytes: int, itemsize: int, world: int) -> tuple[int, int, int]:
        """(count column, send elements, receive elements) for a requested size in bytes."""
        n = nbytes // itemsize
        return n, n, n

    def alloc(self, case: Case) -> Buffers:
        """Send and receive buffers; in place, the one that aliases the other is a view into it."""
        recv = torch.empty(case.recv_count, dtype=case.dtype.torch, device=case.device)
        if case.inplace and case.send_count == case.recv_count:
            return Buffers(recv, recv)
        send = torch.empty(case.send_count, dtype=case.dtype.torch, device=case.device)
        return Buffers(send, recv)

    def fill_inputs(self, case: Case, bufs: Buffers) -> None:
        raise NotImplementedError

    def call(self, case: Case, bufs: Buffers) -> tuple[str, tuple]:
        """One call of the collective: the adapter's method (backends/base.py) and its arguments."""
        raise NotImplementedError

    def run(self, backend, case: Case, bufs: Buffers) -> None:
        """One call, through the adapter's method."""
        name, args = self.call(case, bufs)
        getattr(backend, name)(*args)

    def bind(self, backend, case: Case, bufs: Buffers) -> Callable[[], object]:
        """The same call as `run`'s with everything that stays the same from call to call (the
        method, the arguments, the adapter's translation of them) resolved once: what the harness
        calls, so a timed call costs the library's call and nothing of ours beside it."""
        name, args = self.call(case, bufs)
        return backend.bind(name, *args)

    def wrong(self, case: Case, bufs: Buffers) -> int:
        """Wrong elements on this rank after one call on freshly filled inputs."""
        raise NotImplementedError

    def repeat_keeps_result(self, case: Case) -> bool:
        """Whether the buffers after several back-to-back calls still hold the result of one call
        on the filled inputs, so the last call of a timed loop can be checked where it lies. Out of
        place the inputs are never written, so yes; in place only where a call is idempotent on
        its own output (copies, min, max); an in-place sum feeds its result into the next call."""
        return not case.inplace

    def poison_outputs(self, case: Case, bufs: Buffers) -> None:
        """Poison what only the call writes (out of place: the receive buffer), so a timed loop
        whose calls left it untouched cannot pass its check on data a warm-up call wrote."""
        if not case.inplace and bufs.recv is not bufs.send and bufs.recv.numel():
            poison(bufs.recv)


def poison(t: torch.Tensor) -> None:
    """Fill an output buffer with a value verifiable data never holds, so stale output is caught."""
    if t.dtype.is_floating_point:
        t.fill_(float("nan"))
    else:
        t.fill_(torch.iinfo(t.dtype).min if t.dtype != torch.uint8 else 255)
