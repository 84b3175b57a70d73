"""bench's time is the library's time (issue 25): in the same two processes, on the same buffers,
the harness's `measure` (what `wirespeed bench` runs for a size) against a bare loop over the
library's own call (`torch.distributed.all_reduce(t)`; mpi4py's `comm.Allreduce` for mpi), timed as
an independent loop-average script times it. benchmarks/bench_overhead.py does the measuring (the
same script prints the figures at 4 KiB, 64 KiB and 1 MiB); this asserts ratios, never a time.

Before the fix, at 4 KiB on this 2-core VM, the median over 6 tries of a try's ratio: wirespeed
1.10-1.18 (a cold first loop right after the refill as the only sample, torch's barrier wrapper and
our adapter layers in the timed loop), Open MPI 1.19-1.40 (mpi4py buffer views and the op looked up
on every call); after: wirespeed 1.02-1.05, Open MPI 1.00-1.04. The bound sits between the two.
With more runnable processes than cores for the whole test (a busy loop beside it on this 2-core
machine), every barrier costs a time slice and Open MPI's read 1.09-1.12: bench's loop holds one
barrier (its start line, which keeps any byte from crossing before a rank's clock starts), the
bare loop none.

gloo's figures on this machine are mostly scheduler noise (a 4 ms stall now and then in a loop of
20 calls of 0.3 ms; one try's ratio of medians ranged 0.3-2.9 before and after), so its assertion
is on the 20th percentile of every loop either side ran, the plain loops' time, with a wider
bound: it catches anything that costs a sizeable share of a gloo call (a barrier per call, an
allgather per loop in the timed region), not the last percent.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from wirespeed.backends.registry import availability

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_overhead.py"


def _run(backend: str, tries: int, tmp_path: Path) -> dict:
    out = tmp_path / f"{backend}.json"
    p = subprocess.run([sys.executable, str(SCRIPT), "--backends", backend, "--sizes", "4K",
                        "--tries", str(tries), "--json", str(out)], capture_output=True, text=True, timeout=170)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    (row,) = json.loads(out.read_text())[backend]
    assert len(row["tries"]) == tries and row["bytes"] == 4096
    return row


@pytest.mark.slow
@pytest.mark.timeout(600)
# A try is one `measure` and one set of bare loops, back to back; a run is `tries` tries in a fresh
# pair of processes (on a VM a pair's speed depends on where its vCPUs landed), and the test takes
# the best of `runs` runs, so a noisy machine does not fail it.
@pytest.mark.parametrize("backend,key,bound,tries,runs", [
    ("wirespeed", "ratio_median", 1.08, 6, 3),
    ("mpi", "ratio_median", 1.08, 6, 3),
    ("gloo", "ratio_low_loops", 1.25, 8, 3),
])
def test_bench_times_what_a_bare_loop_of_the_library_call_times(backend, key, bound, tries, runs, tmp_path):
    why = availability(backend)
    if why:
        pytest.skip(f"{backend} unavailable: {why}")
    seen = []
    for _ in range(runs):
        row = _run(backend, tries, tmp_path)
        seen.append(round(row[key], 3))
        if row[key] <= bound:
            return
    pytest.fail(f"{backend}, 4 KiB all_reduce: bench / bare loop = {seen} ({key}) in {runs} runs, "
                f"all above {bound}: bench adds to the library's time (last run's tries, bench/bare us: "
                + " ".join(f"{t['bench_us']:.1f}/{t['bare_us']:.1f}" for t in row["tries"]) + ")")
