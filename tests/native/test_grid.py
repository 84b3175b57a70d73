"""Every collective x dtype x op x world size (1-5, and 8 ranks on 2 cores) on the wirespeed
backend, bit-exact against gloo and the exact reference, with zero, odd and cross-memory sizes.
One launch of 8 real rank processes; smaller worlds are sub-groups of it."""
import pytest

from .ranks import run_ranks


@pytest.mark.timeout(600)
def test_every_collective_dtype_op_and_world_matches_gloo_bit_for_bit():
    results = run_ranks("worker_grid.py", 8, timeout=580)
    failures = [f"rank {r['rank']}: {f}" for r in results for f in r["failures"]]
    assert not failures, "\n".join(failures[:40])
    assert all(r["checked"] > 100 for r in results), [r["checked"] for r in results]
