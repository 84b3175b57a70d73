"""`wirespeed tune`: the knob table and settings, the verdict on records, and a real sweep of
wirespeed's own knob on CPU ranks (small sizes, few calls)."""
import json

import pytest

from wirespeed.errors import UsageError
from wirespeed.tune.knobs import KNOBS, Knob, parse_values, select
from wirespeed.tune.sweep import DEFAULT, Setting, setting_env, settings
from wirespeed.tune.verdict import overall_best, ranges, render
from wsutil import wirespeed


def test_default_subset_follows_where_the_ranks_are():
    one, _ = select("wirespeed", None, False, across_hosts=False, one_host=True)
    assert [(k.name, k.values) for k in one] == [("WIRESPEED_ALGO", ("oneshot", "rsag"))]
    across, _ = select("wirespeed", None, False, across_hosts=True, one_host=False)
    assert [k.name for k in across] == ["WIRESPEED_ALGO", "WIRESPEED_NSTREAMS", "WIRESPEED_CHUNK_BYTES"]
    assert across[0].values == ("hier", "ring", "doubling")
    nccl, _ = select("nccl", None, False, across_hosts=True, one_host=False)
    assert {"NCCL_SOCKET_NTHREADS", "NCCL_NSOCKS_PERTHREAD", "NCCL_ALGO", "NCCL_PROTO"} == {k.name for k in nccl}
    every, _ = select("nccl", None, True, across_hosts=True, one_host=False)
    assert len(every) == sum(k.backend == "nccl" for k in KNOBS)


def test_named_knobs_values_and_bad_names():
    knobs, notes = select("wirespeed", ["WIRESPEED_NSTREAMS"], False, across_hosts=False, one_host=True,
                          values=parse_values(["WIRESPEED_NSTREAMS=2,3"]))
    assert knobs[0].values == ("2", "3") and "across hosts only" in notes[0]
    for call, says in ((lambda: select("gloo", None, False, True, True), "no knobs of backend 'gloo'"),
                       (lambda: select("nccl", ["NCCL_NOPE"], False, True, True), "unknown nccl knob"),
                       (lambda: parse_values(["NCCL_ALGO"]), "NAME=v1,v2"),
                       (lambda: select("nccl", ["NCCL_ALGO"], False, True, True,
                                       {"NCCL_PROTO": ["LL"]}), "not swept here")):
        with pytest.raises(UsageError, match=says):
            call()


def test_settings_sweep_groups_jointly_and_others_alone():
    threads = Knob("nccl", "NCCL_SOCKET_NTHREADS", ("2", "16"), group="sockets")
    socks = Knob("nccl", "NCCL_NSOCKS_PERTHREAD", ("1", "8"), group="sockets")
    algo = Knob("nccl", "NCCL_ALGO", ("Ring", "Tree"))
    labels = [s.label for s in settings([threads, socks, algo])]
    # 16 x 8 = 128 sockets is over NCCL's cap of 64: not run
    assert labels == ["default", "NCCL_SOCKET_NTHREADS=2 NCCL_NSOCKS_PERTHREAD=1",
                      "NCCL_SOCKET_NTHREADS=2 NCCL_NSOCKS_PERTHREAD=8",
                      "NCCL_SOCKET_NTHREADS=16 NCCL_NSOCKS_PERTHREAD=1", "NCCL_ALGO=Ring", "NCCL_ALGO=Tree"]


def test_a_knob_with_a_row_for_each_place_sweeps_both_rows_values():
    # ranks on two hosts, two a host: the one-host and the across-hosts all_reduce algorithms
    knobs, _ = select("wirespeed", ["WIRESPEED_ALGO"], False, across_hosts=True, one_host=True)
    assert [s.label for s in settings(knobs)] == [
        "default", "WIRESPEED_ALGO=oneshot", "WIRESPEED_ALGO=rsag", "WIRESPEED_ALGO=hier",
        "WIRESPEED_ALGO=ring", "WIRESPEED_ALGO=doubling"]


def test_the_defaults_run_without_any_knob_of_the_table():
    base = {"NCCL_ALGO": "Tree", "WIRESPEED_NSTREAMS": "2", "WIRESPEED_ITERS": "3", "PATH": "/bin"}
    assert setting_env(DEFAULT, base) == {"PATH": "/bin"}
    assert setting_env(Setting((("NCCL_ALGO", "Ring"),)), base) == {"PATH": "/bin", "NCCL_ALGO": "Ring"}


