"""The checker catches wrong data. A real gloo rank (world of 1, in this process) whose adapter
corrupts one element after each call: fault injection, the library call itself is real."""
import datetime

import pytest
import torch.distributed as dist

from wirespeed.backends.base import RankInfo
from wirespeed.backends.torch_dist import TorchDistBackend
from wirespeed.bench.config import BenchConfig
from wirespeed.bench.harness import LOOPS, run_rank


def _bench_alone(tmp_path, backend, cfg):
    """`run_rank` on a real gloo world of one in this process: (its records, its total wrong)."""
    info = RankInfo(0, 1, 0, 1, "127.0.0.1", 0)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=30))
    try:
        results = []
        total = run_rank(cfg, info, backend, "cpu", results.append)
    finally:
        dist.destroy_process_group()
    return results, total


class CorruptingGloo(TorchDistBackend):
    def all_reduce(self, send, recv, op):
        super().all_reduce(send, recv, op)
        if recv.numel():
            recv[recv.numel() // 2] += 1

    def all_gather(self, send, recv):
        super().all_gather(send, recv)
        if recv.numel() > 1:
            recv[:2] = recv[:2].flip(0)  # swapped elements: a placement error


@pytest.mark.timeout(60)
def test_wrong_elements_are_counted(tmp_path):
    cfg = BenchConfig(collectives=["all_reduce", "all_gather"], dtypes=["float32", "int8"],
                      sizes=[0, 64, 4096], warmup_iters=0, iters=2, timeout_s=30)
    results, total = _bench_alone(tmp_path, CorruptingGloo("gloo"), cfg)
    by = {(r["collective"], r["dtype"], r["bytes"], r["inplace"]): r["wrong"] for r in results}
    # One corrupted element per non-empty all_reduce; two swapped ones per all_gather (int8 values may
    # coincide, so at least one), none for empty buffers.
    assert by[("all_reduce", "float32", 64, True)] == 1
    assert by[("all_reduce", "int8", 4096, True)] == 1
    assert by[("all_reduce", "float32", 0, True)] == 0
    assert by[("all_gather", "float32", 4096, False)] == 2
    assert total == sum(by.values()) > 0


class CorruptsOneCall(TorchDistBackend):
    """Swaps two output elements of one numbered all_gather call only."""

    def __init__(self, name, bad_call):
        super().__init__(name)
        self.calls = 0
        self.bad_call = bad_call

    def all_gather(self, send, recv):
        super().all_gather(send, recv)
        self.calls += 1
        if self.calls == self.bad_call and recv.numel() > 1:
            recv[:2] = recv[:2].flip(0)


@pytest.mark.timeout(60)
def test_the_last_call_of_the_timed_loops_is_checked(tmp_path):
    # 1 warm-up call, then LOOPS loops of 3 calls (calls 2..16): corrupting the last only must be
    # caught, since an out-of-place all_gather's buffers still hold what the last timed call wrote.
    cfg = BenchConfig(collectives=["all_gather"], sizes=[4096], warmup_iters=1, iters=3,
                      timeout_s=30, per_op=False)
    results, _ = _bench_alone(tmp_path, CorruptsOneCall("gloo", bad_call=1 + LOOPS * 3), cfg)
    oop = [r for r in results if not r["inplace"]][0]
    assert oop["loops"] == LOOPS  # so the corrupted call was the last timed one
    assert oop["wrong"] == 2 and oop["time_method"] == "loops-median" and "time_p50_us" not in oop


class BoundCallCorrupts(TorchDistBackend):
    """The adapter's method is right, the call `bind` hands the timed loops is not: what a slip in
    a backend's bound-call table would do."""

    def bind(self, name, *args):
        right = super().bind(name, *args)
        if name != "all_reduce":
            return right
        recv = args[1]

        def wrong():
            right()
            if recv.numel():
                recv[0] += 1
        return wrong


@pytest.mark.timeout(60)
def test_the_timed_call_is_the_checked_call(tmp_path):
    # An in-place sum feeds its result into the next call, so it is checked on one more call on
    # fresh inputs: that call must be the bound one the loops timed, not the adapter's method.
    cfg = BenchConfig(collectives=["all_reduce"], dtypes=["float32"], sizes=[4096],
                      warmup_iters=0, iters=2, timeout_s=30)
    results, _ = _bench_alone(tmp_path, BoundCallCorrupts("gloo"), cfg)
    assert [r["wrong"] for r in results if r["inplace"]] == [1], results
