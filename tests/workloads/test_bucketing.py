"""Buckets are DDP's: checked against torch's own assignment (reducer.cpp) given the gradient-ready
order, i.e. reverse parameter order, with a 1 MiB first bucket."""
import pytest
import torch
import torch.distributed as dist

from wirespeed.errors import UsageError
from wirespeed.workloads.bucketing import DDP_FIRST_BUCKET_BYTES, parse_bucket_mb, plan_buckets
from wirespeed.workloads.models import model_shapes


def torch_assignment(numels, itemsize, cap):
    dtype = {4: torch.float32, 2: torch.float16, 8: torch.float64}[itemsize]
    ts = [torch.empty(n, dtype=dtype, device="meta") for n in numels]
    order = list(range(len(numels)))[::-1]
    groups, _ = dist._compute_bucket_assignment_by_size(
        [ts[i] for i in order], [DDP_FIRST_BUCKET_BYTES, cap], [False] * len(ts), order)
    return [list(g) for g in groups]


@pytest.mark.parametrize("model,cap_mb,itemsize", [
    ("resnet50", 25, 4), ("resnet18", 1, 4), ("vgg16", 25, 2), ("gpt2", 5, 8), ("inception_v3", 0.5, 4),
])
def test_ddp_buckets_match_torch(model, cap_mb, itemsize):
    assert DDP_FIRST_BUCKET_BYTES == dist._DEFAULT_FIRST_BUCKET_BYTES
    numels = [p.numel for p in model_shapes(model).params]
    cap = int(cap_mb * (1 << 20))
    plan = plan_buckets(numels, itemsize, "ddp", cap)
    assert [list(b.params) for b in plan.buckets] == torch_assignment(numels, itemsize, cap)
    # Launch order covers every parameter once, last layer first, in contiguous flat ranges.
    flat = [p for b in plan.buckets for p in b.params]
    assert flat == list(range(len(numels)))[::-1]
    offset = 0
    for b in plan.buckets:
        assert b.offset == offset and b.numel == sum(numels[p] for p in b.params)
        offset += b.numel
    first = plan.buckets[0].numel * itemsize
    assert first >= DDP_FIRST_BUCKET_BYTES or len(plan.buckets) == 1
    assert first - numels[plan.buckets[0].params[-1]] * itemsize < DDP_FIRST_BUCKET_BYTES


def test_per_tensor_and_flat():
    numels = [10, 20, 30]
    per = plan_buckets(numels, 4, "per-tensor")
    assert [b.params for b in per.buckets] == [(2,), (1,), (0,)]
    assert [b.offset for b in per.buckets] == [0, 30, 50]
    flat = plan_buckets(numels, 4, "flat")
    assert len(flat.buckets) == 1 and flat.buckets[0].numel == 60 and flat.buckets[0].params == (2, 1, 0)


def test_parse_bucket_mb():
    assert parse_bucket_mb("25") == ("ddp", 25 << 20)
    assert parse_bucket_mb("0.5") == ("ddp", 1 << 19)
    assert parse_bucket_mb("0") == ("per-tensor", 0)
    assert parse_bucket_mb("FLAT") == ("flat", 0)
    for bad in ("-1", "big", "nan"):
        with pytest.raises(UsageError):
            parse_bucket_mb(bad)
