"""report/trace.py: the trace file bench and train write loads as Chrome/Perfetto JSON."""
import json

from wirespeed.report import trace


def test_merged_spans_carry_the_viewer_fields_and_start_at_zero(tmp_path):
    a, b = trace.Spans(0), trace.Spans(1)
    a.span("forward", 1000.0, 1500.0, track="compute")
    a.span("all_reduce", 1500.0, 1800.0, track="comm", bytes=4096)
    b.span("forward", 1010.0, 1490.0, track="compute")
    merged = trace.merge([b.as_data(), a.as_data()], offset_us={1: 5.0})
    path = tmp_path / "t.json"
    trace.write(str(path), merged)
    loaded = json.loads(path.read_text())
    assert trace.check_schema(loaded) == []
    spans = [e for e in loaded["traceEvents"] if e["ph"] == "X"]
    assert min(e["ts"] for e in spans) == 0
    by = {(e["pid"], e["name"]): e for e in spans}
    assert by[(0, "all_reduce")]["args"] == {"bytes": 4096}
    assert by[(0, "forward")]["dur"] == 500.0
    assert by[(1, "forward")]["ts"] == 15.0          # 1010 + 5 - 1000
    names = {(e["pid"], e["args"]["name"]) for e in loaded["traceEvents"] if e["name"] == "thread_name"}
    assert names == {(0, "compute"), (0, "comm"), (1, "compute")}


def test_schema_check_names_what_a_viewer_rejects():
    assert trace.check_schema({}) == ["no traceEvents list"]
    bad = {"traceEvents": [{"ph": "X", "name": "x", "pid": 0, "tid": 0, "ts": 1}, {"ph": "Q"}]}
    assert trace.check_schema(bad) == ["event 0: no dur", "event 0: dur None", "event 1: ph 'Q'"]
