"""The TCP streams per peer chosen at setup (crates/wirespeed-core/src/hosts/probe.rs), on a real
emulated 2-host cluster (root only; skipped otherwise).

- every flow capped at an eighth of the link (2 Gbit/s, 250 Mbit/s per flow): the probe sees
  more flows carry more and uses more streams than
- a link one flow fills (1 Gbit/s, no per-flow cap), where it uses few;
- WIRESPEED_NSTREAMS forces the count: no probe, every stream it opens is used.

Every rank reports the same choice (WIRESPEED_SETUP_STATS=1's line), and the all_reduces run on
it are checked. No speed is asserted here: what the streams give is benchmarks/cross_host.py's.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import uuid

import pytest
from netem_util import cli, leftovers_of, needs_netns, netns_processes

pytestmark = [pytest.mark.netns, pytest.mark.slow, needs_netns]

STARTUP = 120
# The launcher relays the ranks' stderr as it comes, so one rank's line may run into another's.
LINE = re.compile(r"wirespeed: rank (\d+) of (\d+) set up in [^;]*; TCP streams per peer: (\d+) used of (\d+) opened \(([^)]*)\)")


@pytest.fixture
def stp_cluster():
    """A cluster name of this test's own (prefix stp), torn down and checked afterwards."""
    from wirespeed.netem import cluster as C
    name = "stp" + uuid.uuid4().hex[:8]
    yield name
    C.down(name)
    assert leftovers_of(name) == [], "cluster teardown left something behind"


def _streams(name: str, out, nstreams: str | None = None) -> tuple[int, int, str]:
    """(used, opened, how) that every rank of a 2-rank job on the cluster reports."""
    env = dict(os.environ, WIRESPEED_SETUP_STATS="1")
    env.pop("WIRESPEED_NSTREAMS", None)
    if nstreams is not None:
        env["WIRESPEED_NSTREAMS"] = nstreams
    p = subprocess.run(cli("bench", "--cluster", name, "-N", 2, "--backend", "wirespeed", "-c", "all_reduce",
                           "--sizes", "1M", "-n", 2, "-w", 1, "--no-save", "--no-progress", "--timeout", 60,
                           "--json", out),
                       capture_output=True, text=True, timeout=STARTUP + 60, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    recs = [json.loads(line) for line in open(out) if line.strip()]
    assert recs and all(r["checked"] and r["wrong"] == 0 for r in recs), recs
    found = {}
    for m in LINE.finditer(p.stderr):
        found[int(m.group(1))] = (int(m.group(3)), int(m.group(4)), m.group(5))
    assert sorted(found) == [0, 1], p.stderr[-3000:] + "\nSTDOUT:" + p.stdout[-3000:]
    assert found[0] == found[1], found  # one choice, told to every rank
    return found[0]


@pytest.mark.timeout(3 * STARTUP + 120)
def test_a_flow_capped_link_gets_more_streams_and_the_variable_forces_them(stp_cluster, tmp_path):
    from wirespeed.netem import cluster as C
    C.up(2, 2000 * 10**6, flow_rate_bps=250 * 10**6, name=stp_cluster, measure=False)
    capped, opened, how = _streams(stp_cluster, tmp_path / "capped.jsonl")
    assert opened == 12 and how.startswith("probe "), how
    forced = _streams(stp_cluster, tmp_path / "forced.jsonl", nstreams="5")
    assert forced == (5, 5, "WIRESPEED_NSTREAMS is set"), forced

    C.up(2, 1000 * 10**6, name=stp_cluster, measure=False)  # the same name: rebuilt uncapped
    one, opened, how = _streams(stp_cluster, tmp_path / "uncapped.jsonl")
    assert opened == 12 and how.startswith("probe "), how
    assert capped > one, f"capped link: {capped} streams, uncapped: {one}"
    assert netns_processes(stp_cluster) == {}
