"""Verifiable data: inputs whose reduced result is exact in any reduction order, as nccl-tests' are.

Each rank's value at global element index i is a hash of (seed, i) mapped into a range chosen per op:
- copies (gather, broadcast, all_to_all, send/recv) and min/max: any exactly representable integer;
- sum: integers small enough that the sum over all ranks stays exactly representable;
- avg: multiples of the world size, so sum/n is an exact integer as well;
- prod: 1, 2 or -1, so products are powers of two (exact, or an overflow every order agrees on).
So a correct collective reproduces the expected bytes exactly, and `#wrong` needs no tolerance
(float avg alone gets 2 ulp, as nccl-tests allows, for backends that pre-multiply by 1/n).

Everything is generated in chunks so checking a 1 GiB buffer never allocates gigabytes of temporaries.
"""
from __future__ import annotations

from typing import Callable

import torch

from .dtypes import DType

# Elements generated/compared at a time: small enough that temporaries stay in cache and are
# recycled by the allocator (fresh multi-MiB tensors cost a page fault per 4 KiB).
CHUNK_ELEMS = 1 << 18


def _hash(seed: int, start: int, count: int, device) -> torch.Tensor:
    """32-bit mix of (seed, index) as int64; products stay below 2**63 so nothing overflows.
    In-place ops only: this runs over every element of every checked buffer."""
    h = torch.arange(start, start + count, dtype=torch.int64, device=device)
    h.mul_(0x5BD1E995).add_((seed + 1) * 0x27D4EB2F).bitwise_and_(0xFFFFFFFF)
    h.bitwise_xor_(h >> 15)
    h.mul_(0x2C1B3C6D).bitwise_and_(0xFFFFFFFF)
    h.bitwise_xor_(h >> 13)
    return h


def _range_bits(dt: DType, op: str | None, world: int) -> int:
    """Values span [-2**k, 2**k) (signed) or [0, 2**k) (unsigned): a mask, not a slow modulo.
    For sum (avg) the bound keeps n (n*n) times the largest value exactly representable."""
    limit = min(dt.exact_limit, 1 << 30)
    if op == "sum":
        limit //= world
    elif op == "avg":
        limit //= world * world
    # Signed: |v| <= 2**k <= limit. Unsigned: v <= 2**k - 1 < limit, so the all-ones poison never occurs.
    return max(limit.bit_length() - 1, 0)


def rank_values(seed: int, start: int, count: int, dt: DType, op: str | None, world: int,
                device="cpu") -> torch.Tensor:
    """Input of the rank with this seed, elements [start, start+count), as int64 (exact)."""
    h = _hash(seed, start, count, device)
    if op == "prod":
        low = h.bitwise_and_(7)
        v = torch.ones_like(low)
        v.masked_fill_(low == 0, 2)
        if dt.signed:
            v.masked_fill_(low == 1, -1)
        return v
    k = _range_bits(dt, op, world)
    if dt.signed:
        v = h.bitwise_and_((2 << k) - 1).sub_(1 << k)
    else:
        v = h.bitwise_and_((1 << k) - 1)
    if op == "avg":
        v.mul_(world)
    return v


def to_dtype(v: torch.Tensor, dt: DType) -> torch.Tensor:
    """int64 -> dtype; integers wrap (two's complement) exactly as every backend's arithmetic does."""
    if dt.is_float:
        return v.to(dt.torch)  # exact: every value is an integer the format represents
    if dt.itemsize < 8:
        bits = dt.itemsize * 8
        v = v & ((1 << bits) - 1)
        if dt.signed:
            v = torch.where(v >= (1 << (bits - 1)), v - (1 << bits), v)
    return v.to(dt.torch)


def reduce_values(seeds, start: int, count: int, dt: DType, op: str, world: int,
                  device="cpu") -> torch.Tensor:
    """The exact reduction over the given seeds' inputs, elements [start, start+count), in dtype."""
    acc = None
    for seed in seeds:
        v = rank_values(seed, start, count, dt, op, world, device)
        if acc is None:
            acc = v  # rank_values returns a fresh tensor
        elif op in ("sum", "avg"):
            acc += v
        elif op == "prod":
            acc *= v
        elif op == "min":
            acc = torch.minimum(acc, v)
        elif op == "max":
            acc = torch.maximum(acc, v)
        else:
            raise ValueError(op)
    if acc is None:
        acc = torch.zeros(count, dtype=torch.int64, device=device)
    if op == "avg":
        acc = torch.div(acc, len(seeds), rounding_mode="trunc")
    if op == "prod" and dt.is_float:
        # Powers of two past the format's range become inf, as they would in the backend.
        return acc.to(torch.float64).to(dt.torch)
    return to_dtype(acc, dt)


def gathered_values(chunk: int, src_offset: int, off: int, n: int, dt: DType, world: int,
                    device="cpu") -> torch.Tensor:
    """Elements [off, off+n) of an output made of one `chunk`-element piece from each rank in rank
    order, piece r being rank r's input from element `src_offset` on (all_gather: 0; all_to_all:
    the receiver's own chunk of the sender's buffer)."""
    parts = []
    pos = off
    while pos < off + n:
        src, within = divmod(pos, chunk)
        take = min(chunk - within, off + n - pos)
        parts.append(rank_values(src, src_offset + within, take, dt, None, world, device))
        pos += take
    return to_dtype(torch.cat(parts) if parts else torch.empty(0, dtype=torch.int64, device=device), dt)


def fill(out: torch.Tensor, seed: int, start: int, dt: DType, op: str | None, world: int) -> None:
    """Write a rank's input for global elements [start, start+len(out)) into `out`, chunk by chunk."""
    n = out.numel()
    for off in range(0, n, CHUNK_ELEMS):
        c = min(CHUNK_ELEMS, n - off)
        out[off:off + c].copy_(to_dtype(rank_values(seed, start + off, c, dt, op, world, out.device), dt))


def count_wrong(result: torch.Tensor, expected: Callable[[int, int], torch.Tensor], dt: DType,
                op: str | None) -> int:
    """Elements of `result` that differ from expected(offset, count), compared chunk by chunk."""
    n = result.numel()
    wrong = 0
    for off in range(0, n, CHUNK_ELEMS):
        c = min(CHUNK_ELEMS, n - off)
        got = result[off:off + c]
        exp = expected(off, c).to(got.device)
        if op == "avg" and dt.is_float:
            # 2 ulp, as nccl-tests allows, for backends that pre-multiply each input by 1/n.
            tol = 2 * torch.finfo(dt.torch).eps * exp.abs().to(torch.float64)
            bad = (got.to(torch.float64) - exp.to(torch.float64)).abs() > tol
        else:
            # NaN (the poison) compares unequal to everything, so a stale output counts as wrong;
            # inf == inf counts as right (an overflowing prod every order agrees on).
            bad = got != exp
        wrong += int(bad.sum().item())
    return wrong
