"""`wirespeed env` and `wirespeed plot` on real output."""
import json

import pytest

from wsutil import wirespeed


@pytest.mark.timeout(60)
def test_env_reports_versions_backends_and_nics():
    p = wirespeed("env", "--json", check=True)
    rep = json.loads(p.stdout)
    assert rep["versions"]["torch"]
    assert rep["backends"]["gloo"] == "available"
    assert rep["backends"]["nccl"] == "available" or "GPU" in rep["backends"]["nccl"] or "NCCL" in rep["backends"]["nccl"]
    assert any(n["name"] == "lo" and "127.0.0.1" in n["ipv4"] for n in rep["nics"])
    text = wirespeed("env", check=True).stdout
    assert "backends" in text and "gloo" in text and "nics" in text


@pytest.mark.timeout(120)
def test_bench_saves_a_run_and_plot_replots_two_runs(tmp_path):
    for _ in range(2):
        wirespeed("bench", "-N", "2", "-b", "1K", "-e", "16K", "-f", "4", "-n", "3", "-w", "1",
                  "--save-dir", tmp_path / "runs", "--csv", tmp_path / "r.csv", check=True)
    runs = sorted((tmp_path / "runs").iterdir())
    assert len(runs) == 2
    for run in runs:
        assert (run / "plot.png").read_bytes()[:4] == b"\x89PNG"
        assert len((run / "records.jsonl").read_text().splitlines()) == 3
    assert len((tmp_path / "r.csv").read_text().splitlines()) == 4
    out = tmp_path / "both.png"
    p = wirespeed("plot", runs[0], runs[1] / "records.jsonl", "-o", out, check=True)
    assert "6 records" in p.stdout
    assert out.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.timeout(60)
def test_plot_of_missing_file_is_a_usage_error(tmp_path):
    p = wirespeed("plot", tmp_path / "nope.jsonl")
    assert p.returncode == 2 and "no such file" in p.stderr and "Traceback" not in p.stderr


@pytest.mark.timeout(120)
def test_markdown_format_and_env_twin(tmp_path):
    p = wirespeed("bench", "-N", "2", "-b", "1K", "-e", "1K", "-n", "2", "-w", "0", "--no-save",
                  "--format", "md", env={"WIRESPEED_COLLECTIVE": "all_gather"}, check=True)
    assert "**all_gather** float32" in p.stdout
    assert "| payload | busbw | algbw |" in p.stdout
