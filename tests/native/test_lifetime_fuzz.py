"""The lifetime fuzzer (worker_lifetime_fuzz.py) at 2 and 4 ranks: thousands of random async ops
with inputs and Works dropped, waits out of order and the allocator churned, every result checked.
One fixed seed, and one new seed per run (set FUZZ_SEED to replay one); a failure names its seed."""
import os
import random

import pytest

from .ranks import run_ranks

OPS = 3000
SEEDS = (20261125, int(os.environ.get("FUZZ_SEED", random.SystemRandom().randrange(1 << 30))))


@pytest.mark.slow
@pytest.mark.parametrize("seed", SEEDS, ids=("fixed", "fresh"))
@pytest.mark.parametrize("world", (2, 4))
def test_random_async_ops_with_dropped_inputs_give_exact_results(world, seed):
    res = run_ranks("worker_lifetime_fuzz.py", world, timeout=600, args=(seed, OPS))
    for rank, r in enumerate(res):
        assert r["checked"] == OPS, f"seed {seed} (FUZZ_SEED={seed} to replay), rank {rank}: {r}"
        assert not r["problems"], f"seed {seed} (FUZZ_SEED={seed} to replay), rank {rank}: {r['problems']}"
