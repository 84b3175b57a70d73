"""The watchdog watches progress, not loops (issue 27): a healthy loop of many calls that lasts far
longer than -T is never taken for a hang (over a slow link, for gloo and our backend); each call still has to
end within -T (a hung peer is reported within the timeout: tests/faults, tests/multiproc).

Each case checks from the run's own records that the timed loop really outlasted -T, so the test
cannot pass by a loop that happened to be short.
"""
from __future__ import annotations

import json
import subprocess

import pytest
from netem_util import cluster_name  # noqa: F401 (a fixture)
from netem_util import cli, needs_netns

STARTUP_S = 120


def _bench(tmp_path, timeout_s: float, *args) -> list[dict]:
    out = tmp_path / "r.jsonl"
    proc = subprocess.run(cli("bench", "--no-save", "--no-progress", "-N", 2, "-w", 1,
                              "-T", timeout_s, "--json", out, *args),
                          capture_output=True, text=True, timeout=STARTUP_S + 60)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "no progress" not in proc.stderr
    return [r for r in map(json.loads, out.read_text().splitlines()) if "time_us" in r]


def _loop_s(rec: dict) -> float:
    return rec["time_us"] * rec["iters"] * 1e-6


@needs_netns
@pytest.mark.netns
@pytest.mark.timeout(STARTUP_S + 90)
@pytest.mark.parametrize("backend", ["gloo", "wirespeed"])
def test_a_long_loop_over_a_slow_link_is_not_a_hang(cluster_name, tmp_path, backend):  # noqa: F811
    from wirespeed.netem import cluster as C
    # The capped link sets each call's time (~45 ms at 1 MiB), whatever the machine's speed: a
    # loop on one host would be long here and short on a faster machine.
    C.up(2, 200 * 10**6, name=cluster_name, measure=False)
    timeout_s = 2.0
    [rec] = _bench(tmp_path, timeout_s, "--cluster", cluster_name, "--backend", backend,
                   "--sizes", "1M", "-n", 80, "--no-per-op")
    assert rec["wrong"] == 0
    assert _loop_s(rec) > 1.5 * timeout_s, rec
