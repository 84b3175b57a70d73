"""How a step's gradients become communication calls: DDP buckets, one call per tensor, or one flat buffer.

DDP (torch/nn/parallel/distributed.py and reducer.cpp) in its steady state, after the first
iteration's bucket rebuild, assigns parameters in the order their gradients become ready, which is
about the reverse of the parameter order; it fills a bucket until it holds at least the limit, then
starts the next. The first bucket's limit is only 1 MiB, so the first all_reduce starts early in
the backward pass; the rest use --bucket-mb (25 MiB by default). tests/workloads/test_bucketing.py
checks this against torch's own `_compute_bucket_assignment_by_size`.

Gradients live in one flat order, the buckets' launch order, so a bucket is a contiguous range of
that order (its `offset` and `numel`); exact test data are indexed by that position.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import UsageError

DDP_FIRST_BUCKET_BYTES = 1 << 20  # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES


@dataclass(frozen=True)
class Bucket:
    index: int
    params: tuple[int, ...]   # parameter indices, in the order they sit in the bucket
    offset: int               # first element in the flat launch order
    numel: int


@dataclass(frozen=True)
class BucketPlan:
    mode: str                 # "ddp", "per-tensor" or "flat"
    bucket_bytes: int         # the limit for mode "ddp", else 0
    buckets: tuple[Bucket, ...]

    @property
    def numel(self) -> int:
        return sum(b.numel for b in self.buckets)

    def describe(self, itemsize: int) -> str:
        if self.mode == "flat":
            return "flat: every gradient in one buffer, one call"
        if self.mode == "per-tensor":
            return f"per tensor: {len(self.buckets)} calls, in reverse parameter order"
        return (f"DDP buckets of {self.bucket_bytes / (1 << 20):g} MiB (first 1 MiB), "
                f"{len(self.buckets)} buckets in reverse parameter order")


def parse_bucket_mb(text: str) -> tuple[str, int]:
    """'25' -> ('ddp', 25 MiB); '0' -> ('per-tensor', 0); 'flat' -> ('flat', 0)."""
    t = str(text).strip().lower()
    if t == "flat":
        return "flat", 0
    try:
        mb = float(t)
    except ValueError:
        raise UsageError(f"--bucket-mb must be a number of MiB, 0 (one call per tensor) or flat, "
                         f"got {text!r}") from None
    if mb < 0 or mb != mb:
        raise UsageError(f"--bucket-mb must not be negative, got {text!r}")
    return ("per-tensor", 0) if mb == 0 else ("ddp", int(mb * (1 << 20)))


def _assemble(mode: str, limit: int, groups: list[list[int]], numels: list[int]) -> BucketPlan:
    buckets, offset = [], 0
    for i, g in enumerate(groups):
        n = sum(numels[p] for p in g)
        buckets.append(Bucket(i, tuple(g), offset, n))
        offset += n
    return BucketPlan(mode, limit, tuple(buckets))


def plan_buckets(numels: list[int], itemsize: int, mode: str, bucket_bytes: int = 0,
                 first_bucket_bytes: int = DDP_FIRST_BUCKET_BYTES) -> BucketPlan:
    """Group parameters (given by element counts, in parameter order) into launch-ordered buckets."""
    order = list(range(len(numels)))[::-1]  # gradients become ready last layer first
    if mode == "flat":
        return _assemble(mode, 0, [order] if order else [], numels)
    if mode == "per-tensor":
        return _assemble(mode, 0, [[p] for p in order], numels)
    if mode != "ddp" or bucket_bytes <= 0:
        raise ValueError(f"bad bucket mode {mode!r} / {bucket_bytes}")
    groups: list[list[int]] = []
    current: list[int] = []
    size, limit = 0, first_bucket_bytes
    for p in order:
        current.append(p)
        size += numels[p] * itemsize
        if size >= limit:  # a bucket closes once it reaches its limit, as reducer.cpp does
            groups.append(current)
            current, size, limit = [], 0, bucket_bytes
    if current:
        groups.append(current)
    return _assemble(mode, bucket_bytes, groups, numels)
