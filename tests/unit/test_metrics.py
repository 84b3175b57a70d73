"""busbw factors and the size/count columns, as nccl-tests defines them (docs/metrics.md)."""
import pytest

from wirespeed.bench.collectives import COLLECTIVES
from wirespeed.bench.harness import percentile, summarize


@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
def test_busbw_factors(n):
    f = {name: c.busbw_factor(n) for name, c in COLLECTIVES.items()}
    assert f["all_reduce"] == pytest.approx(2 * (n - 1) / n)
    for name in ("reduce_scatter", "all_gather", "all_to_all"):
        assert f[name] == pytest.approx((n - 1) / n)
    for name in ("broadcast", "reduce", "send_recv"):
        assert f[name] == 1.0


def test_size_column_is_the_largest_buffer():
    # 1 MiB requested, 4 ranks, float32 (nccl-tests: all_gather/reduce_scatter size = the full buffer).
    S, n, item = 1 << 20, 4, 4
    assert COLLECTIVES["all_reduce"].counts(S, item, n) == (S // 4, S // 4, S // 4)
    assert COLLECTIVES["all_gather"].counts(S, item, n) == (S // 16, S // 16, S // 4)
    assert COLLECTIVES["reduce_scatter"].counts(S, item, n) == (S // 16, S // 4, S // 16)
    assert COLLECTIVES["all_to_all"].counts(S, item, n) == (S // 4, S // 4, S // 4)


def test_odd_sizes_round_down_to_whole_per_rank_chunks():
    count, send, recv = COLLECTIVES["all_gather"].counts(1000, 4, 3)  # 250 elements over 3 ranks
    assert (count, send, recv) == (83, 83, 249)


def test_summary_takes_slowest_rank_per_iteration_then_median():
    # rank 0 fast on iteration 0, rank 1 slow on it: the iteration costs the slow rank's time.
    per_rank = [[1.0, 2.0, 3.0], [4.0, 1.0, 1.0]]
    s = summarize(per_rank)
    assert s["time_us"] == pytest.approx(3.0e6)  # slowest: [4, 2, 3] -> median 3
    assert s["time_min_us"] == pytest.approx(2.0e6)
    assert s["time_max_us"] == pytest.approx(4.0e6)


def test_percentile_nearest_rank():
    vals = sorted(range(1, 101))
    assert percentile(vals, 99) == 99
    assert percentile(vals, 50) == 50
    assert percentile([5.0], 99) == 5.0


def test_cli_help_names_every_collective_in_registry_order():
    from wirespeed.cli.bench import COLLECTIVE_NAMES
    assert COLLECTIVE_NAMES == tuple(COLLECTIVES)


def test_loop_time_is_elapsed_over_iters_of_the_slowest_rank():
    from wirespeed.bench.harness import summarize_loop
    s = summarize_loop([[0.010], [0.030]], iters=10)  # one loop; rank 0: 1 ms per call, rank 1: 3 ms
    assert s["time_us"] == pytest.approx(3000.0)
    assert s["time_rank_mean_us"] == pytest.approx(2000.0)
    assert s["loops"] == 1


def test_the_time_is_the_median_loop_of_each_loops_slowest_rank():
    from wirespeed.bench.harness import summarize_loop
    # Three loops of 10 calls; the slowest rank differs from loop to loop. Per loop (us per call):
    # slowest 5000 (cold first loop), 2000, 2500; means 3000, 1500, 2000.
    s = summarize_loop([[0.050, 0.010, 0.025], [0.010, 0.020, 0.015]], iters=10)
    assert s["time_us"] == pytest.approx(2500.0)
    assert s["time_rank_mean_us"] == pytest.approx(2000.0)
    assert s["loops"] == 3 and s["time_loops_us"] == pytest.approx([5000.0, 2000.0, 2500.0])


@pytest.mark.parametrize("first_s,loops", [(1e-5, 5), (0.09, 5), (0.11, 3), (0.2, 1), (0.4, 1), (3.0, 1)])
def test_a_case_gets_fewer_loops_when_its_first_one_is_long(first_s, loops):
    from wirespeed.bench.harness import LOOPS, LOOPS_WITHIN_S, loops_for
    assert (LOOPS, LOOPS_WITHIN_S) == (5, 0.5)  # the figures below are for these
    assert loops_for(first_s) == loops


def test_single_calls_keep_the_slowest_rank_distribution():
    from wirespeed.bench.harness import summarize_ops
    s = summarize_ops([[1.0, 2.0, 3.0], [4.0, 1.0, 1.0]])
    assert (s["time_p50_us"], s["time_min_us"], s["time_max_us"]) == pytest.approx((3e6, 2e6, 4e6))


@pytest.mark.parametrize("coll,inplace,op,keeps", [
    ("all_reduce", False, "sum", True), ("all_reduce", True, "sum", False),
    ("all_reduce", True, "max", True), ("all_reduce", True, "avg", False),
    ("all_gather", True, None, True), ("broadcast", True, None, True),
    ("reduce_scatter", True, "min", False), ("reduce", True, "sum", False),
    ("send_recv", False, None, True)])
def test_which_results_survive_back_to_back_calls(coll, inplace, op, keeps):
    from wirespeed.bench.collectives.base import Case
    from wirespeed.bench.dtypes import DTYPES
    case = Case(coll, DTYPES["float32"], op, 0, inplace, 4, 4, 4, 0, 2, "cpu")
    assert COLLECTIVES[coll].repeat_keeps_result(case) is keeps