def _rec(label, nbytes, t, repeat=0, wrong=0):
    return {"collective": "all_reduce", "op": "sum", "device": "cpu", "world_size": 2, "dtype": "float32",
            "backend": "wirespeed", "bytes": nbytes, "inplace": True, "time_us": t, "wrong": wrong,
            "busbw_factor": 1.0, "setting_label": label, "repeat": repeat}


def test_verdict_best_per_range_gain_and_exports():
    recs = []
    for rep, jitter in ((0, 1.0), (1, 1.1)):
        for n, (d, a, b) in {1024: (10, 5, 20), 4096: (12, 6, 24), 1 << 20: (100, 200, 50)}.items():
            recs += [_rec("default", n, d * jitter, rep), _rec("X=a", n, a * jitter, rep),
                     _rec("X=b", n, b * jitter, rep)]
    recs.append(_rec("X=c", 1024, 1.0, wrong=3))  # wrong data never wins
    text, summary = render(recs, repeats=2)
    assert [(r["setting_label"], r["min_bytes"], r["max_bytes"]) for r in summary] == \
        [("X=a", 1024, 4096), ("X=b", 1 << 20, 1 << 20)]
    assert summary[0]["gain_min"] == pytest.approx(2.0) and summary[1]["gain"] == pytest.approx(2.0)
    assert summary[0]["setting"] == {"X": "a"}
    assert "1 KiB .. 4 KiB: X=a, 2.00x the defaults' speed" in text
    assert "WRONG" in text
    # over the sweep: X=a gains 2, 2, 0.5 (geo 1.26); X=b 0.5, 0.5, 2 (0.63): export X=a
    assert "\nexport X=a\n" in text + "\n"


def test_no_setting_beats_the_defaults():
    recs = [_rec("default", 1024, 5.0), _rec("X=a", 1024, 9.0)]
    text, summary = render(recs, repeats=1)
    assert "nothing to export" in text and summary[0]["setting_label"] == "default"


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_tune_sweeps_wirespeed_algo_on_cpu_ranks(tmp_path):
    out = tmp_path / "t.jsonl"
    p = wirespeed("tune", "--backend", "wirespeed", "-N", "2", "--sizes", "4K,1M", "-n", "3", "-w", "1",
                  "--values", "WIRESPEED_ALGO=rsag", "--repeat", "2", "--json", out,
                  "--save-dir", tmp_path / "runs", timeout=380)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    assert "2 settings" in p.stdout and "# best per size range:" in p.stdout
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    bench = [r for r in recs if r["schema"] == "wirespeed.bench/1"]
    # interleaved: default, rsag, default, rsag; every result checked and correct
    order = list(dict.fromkeys((r["repeat"], r["setting_label"]) for r in bench))
    assert order == [(0, "default"), (0, "WIRESPEED_ALGO=rsag"), (1, "default"), (1, "WIRESPEED_ALGO=rsag")]
    assert all(r["checked"] and r["wrong"] == 0 and r["time_method"] == "loops-median" for r in bench)
    tune = [r for r in recs if r["schema"] == "wirespeed.tune/1"]
    assert tune and {r["min_bytes"] for r in tune} <= {4096, 1 << 20} and tune[0]["knobs"] == ["WIRESPEED_ALGO"]
    run = next((tmp_path / "runs").iterdir())
    assert (run / "verdict.txt").read_text().startswith("# all_reduce (sum) float32")
    assert len(list((run / "logs").iterdir())) == 4
    # wirespeed plot reads a tune's records (bench ones drawn, the verdicts skipped)
    plot = wirespeed("plot", run, "-o", tmp_path / "t.png", check=True)
    assert "4 bench" not in plot.stdout and "8 bench" in plot.stdout and "tune" in plot.stdout


def test_bad_tune_input_is_one_line_and_exit_2():
    p = wirespeed("tune", "--backend", "gloo", "--no-save")
    assert p.returncode == 2 and "no knobs of backend 'gloo'" in p.stderr and "Traceback" not in p.stderr
