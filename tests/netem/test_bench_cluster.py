"""`bench --cluster` and `launch` on capped links: busbw sits just under the link rate, never above.

Why these bounds. tc caps whole Ethernet frames; a TCP segment carries 1448 payload bytes per
1514-byte frame, so no TCP transport can show more than GOODPUT = 95.6% of the cap, and a ring
all_reduce moves exactly busbw bytes per second through each host's link (that is what the busbw
factor 2(n-1)/n is for). So busbw/link must stay <= GOODPUT (+1% for timing noise: a median of a few
iterations), whatever the machine's load. From below: on this 2-core machine, shared with other test
runs, gloo measured 0.80-0.95 of the link over 2-8 MB at 200 and 400 Mbit/s and 2 and 4 hosts (load
averages 3-10), but once 0.32 with 4 ranks at 400 Mbit/s during a full test run (CPU-bound: hence
100 and 200 Mbit/s for 4 hosts, and one retry). 0.75 leaves room for that and still catches a wrong
factor: for 4 ranks, a busbw computed without 2(n-1)/n would read 0.67 of the true value, one
computed with n instead of n-1 read 1.33 of it.
"""
from __future__ import annotations

import json

import pytest
from netem_util import cluster_name  # noqa: F401 (a fixture)
from netem_util import needs_netns, netns_processes, run_here

pytestmark = [pytest.mark.netns, needs_netns]

GOODPUT = 1448 / 1514
LOW = 0.75


def _ratios(records, world, link_gbps):
    ar = [r for r in records if r["collective"] == "all_reduce"]
    assert ar and all(r["world_size"] == world for r in ar)
    assert all(r["wrong"] == 0 for r in ar)
    assert all(r["link_rate_gbps"] == pytest.approx(link_gbps) for r in ar)
    ratios = [r["busbw_gbps"] * 8 / link_gbps for r in ar]
    assert max(ratios) <= GOODPUT + 0.01, f"busbw above what the link can carry: {ratios}"
    return ratios


def _records(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


# (hosts = ranks, link rates in Mbit/s). 4 gloo ranks on 2 shared cores are CPU-bound near
# 400 Mbit/s when other work runs (we saw 0.32 of the link there at a load average over 10),
# so 4 hosts use 100 and 200 Mbit/s.
CASES = ((2, (200, 400)), (4, (100, 200)))


def _run(capfd, cluster_name, tmp_path, world, rate_mbit, attempt):
    from wirespeed.netem import cluster as C
    out = tmp_path / f"r{rate_mbit}-{world}-{attempt}.jsonl"
    bench = ["bench", "--sizes", "2M,4M", "-n", "3", "-w", "1", "--timeout", "60", "--no-save",
             "--no-progress", "--json", out]
    if world == 2 and rate_mbit == 400:
        # The same job through `wirespeed launch` and the cluster's hosts file.
        code, text, _ = run_here(capfd, "cluster", "hostfile", "--name", cluster_name, "--slots", 1)
        assert code == 0 and text.splitlines() == [f"netns:{C.host_ns(cluster_name, i)} slots=1"
                                                   for i in range(2)]
        hosts = tmp_path / "hosts"
        hosts.write_text(text)
        code, text, err = run_here(capfd, "launch", "--hosts", hosts, "--", "wirespeed", *bench)
    else:
        code, text, err = run_here(capfd, "bench", "--cluster", cluster_name, "-N", world, *bench[1:])
    assert code == 0, err[-2000:]
    # Rank r ran on its own emulated host (round robin), under that host's name.
    for r in range(world):
        assert f"Rank {r:3d} on {C.host_ns(cluster_name, r)}" in text
    assert "busbw/link all_reduce" in text
    return _ratios(_records(out), world, rate_mbit / 1000)


@pytest.mark.timeout(300)
def test_all_reduce_busbw_sits_just_under_the_link_at_two_rates(capfd, cluster_name, tmp_path):
    """Every run stays under the cap; the best size of a run comes within LOW of it. A run that
    falls short is run once more: the cap only ever lowers busbw, a busy machine lowers it too,
    and only the first is what this test is about."""
    from wirespeed.netem import cluster as C
    seen = {}
    for world, rates in CASES:
        for rate_mbit in rates:
            C.up(world, rate_mbit * 10**6, name=cluster_name, measure=False)
            for attempt in range(2):
                ratios = _run(capfd, cluster_name, tmp_path, world, rate_mbit, attempt)
                seen.setdefault((world, rate_mbit), []).append(ratios)
                if max(ratios) >= LOW:
                    break
            assert max(ratios) >= LOW, f"busbw far under the link at {rate_mbit} Mbit/s: {seen}"
    print("busbw/link by (ranks, Mbit/s):", seen)

def _link_bytes(netns: str) -> int:
    import subprocess
    out = subprocess.run(["tc", "-n", netns, "-s", "qdisc", "show", "dev", "ws0"], capture_output=True,
                         text=True, check=True).stdout
    return int(out.split("Sent ")[1].split()[0])


@pytest.mark.timeout(120)
def test_mpi_ranks_run_on_their_hosts_and_cross_the_links(capfd, cluster_name, tmp_path):
    """mpirun goes into host 0 and reaches host 1 through its rsh agent; the data crosses ws0."""
    from wirespeed.backends.mpi import missing
    from wirespeed.netem import cluster as C
    if missing():
        pytest.skip(missing())
    C.up(2, 400 * 10**6, name=cluster_name, measure=False)
    before = _link_bytes(C.host_ns(cluster_name, 1))
    out = tmp_path / "mpi.jsonl"
    code, text, err = run_here(capfd, "bench", "--cluster", cluster_name, "--backend", "mpi", "-N", 2,
                               "--sizes", "2M", "-n", 3, "-w", 1, "--timeout", 60, "--no-save",
                               "--no-progress", "--json", out)
    assert code == 0, err[-2000:]
    for r in range(2):
        assert f"Rank {r:3d} on {C.host_ns(cluster_name, r)}" in text
    records = _records(out)
    assert records and all(r["wrong"] == 0 and r["backend"] == "mpi" for r in records)
    assert all(r["busbw_gbps"] * 8 / 0.4 <= GOODPUT + 0.01 for r in records)
    # 5 all_reduces of 2 MB at least: each sends half the buffer each way over the link.
    assert _link_bytes(C.host_ns(cluster_name, 1)) - before >= 5 * (1 << 20)
    assert netns_processes(cluster_name) == {}  # mpirun's daemons ended with the job
