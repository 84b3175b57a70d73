"""`bench --plan` on the emulated cluster: a plan's port channels cross the hosts' links through
wirespeed's engine (TCP between the hosts' namespaces), and every element comes out right."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from netem_util import cluster_name  # noqa: F401 (a fixture)
from netem_util import needs_netns, run_here

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "plans"))
from planfiles import fixture, write  # noqa: E402

pytestmark = [pytest.mark.netns, needs_netns]


@pytest.mark.timeout(180)
def test_a_port_channel_plan_runs_across_two_hosts(capfd, cluster_name, tmp_path):
    from wirespeed.netem import cluster as C
    C.up(2, 400 * 10**6, name=cluster_name, measure=False)
    out = tmp_path / "records.jsonl"
    code, text, err = run_here(capfd, "bench", "--plan", write(tmp_path / "port.json", fixture("allreduce_ring_port_2r_2h")),
                               "--cluster", cluster_name, "--sizes", "4K,256K", "-n", "3", "-w", "1",
                               "--timeout", "60", "--no-save", "--no-progress", "--json", out)
    assert code == 0, err[-2000:]
    for r in range(2):
        assert f"Rank {r:3d} on {C.host_ns(cluster_name, r)}" in text
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["bytes"] for r in records] == [4096, 262144]
    assert all(r["wrong"] == 0 and r["plan"] == "allreduce_ring_port_2r_2h" for r in records)
    # A memory channel between the hosts is refused before the ranks start.
    code, _, err = run_here(capfd, "bench", "--plan", write(tmp_path / "mem.json", fixture("allreduce_oneshot_2r")),
                            "--cluster", cluster_name, "--no-save", "--no-progress")
    assert code == 2 and "leads to rank 1 on another host" in err
