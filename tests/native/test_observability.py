"""What torch's tools see of a wirespeed job (issue 38; wirespeed/native/observe.py): torch.profiler's
spans, with gloo as the control, and a hang (one rank skips an all_reduce) as torch's flight
recorder, its fr_trace analyzer and wirespeed's own error report it."""
import os
import subprocess
import sys

import pytest

from .ranks import run_ranks

# What each backend's spans are called in the trace; gloo has no reduce_scatter of its own (torch
# runs gloo's as all_reduces, each a gloo:all_reduce span under c10d::reduce_scatter_).
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "send", "recv")
RUNS_AS = {"gloo": {"reduce_scatter": "all_reduce"}}


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("backend", ["wirespeed", "gloo"])
def test_every_collective_is_a_profiler_span_in_the_chrome_trace(backend, tmp_path):
    res = run_ranks("worker_profiler.py", 2, timeout=170, args=(backend, tmp_path / "trace_"))
    for r in res:
        names = set(r["names"])
        for c in COLLECTIVES:
            assert f"{backend}:{RUNS_AS.get(backend, {}).get(c, c)}" in names, (c, r["names"])
        if backend == "gloo":
            assert "c10d::reduce_scatter_" in r["c10d"], r["c10d"]
            continue
        # wirespeed runs every op on the calling thread: the spans are there, not on a worker.
        assert r["threads"] == [r["main_thread"]], r
        by_name = {}
        for s in r["spans"]:
            by_name.setdefault(s["name"], []).append(s)
        first = by_name["wirespeed:all_reduce"][0]["args"]
        assert first["In msg nelems"] == 1024 and first["dtype"] == "float32", first
        assert first["Group size"] == 2 and first["Process Group Name"] and first["Seq"] == 1, first
        assert by_name["wirespeed:all_gather"][0]["args"]["Out msg nelems"] == 2048
        # The async all_reduce's span runs from the call to the wait (after a 50 ms sleep).
        assert by_name["wirespeed:all_reduce"][-1]["dur_us"] >= 45_000, by_name["wirespeed:all_reduce"]
        seqs = [s["args"]["Seq"] for s in r["spans"] if s["name"] not in ("wirespeed:send", "wirespeed:recv")]
        assert seqs == list(range(1, 6)), seqs      # collectives numbered in call order


def _check_hang_errors(res, recorded: bool, dumps=None):
    """Ranks 0 and 2 were in all_reduce #3 when it failed; each names it, and rank 1 as the rank
    that had not reached it; rank 1, never in it, has no error."""
    assert "error" not in res[1], res[1]
    for r in (res[0], res[2]):
        kind, msg = r["error"]
        assert kind in ("CollectiveTimeout", "PeerAbortedError"), r["error"]
        assert "all_reduce #3" in msg, msg
        assert "ranks that had not reached it: 1 " in msg, msg
        if not recorded:
            assert "set TORCH_FR_BUFFER_SIZE" in msg, msg
        elif dumps is not None:
            assert f"flight recorder dump: {dumps}{r['rank']}" in msg, msg


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_skipped_all_reduce_is_named_by_the_error_the_dumps_and_fr_trace(tmp_path):
    dumps = tmp_path / "fr" / "rank_"
    dumps.parent.mkdir()
    res = run_ranks("worker_hang.py", 3, timeout=200,
                    extra_env={"TORCH_FR_BUFFER_SIZE": "200", "TORCH_FR_DUMP_TEMP_FILE": str(dumps)})
    _check_hang_errors(res, recorded=True, dumps=dumps)
    # Every rank's dump is written: the failing ones at their error, rank 1 by its watch.
    assert all(r["dumped"] for r in res), res
    assert sorted(os.listdir(dumps.parent)) == ["rank_0", "rank_1", "rank_2"]
    # torch's analyzer reads them unchanged (it warns that it does not know "wirespeed" as a comm
    # library, and still matches the entries) and names the collective and the missing rank.
    fr = subprocess.run([sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", str(dumps.parent),
                         "-p", "rank_"], capture_output=True, text=True, timeout=120)
    text = fr.stdout + fr.stderr
    assert fr.returncode == 0, text
    assert "Not all ranks joining collective, sequence number: 3" in text, text
    assert "missing ranks: {1}" in text and "wirespeed:all_reduce" in text, text


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_without_the_flight_recorder_an_async_wait_still_names_the_missing_rank(monkeypatch):
    # Without the recorder the op goes straight to the backend, and async: its Work's wait reports.
    for var in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_FR_DUMP_TEMP_FILE"):
        monkeypatch.delenv(var, raising=False)
    res = run_ranks("worker_hang.py", 3, timeout=200, args=("async",))
    _check_hang_errors(res, recorded=False)
