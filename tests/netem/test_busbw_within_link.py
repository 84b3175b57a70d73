"""busbw never claims more than the wire carried (issue 27): on the emulated cluster, one rank per
host, every collective at every size of a sweep, the busbw bench prints is at most the capped
link's rate. Before the loop's time became the slowest rank's, from a clock started before every
rank could send, broadcast claimed 1.2x-1.4x the link at small sizes; before the capped devices
took small segments, small loops claimed up to 1.03x (htb lets a 64 KiB packet through whole).
With two ranks per host busbw may pass the link (a hierarchical algorithm sends fewer bytes across
hosts than its formula assumes); what the busiest host really sent (`link_sent_gbps`, its
interface's counter) may not.

The sweep is short here (16 KiB to 1 MiB, 20 calls a size); `python benchmarks/busbw_vs_link.py`
runs 4 KiB to 256 MiB. Not from 4 KiB here: at 4 KiB (2 KiB per rank and call, two small packets)
the emulated link itself let all_gather through at 1.000-1.012 of its rate in 2 of 6 runs, with the
loop's clock honest (htb is coarse at small packets and low rates); unresolved, see issue 27's note.
"""
from __future__ import annotations

import json
import subprocess

import pytest
from netem_util import cluster_name  # noqa: F401 (a fixture)
from netem_util import cli, needs_netns

pytestmark = [pytest.mark.netns, needs_netns]
RATE = 200 * 10**6


@pytest.mark.timeout(300)
@pytest.mark.parametrize("backend", ["wirespeed", "gloo"])
def test_busbw_is_never_above_the_link(cluster_name, tmp_path, backend):  # noqa: F811
    moved = _sweep(cluster_name, tmp_path, backend, ranks=2)
    over = [(r["collective"], r["bytes"], r["inplace"], round(r["busbw_gbps"] * 8e9 / RATE, 3))
            for r in moved if r["busbw_gbps"] * 8e9 > RATE]
    assert over == [], over
    _sent_within_the_link(moved)
    # The counter is the link's: with one rank per host every byte busbw counts crosses it.
    low = [(r["collective"], r["bytes"], round(r["link_sent_gbps"] / r["busbw_gbps"], 3))
           for r in moved if r["bytes"] >= 256 * 1024 and r["link_sent_gbps"] < 0.9 * r["busbw_gbps"]]
    assert low == [], low


@pytest.mark.timeout(300)
def test_with_two_ranks_per_host_what_crossed_is_never_above_the_link(cluster_name, tmp_path):  # noqa: F811
    moved = _sweep(cluster_name, tmp_path, "wirespeed", ranks=4)
    _sent_within_the_link(moved)


def _sweep(cluster_name, tmp_path, backend: str, ranks: int) -> list[dict]:
    from wirespeed.netem import cluster as C
    C.up(2, RATE, name=cluster_name, measure=False)
    out = tmp_path / "r.jsonl"
    proc = subprocess.run(cli("bench", "--cluster", cluster_name, "-N", ranks, "--backend", backend,
                              "-c", "all", "-b", "16K", "-e", "1M", "-f", 4, "-n", 20, "-w", 2,
                              "--no-per-op", "--no-save", "--no-progress", "--json", out),
                          capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stderr[-3000:]
    recs = [r for r in map(json.loads, out.read_text().splitlines()) if "busbw_gbps" in r]
    moved = [r for r in recs if r["busbw_gbps"] > 0]
    assert {r["collective"] for r in moved} >= {"all_reduce", "all_gather", "reduce_scatter",
                                                "broadcast", "reduce", "all_to_all", "send_recv"}
    return moved


def _sent_within_the_link(records) -> None:
    over = [(r["collective"], r["bytes"], r["inplace"], round(r["link_sent_gbps"] * 8e9 / RATE, 3))
            for r in records if r["link_sent_gbps"] * 8e9 > RATE]
    assert over == [], over
