"""The copy bound printed by benchmarks/collectives_vs_mpi.py beside all_reduce's busbw: checked
against the bytes an all_reduce must move, derived here step by step, not against the formula."""
import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "collectives_vs_mpi.py"


def load():
    spec = importlib.util.spec_from_file_location("collectives_vs_mpi", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def busbw_from_bytes(n, cores, copy_bw, size):
    """Reduce-scatter then all-gather, each rank reading its peers' pieces: count each rank's copied
    bytes, spread the ranks over the cores (a core copies for one rank at a time), take the time."""
    piece = size / n
    per_rank = (n - 1) * piece + (n - 1) * piece  # reduce-scatter: n-1 pieces in; all-gather: n-1 out
    total = n * per_rank
    t = total / (min(n, cores) * copy_bw)
    return size / t * 2 * (n - 1) / n  # nccl-tests' busbw for all_reduce


@pytest.mark.parametrize("n,cores", [(2, 2), (4, 2), (8, 2), (3, 16), (4, 4), (2, 1)])
def test_bound_is_the_copy_time_of_the_bytes_all_reduce_moves(n, cores):
    mod = load()
    for size in (16 << 20, 64 << 20):
        assert mod.allreduce_copy_bound(n, cores, 5e9) == pytest.approx(busbw_from_bytes(n, cores, 5e9, size))


def test_bound_examples():
    mod = load()
    assert mod.allreduce_copy_bound(2, 2, 10e9) == pytest.approx(10e9)  # two ranks, two cores: the copy rate
    assert mod.allreduce_copy_bound(4, 2, 10e9) == pytest.approx(5e9)  # four ranks share two cores
    assert mod.allreduce_copy_bound(2, 1, 10e9) == pytest.approx(5e9)  # one core copies for both


@pytest.mark.parametrize("args", [(1, 2, 1e9), (2, 0, 1e9), (2, 2, 0.0)])
def test_bound_rejects_meaningless_input(args):
    with pytest.raises(ValueError):
        load().allreduce_copy_bound(*args)
