"""The plan reader's bounds (issue 36): nesting measured without recursion and right around
strings, every limit refused in one line naming it, channel pairing and a run's end found without
a scan per item (a plan of many channels or ranks was quadratic), a check's memory and steps
weighed before anything is allocated."""
from __future__ import annotations

import json

import pytest

from planfiles import FIXTURES, fixture
from wirespeed.plans.check import check
from wirespeed.plans.format import MAX_NESTING, PlanError, loads, nesting, parse


def _depth(v) -> int:
    if isinstance(v, dict):
        return 1 + max((_depth(x) for x in v.values()), default=0)
    if isinstance(v, list):
        return 1 + max((_depth(x) for x in v), default=0)
    return 0


@pytest.mark.parametrize("path", sorted(FIXTURES.glob("*.json")), ids=lambda p: p.stem)
def test_nesting_is_the_depth_of_every_fixture(path):
    data = path.read_bytes()
    assert nesting(data) == _depth(json.loads(data)) <= 11   # 9, and 2 more inside a pipeline


@pytest.mark.parametrize("text, depth", [
    (b'{"name": "[[[[{{{{"}', 1),                  # brackets in a string are text
    (b'["a\\"[[[", [[]]]', 3),                     # an escaped quote does not end the string
    (b'["a\\\\", [[]]]', 3),                       # an escaped backslash does not escape the quote
    (b'["\\\\\\"[", []]', 2),
    (b'"unterminated [[[[', 0),
    (b"[" * 50 + b"]" * 50, 50),
    (b"[]" * 1000, 1),
])
def test_nesting_counts_brackets_outside_strings_only(text, depth):
    assert nesting(text) == depth


def test_a_name_full_of_brackets_is_read():
    obj = fixture("allreduce_rsag_2r")
    obj["name"] = "[" * 1000 + '"\\' + "{" * 1000
    plan = parse(loads(json.dumps(obj).encode(), "p.json"), source="p.json")
    assert plan.name.startswith("[[[")


def test_nesting_past_the_limit_is_one_line_not_a_recursion_error():
    for depth in (MAX_NESTING + 1, 10_000, 1_000_000):
        with pytest.raises(PlanError, match=rf"^p.json: arrays and objects nested {depth} deep, more than the "
                           rf"{MAX_NESTING} wirespeed reads"):
            loads(b"[" * depth + b"]" * depth, "p.json")


@pytest.mark.timeout(5)
def test_many_channels_to_one_peer_pair_in_linear_time():
    """20,000 channels from rank 0 to rank 1: on 482a6d1 each searched the peer's list (11 s; 0.1 s now)."""
    n = 20_000
    gpus = [{"id": r, "input_chunks": 1, "output_chunks": 1, "scratch_chunks": 0,
             "channels": [{"channel_type": "memory", "connected_to": [1 - r] * (n if r == 0 else 1)}],
             "threadblocks": [{"id": 0, "ops": [{"name": "nop"}]}]} for r in range(2)]
    plan = parse({"name": "many", "collective": "test", "protocol": "Simple", "gpus": gpus})
    chans = plan.ranks[1].channels["memory"]
    assert len(chans) == n and [c.pair for c in chans[:3]] == [0, 1, 2]


@pytest.mark.timeout(30)
def test_a_simulation_of_thousands_of_ranks_ends_runs_by_count_not_by_scan():
    """6,000 ranks each copy their input to their output, 4 runs: the interpreter's run bookkeeping
    scanned every thread per finished block (quadratic: 46 s on 482a6d1; 2 s now)."""
    n = 6000
    gpus = [{"id": r, "input_chunks": 1, "output_chunks": 1, "scratch_chunks": 0,
             "threadblocks": [{"id": 0, "ops": [{"name": "copy", "src_buff": [{"type": "i", "index": 0, "size": 1}],
                                                 "dst_buff": [{"type": "o", "index": 0, "size": 1}]}]}]}
            for r in range(n)]
    from wirespeed.plans import simulate as sim
    from wirespeed.plans.topology import parse_topology
    plan = parse({"name": "copies", "collective": "test", "protocol": "Simple", "gpus": gpus})
    result = sim.simulate(plan, parse_topology("cpu-emulated"), 1024, runs=4)
    assert result.steps == n * 4


def test_a_check_past_its_memory_is_refused_before_it_allocates():
    plan = parse(fixture("allreduce_rsag_2r"), source="p.json")
    with pytest.raises(PlanError, match=r"^p.json: checking 2 ranks at 1048576 bytes x 2 runs needs about "
                       r"[0-9.]+ MiB of memory \(524288 words of buffers, vector clocks of 12 threads\), more "
                       r"than 1 MiB, the limit given"):
        check(plan, size=1 << 20, memory=1 << 20)
    with pytest.raises(PlanError, match=r"runs 36 steps \(pipelines unrolled\), more than the 10 a check runs"):
        check(plan, max_steps=10)
    assert check(plan).ok


def test_semaphore_initial_values_are_counted():
    from wirespeed.plans.interpret import Semaphore
    s = Semaphore(2**32 - 1)
    assert len(s) == 2**32 - 1 and s and s[0].vc is None
    s.append("released")
    assert s[2**32 - 1] == "released"
    s.initial = 1
    assert s.popleft().vc is None and s.popleft() == "released" and not s
