"""`wirespeed bench --trace F.json` (issue 38): every timed call of every rank as a span in a
Chrome/Perfetto file, nested in its loop's span, the counts matching what the records say ran."""
import json
from collections import Counter

import pytest

from wirespeed.report.trace import check_schema


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["wirespeed", "gloo"])
def test_bench_trace_has_every_timed_call_of_both_ranks(run_cli, tmp_path, backend):
    path, records = tmp_path / "t.json", tmp_path / "r.jsonl"
    iters = 4
    p = run_cli("bench", "-N", "2", "--backend", backend, "-c", "all_reduce,all_gather", "--sizes", "4K,64K",
                "-n", iters, "-w", "1", "--no-save", "--no-progress", "--json", records, "--trace", path,
                timeout=170)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    trace = json.loads(path.read_text())
    assert check_schema(trace) == []
    events = trace["traceEvents"]
    assert {e["args"]["name"] for e in events if e["name"] == "process_name"} == {"rank 0", "rank 1"}
    spans = [e for e in events if e["ph"] == "X"]
    assert f"# trace: {len(spans)} spans of 2 ranks in {path}" in p.stdout
    # What ran, from the records: per case, its loops of `iters` calls and `iters` single calls.
    recs = [json.loads(line) for line in records.read_text().splitlines()]
    want = Counter()
    for r in recs:
        key = (r["collective"], r["bytes"], r["inplace"])
        want[key + ("call",)] += r["loops"] * iters
        want[key + ("loop",)] += r["loops"]
        want[key + ("single call",)] += iters
    for rank in (0, 1):
        got = Counter((e["args"]["collective"], e["args"]["bytes"], e["args"]["inplace"], e["cat"])
                      for e in spans if e["pid"] == rank)
        assert got == want, (rank, got, want)
        # each loop's calls lie inside it, in order, one after another
        mine = [e for e in spans if e["pid"] == rank]
        for loop in (e for e in mine if e["cat"] == "loop"):
            calls = [e for e in mine if e["cat"] == "call" and e["args"]["collective"] == loop["args"]["collective"]
                     and e["args"]["bytes"] == loop["args"]["bytes"] and e["args"]["inplace"] == loop["args"]["inplace"]
                     and e["args"]["loop"] == loop["args"]["loop"]]
            assert [c["args"]["iteration"] for c in calls] == list(range(1, iters + 1))
            assert loop["ts"] <= calls[0]["ts"] and calls[-1]["ts"] + calls[-1]["dur"] <= loop["ts"] + loop["dur"] + 0.01
            assert all(a["ts"] + a["dur"] <= b["ts"] + 0.01 for a, b in zip(calls, calls[1:]))
            assert {c["args"]["dtype"] for c in calls} == {"float32"}

