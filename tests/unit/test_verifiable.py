"""The exact-data property the checks rest on: any reduction order gives the expected bytes."""
import random

import pytest
import torch

from wirespeed.bench import verifiable as v
from wirespeed.bench.dtypes import DTYPES, OPS


def _reduce_in_dtype(tensors, op, world):
    """Reduce in the tensors' own dtype (as a backend might), in the given order."""
    acc = tensors[0].clone()
    for t in tensors[1:]:
        if op in ("sum", "avg"):
            acc = acc + t
        elif op == "prod":
            acc = acc * t
        elif op == "min":
            acc = torch.minimum(acc, t)
        else:
            acc = torch.maximum(acc, t)
    if op == "avg":
        acc = acc / world if acc.dtype.is_floating_point else torch.div(acc, world, rounding_mode="trunc")
    return acc


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("world", [1, 3, 8])
def test_any_order_gives_the_expected_result(dtype, op, world):
    dt = DTYPES[dtype]
    n = 5000
    inputs = [v.to_dtype(v.rank_values(r, 0, n, dt, op, world), dt) for r in range(world)]
    expected = v.reduce_values(range(world), 0, n, dt, op, world)
    rng = random.Random(world * 31 + len(dtype))
    for _ in range(3):
        order = list(range(world))
        rng.shuffle(order)
        got = _reduce_in_dtype([inputs[i] for i in order], op, world)
        if op == "avg" and dt.is_float:
            assert v.count_wrong(got, lambda off, c: expected[off:off + c], dt, op) == 0
        else:
            assert torch.equal(got, expected), (dtype, op, world, order)


def test_values_are_not_periodic_and_differ_between_ranks():
    dt = DTYPES["float32"]
    a = v.rank_values(0, 0, 4096, dt, None, 4)
    b = v.rank_values(1, 0, 4096, dt, None, 4)
    assert (a != b).float().mean() > 0.99
    assert (a[:-5] != a[5:]).float().mean() > 0.99  # a shifted chunk would be caught


def test_count_wrong_counts_each_bad_element_once():
    dt = DTYPES["int32"]
    n = v.CHUNK_ELEMS + 10  # spans two chunks
    exp = lambda off, c: v.to_dtype(v.rank_values(2, off, c, dt, None, 4), dt)
    t = torch.empty(n, dtype=torch.int32)
    v.fill(t, 2, 0, dt, None, 4)
    assert v.count_wrong(t, exp, dt, None) == 0
    t[3] += 1
    t[-1] += 1
    assert v.count_wrong(t, exp, dt, None) == 2


def test_nan_poison_counts_as_wrong():
    dt = DTYPES["float16"]
    t = torch.full((100,), float("nan"), dtype=torch.float16)
    assert v.count_wrong(t, lambda off, c: torch.zeros(c, dtype=torch.float16), dt, None) == 100
