"""`compare --cluster` and `model --cluster`: the ranks run on the emulated hosts and cross the links."""
from __future__ import annotations

import json

import pytest
from netem_util import cluster_name  # noqa: F401 (a fixture)
from netem_util import needs_netns, run_here

pytestmark = [pytest.mark.netns, needs_netns]


@pytest.mark.timeout(240)
def test_compare_runs_each_combination_on_the_cluster(cluster_name, capfd, tmp_path):  # noqa: F811
    from wirespeed.netem import cluster as C
    C.up(2, 400 * 10**6, name=cluster_name, measure=False)
    out = tmp_path / "r.jsonl"
    code, stdout, err = run_here(capfd, "compare", "--backends", "gloo,wirespeed", "--dtypes", "float32",
                                 "--devices", "cpu", "--nprocs", "2", "--cluster", cluster_name,
                                 "--sizes", "1M", "-n", "3", "-w", "1", "--no-save", "--json", out)
    assert code == 0, err[-2000:]
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert {r["backend"] for r in recs} == {"gloo", "wirespeed"}
    for r in recs:
        assert r["wrong"] == 0
        assert r["link_rate_gbps"] == pytest.approx(0.4)  # the records say they ran on the cluster
        assert r["busbw_gbps"] * 8 <= 0.4 * (1448 / 1514 + 0.01)  # and the link capped them


@pytest.mark.timeout(240)
def test_model_runs_on_the_cluster(cluster_name, capfd, tmp_path):  # noqa: F811
    from wirespeed.netem import cluster as C
    C.up(2, 400 * 10**6, name=cluster_name, measure=False)
    shapes = tmp_path / "net.txt"
    shapes.write_text("w1: 256x1024\nb1: 256\nw2: 1024x256\n")
    out = tmp_path / "m.jsonl"
    code, stdout, err = run_here(capfd, "model", "--shapes", shapes, "-N", "2", "--cluster", cluster_name,
                                 "--strategy", "allreduce", "-n", "2", "-w", "1", "--json", out)
    assert code == 0, err[-2000:]
    # Ranks were placed on the emulated hosts (the spawner prints where), and the result is exact.
    assert "rank 0 on h0" in stdout and "rank 1 on h1" in stdout
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert recs and all(r["error"] == 0 and r["world_size"] == 2 for r in recs)
