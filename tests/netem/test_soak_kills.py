"""A small seeded soak with peers killed (benchmarks/soak.py, issue 36), locally and across 2
emulated hosts: every op checked and right, every survivor of a kill ends by itself with
wirespeed's one-line error within the timeout + 1 s, and nothing is left behind (processes,
/dev/shm entries, temp files, namespaces). Root only (the hosts are network namespaces).

Seed 18's plan: 4 runs of 2-3 ranks, rank 0 (the store's host) killed in setup on 3 local ranks,
and rank 0 killed in the middle of an op across the 2 hosts; the test checks that the plan still
has kills in both places, so a change of the planner cannot make it pass without them.
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from netem_util import cluster_name  # noqa: F401 (a fixture)
from netem_util import leftovers_of, needs_netns

from wsutil import ROOT

pytestmark = [pytest.mark.netns, pytest.mark.slow, needs_netns]

TIMEOUT_S = 5


@pytest.mark.timeout(400)
def test_a_small_soak_with_kills_local_and_across_hosts(cluster_name, tmp_path):
    out = tmp_path / "soak.json"
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "soak.py"), "--seed", "18",
                        "--collectives", "150", "--worlds", "2,3", "--ops-per-run", "20-60",
                        "--places", "local,hosts", "--kill-fraction", "0.5", "--timeout", str(TIMEOUT_S),
                        "--cluster-name", cluster_name, "--json", out, "-v"],
                       capture_output=True, text=True, timeout=380, cwd=ROOT)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-3000:]
    got = json.loads(out.read_text())
    s = got["summary"]
    killed = [r for r in got["runs"] if r["kill"]]
    assert {r["place"] for r in killed} == {"local", "hosts"}, [r["kill"] for r in killed]
    assert s["wrong_elements"] == 0 and s["failed_runs"] == 0 and s["leftovers"] == 0, s
    assert s["collectives_checked"] >= 50, s
    survivors = [x for r in killed for x in r["ranks"] if "to_error_s" in x]
    assert len(survivors) == sum(r["world"] - 1 for r in killed) and survivors, survivors
    for x in survivors:
        assert x["status"] in (3, 4) and x["error"].startswith(f"wirespeed: error: rank {x['rank']}: "), x
        assert x["to_error_s"] <= TIMEOUT_S + 1, x
    assert "survivors 3, worst time to error minus timeout" in p.stdout, p.stdout[-2000:]
    assert leftovers_of(cluster_name) == []
