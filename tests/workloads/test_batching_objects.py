"""`wirespeed batching` and `wirespeed objects`: the fit and the flag pattern by hand, then one small
real run of each command on local gloo ranks."""
import json

import pytest
import torch

from wsutil import wirespeed
from wirespeed.workloads.batching import chunk_views, fit_latency_bandwidth
from wirespeed.workloads.objects import done_flag, every_rank_done


def test_fit_recovers_a_known_line():
    a, b, total = 50e-6, 1 / 2e9, 64 << 20
    pts = [(k, k * a + b * total) for k in (1, 10, 100, 1000)]
    fa, fb = fit_latency_bandwidth(pts, total)
    assert fa == pytest.approx(a) and fb == pytest.approx(b)
    assert fit_latency_bandwidth(pts[:1], total) is None
    assert fit_latency_bandwidth([(5, 1.0), (5, 2.0)], total) is None


def test_chunks_cover_the_buffer_once():
    buf = torch.arange(1003)
    for k in (1, 7, 1003):
        views = chunk_views(buf, k)
        assert len(views) == k and torch.equal(torch.cat(views), buf)
        assert max(v.numel() for v in views) - min(v.numel() for v in views) <= 1


def test_flag_pattern_has_both_answers():
    for world in (1, 2, 3, 5):
        answers = set()
        for i in range(12):
            assert every_rank_done(i, world) == all(done_flag(i, r, world) for r in range(world))
            answers.add(every_rank_done(i, world))
        assert answers == {True, False}


@pytest.mark.timeout(150)
def test_batching_run(tmp_path):
    out, png = tmp_path / "b.jsonl", tmp_path / "b.png"
    p = wirespeed("batching", "--total", "1M", "--chunks", "1,8,64", "-N", "2", "-w", "1", "-n", "2",
                  "--json", out, "--plot", png, "-T", "60", timeout=140)
    assert p.returncode == 0, p.stdout + p.stderr
    recs = [json.loads(line) for line in open(out)]
    assert [r["chunks"] for r in recs] == [1, 8, 64]
    assert all(r["wrong"] == 0 and r["total_bytes"] == 1 << 20 and r["time_us"] > 0 for r in recs)
    assert recs[1]["chunk_bytes"] == 1 << 17
    assert recs[0]["fit_latency_us"] is not None and "fit over 3 points" in p.stdout
    assert png.stat().st_size > 1000


@pytest.mark.timeout(150)
def test_objects_run(tmp_path):
    out = tmp_path / "o.jsonl"
    p = wirespeed("objects", "-N", "1,2", "-w", "2", "-n", "20", "--json", out, "-T", "60", timeout=140)
    assert p.returncode == 0, p.stdout + p.stderr
    recs = [json.loads(line) for line in open(out)]
    assert sorted((r["world_size"], r["method"]) for r in recs) == sorted(
        (n, m) for n in (1, 2) for m in ("all_gather_object", "all_reduce", "all_gather"))
    assert all(r["wrong"] == 0 and r["time_us"] > 0 and r["iters"] == 20 for r in recs)
    ar = [r for r in recs if r["method"] == "all_reduce"]
    assert all(r["speedup_vs_object"] > 0 for r in ar)
    assert "speed-up" in p.stdout


@pytest.mark.parametrize("cmd,args,needle", [
    ("batching", ["--chunks", "1,x"], "--chunks"),
    ("batching", ["--total", "16", "--chunks", "1,100"], "too small"),
    ("batching", ["--total", "64T"], "GiB"),
    ("objects", ["-N", "2,zero"], "world sizes"),
    ("objects", ["-n", "0"], "--iters"),
])
def test_usage_errors(cmd, args, needle, capsys, monkeypatch):
    from wirespeed.cli.main import main
    for k in ("RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"):
        monkeypatch.delenv(k, raising=False)
    with pytest.raises(SystemExit) as e:
        main([cmd, *args])
    assert e.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], lines
