"""`wirespeed train --trace`: a real 2-rank DDP run's Chrome/Perfetto trace loads (report/trace.py's
schema check, and the fields Perfetto's JSON importer needs), and places what it shows where it
happened: per rank and step a forward, a backward and an optimizer span in that order, every
DDP bucket after its step's forward pass began its backward, and FSDP2's all-gathers and
reduce-scatters within their step."""
import json

import pytest

from wsutil import wirespeed
from wirespeed.report.trace import check_schema

TINY_GPT = ["--model", "gpt", "--layers", "2", "--hidden", "32", "--seq-len", "16", "--vocab", "64",
            "--batch-size", "2"]


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_the_trace_shows_each_ranks_steps_and_buckets(tmp_path, parallel):
    path = tmp_path / "trace.json"
    # small buckets: several per step
    extra = ["--bucket-mb", "0.05"] if parallel == "ddp" else []
    p = wirespeed("train", *TINY_GPT, "--parallel", parallel, "--backend", "gloo", "-N", "2", "-w", "1",
                  "-n", "3", "--no-save", "--no-scaling", "--trace", path, *extra, timeout=250)
    assert p.returncode == 0, p.stdout + p.stderr
    trace = json.loads(path.read_text())
    assert check_schema(trace) == []
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert all({"name", "ts", "dur", "pid", "tid"} <= set(e) for e in spans)
    assert {e["pid"] for e in spans} == {0, 1}
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    assert names == {"rank 0", "rank 1"}
    comm_tid = {e["pid"]: e["tid"] for e in trace["traceEvents"]
                if e["name"] == "thread_name" and e["args"]["name"] == "comm"}
    for rank in (0, 1):
        mine = [e for e in spans if e["pid"] == rank]
        for step in (1, 2, 3):
            got = {e["name"]: e for e in mine if e["args"]["step"] == step}
            f, b, o = got["forward"], got["backward"], got["optimizer"]
            assert f["ts"] + f["dur"] <= b["ts"] + 1 and b["ts"] + b["dur"] <= o["ts"] + 1
            buckets = [e for e in mine if e["args"]["step"] == step and e["name"].startswith("bucket")]
            if parallel == "ddp":
                assert len(buckets) >= 2, buckets
                for e in buckets:   # handed over during backward, back before the optimizer ran
                    assert b["ts"] - 1 <= e["ts"] <= b["ts"] + b["dur"] + 1
                    assert e["ts"] + e["dur"] <= o["ts"] + o["dur"] + 1
                    assert e["args"]["gradient_bytes"] > 0
            else:   # FSDP2: its all-gathers from the forward pass on, its reduce-scatters in backward
                assert buckets == []
                calls = [e for e in mine if e["args"]["step"] == step and e["tid"] == comm_tid[rank]]
                gathers = [e for e in calls if e["name"].startswith("all_gather ")]
                scatters = [e for e in calls if e["name"].startswith("reduce_scatter ")]
                assert len(gathers) >= 3 and len(scatters) >= 3, calls   # 2 blocks and the root
                assert len(gathers) + len(scatters) == len(calls)
                for e in calls:
                    assert f["ts"] - 1 <= e["ts"] and e["ts"] + e["dur"] <= o["ts"] + o["dur"] + 1
                    assert e["args"]["bytes"] > 0
                for e in scatters:
                    assert b["ts"] - 1 <= e["ts"] <= b["ts"] + b["dur"] + 1
                # numbered in the step's order of calls
                assert sorted(int(e["name"].split()[1]) for e in calls) == list(range(1, len(calls) + 1))
