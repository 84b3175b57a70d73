"""`tune --cluster`: a network knob reaches the ranks on the emulated hosts and the verdict sees it.
With each TCP flow capped at a quarter of the link, one stream per peer can carry at most a
quarter of what several streams carry, so WIRESPEED_NSTREAMS=1 must lose clearly."""
from __future__ import annotations

import json

import pytest
from netem_util import cluster_name  # noqa: F401 (a fixture)
from netem_util import needs_netns, run_here

pytestmark = [pytest.mark.netns, needs_netns, pytest.mark.slow]


@pytest.mark.timeout(400)
def test_tune_finds_that_one_stream_loses_on_capped_flows(cluster_name, capfd, tmp_path):  # noqa: F811
    from wirespeed.netem import cluster as C
    C.up(2, 400 * 10**6, 100 * 10**6, name=cluster_name, measure=False)
    out = tmp_path / "t.jsonl"
    code, stdout, err = run_here(capfd, "tune", "--backend", "wirespeed", "--cluster", cluster_name,
                                 "-N", "2", "--knobs", "WIRESPEED_NSTREAMS",
                                 "--values", "WIRESPEED_NSTREAMS=1,8", "--sizes", "4M", "-n", "3",
                                 "-w", "1", "--repeat", "1", "--no-save", "--json", out)
    assert code == 0, stdout[-3000:] + err[-2000:]
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    t = {r["setting_label"]: r["time_us"] for r in recs if r["schema"] == "wirespeed.bench/1"}
    assert set(t) == {"default", "WIRESPEED_NSTREAMS=1", "WIRESPEED_NSTREAMS=8"}
    assert all(r["link_rate_gbps"] == pytest.approx(0.4) for r in recs if "link_rate_gbps" in r)
    assert t["WIRESPEED_NSTREAMS=1"] > 2 * min(t["default"], t["WIRESPEED_NSTREAMS=8"]), t
    verdict = [r for r in recs if r["schema"] == "wirespeed.tune/1"]
    assert verdict and verdict[0]["setting_label"] != "WIRESPEED_NSTREAMS=1"
