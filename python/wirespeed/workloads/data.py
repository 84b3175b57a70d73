"""Exact gradients and weights for a workload step, and the independent reference they are checked against.

Rank r's gradient at flat position i is bench/verifiable.py's value for (seed r, i), drawn from a
range narrow enough that the sum over every contribution stays an exact integer in the dtype, so
any summation order (ring, tree, reduce-then-broadcast, server accumulation) gives the same bits.

With `--optimizer sgd` each step applies w -= LR * g. LR is a power of two and the initial weights
are integers small enough that every partial result is an exact multiple of LR within the dtype's
range, so the update is exact too. The reference is computed here in int64/float64 from the seeds
alone, never from another rank's or another strategy's output.
"""
from __future__ import annotations

import hashlib

import torch

from ..bench.dtypes import DType
from ..bench.verifiable import CHUNK_ELEMS, rank_values, to_dtype

LR_EXP = 6
LR = 2.0 ** -LR_EXP          # SGD learning rate: a power of two keeps the update exact
WEIGHT_SEED = 1 << 20        # seed of the initial weights (far from any rank's seed)


def grad_divisor(contributions: int, optimizer: bool) -> int:
    """Range divisor for gradients: `contributions` of them summed (half the range with sgd,
    the other half is the weights')."""
    return max(1, contributions) * (2 if optimizer else 1)


def weight_divisor() -> int:
    # |w| <= limit / (2 / LR) so |w / LR| <= limit / 2: weights and the summed update share the range.
    return 2 << LR_EXP


def fill_grad(out: torch.Tensor, seed: int, start: int, dt: DType, divisor: int) -> None:
    """Rank `seed`'s gradient for flat positions [start, start + len(out))."""
    n = out.numel()
    for off in range(0, n, CHUNK_ELEMS):
        c = min(CHUNK_ELEMS, n - off)
        out[off:off + c].copy_(to_dtype(rank_values(seed, start + off, c, dt, "sum", divisor, out.device), dt))


def fill_weights(out: torch.Tensor, start: int, dt: DType) -> None:
    fill_grad(out, WEIGHT_SEED, start, dt, weight_divisor())


def reference(seeds, start: int, count: int, dt: DType, divisor: int, optimizer: bool,
              repeats: int = 1) -> torch.Tensor:
    """The exact result (float64) at flat positions [start, start + count): the gradient sum over
    `seeds`, applied `repeats` times; with sgd, the weights after those updates."""
    acc = torch.zeros(count, dtype=torch.int64)
    for s in seeds:
        acc += rank_values(s, start, count, dt, "sum", divisor)
    acc *= repeats
    if not optimizer:
        return acc.to(torch.float64)
    w = rank_values(WEIGHT_SEED, start, count, dt, "sum", weight_divisor())
    return ((w << LR_EXP) - acc).to(torch.float64) / (1 << LR_EXP)


class ErrorMeter:
    """Relative L1 error sum|got - exp| / sum|exp|, accumulated chunk by chunk over a rank's buffers."""

    def __init__(self):
        self.diff = 0.0
        self.norm = 0.0

    def add(self, got: torch.Tensor, start: int, expected) -> None:
        """expected(start, count) -> float64 tensor of the exact values of positions `start`.."""
        n = got.numel()
        for off in range(0, n, CHUNK_ELEMS):
            c = min(CHUNK_ELEMS, n - off)
            g = got[off:off + c].to("cpu", torch.float64)
            e = expected(start + off, c)
            d = (g - e).abs()
            # A NaN or inf where a finite value belongs is as wrong as it gets.
            self.diff += float("inf") if not torch.isfinite(d).all() else float(d.sum())
            self.norm += float(e.abs().sum())

    @staticmethod
    def combine(diff: float, norm: float) -> float:
        if norm == 0:
            return 0.0 if diff == 0 else float("inf")
        return diff / norm


def digest(tensors) -> str:
    """A short hash of the result's bytes, so two strategies' results can be compared bit for bit."""
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().to("cpu").contiguous().view(torch.uint8).numpy())  # no copy on CPU
    return h.hexdigest()[:16]
