"""`wirespeed cluster up/status/down`: real namespaces, real caps, measured; and leftovers removed."""
from __future__ import annotations

import json
import shutil
import subprocess
import time

import pytest
from netem_util import cluster_name  # noqa: F401 (a fixture)
from netem_util import cli, needs_netns, run_here

pytestmark = [pytest.mark.netns, needs_netns]

# TCP can carry at most this share of a cap: tc counts the whole 1514-byte frame, 1448 of which
# are payload (20 IP + 32 TCP with timestamps + 14 Ethernet header bytes).
GOODPUT = 1448 / 1514


def _root_links() -> str:
    return subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout


def _root_addrs() -> str:
    return subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True).stdout


@pytest.mark.timeout(60)
def test_up_status_down_with_measured_caps(capsys, cluster_name):
    links_before = _root_links()
    code, out, err = run_here(capsys, "cluster", "up", "--name", cluster_name, "--hosts", 3,
                              "--rate", "200mbit", "--flow-rate", "80mbit")
    assert code == 0, err
    # The root namespace is untouched: no new interface, no 10.77.0.x address.
    assert _root_links() == links_before
    assert "10.77.0." not in _root_addrs()

    code, out, err = run_here(capsys, "cluster", "status", "--name", cluster_name, "--json")
    assert code == 0, err
    state = json.loads(out)
    assert [h["addr"] for h in state["hosts"]] == ["10.77.0.1", "10.77.0.2", "10.77.0.3"]
    assert state["rate_bps"] == 200_000_000 and state["flow_rate_bps"] == 80_000_000
    # Never above a cap: one flow under its own, four together under the link.
    for attempt in range(3):
        m = state["measured"]
        assert 0 < m["one_flow_bps"] <= 1.01 * GOODPUT * 80e6, m
        assert 0 < m["parallel_bps"] <= 1.01 * GOODPUT * 200e6, m
        # And close below them, with flows capped one by one. A busy 2-core machine can starve
        # the probe (we saw one flow read 19% of its cap during a full test run), so a reading
        # that falls short is taken again, up to three times: only a cap that is too tight
        # falls short every time (see the next test for the floor).
        if (m["one_flow_bps"] > 0.5 * GOODPUT * 80e6 and m["parallel_bps"] > 1.5 * m["one_flow_bps"]
                or attempt == 2):
            break
        code, out, err = run_here(capsys, "cluster", "status", "--name", cluster_name, "--measure",
                                  "--json")
        assert code == 0, err
        state = json.loads(out)
    assert m["one_flow_bps"] > 0.5 * GOODPUT * 80e6, m
    assert m["parallel_bps"] > 1.5 * m["one_flow_bps"], f"flows are not capped one by one: {m}"

    code, text, _ = run_here(capsys, "cluster", "status", "--name", cluster_name)
    assert "3 hosts" in text and "link 200 Mbit/s" in text and "80 Mbit/s" in text
    assert "measured" in text

    code, out, _ = run_here(capsys, "cluster", "down", "--name", cluster_name)
    assert code == 0 and "removed" in out
    code, out, _ = run_here(capsys, "cluster", "status", "--name", cluster_name)
    assert code == 1 and "no emulated cluster" in out


@pytest.mark.timeout(60)
def test_link_cap_holds_for_one_flow_at_two_rates(cluster_name):
    """Every probe stays under the cap; the best of up to three comes close to it.

    A cap only ever lowers a rate, so the best try estimates what the link carries, while a
    starved probe (this machine's 2 cores are shared with other test runs; we measured single
    tries as low as 63% under a load of 10, and bests of three at 69-79% with the load near 2 and
    no drop or retransmission anywhere: the VM's CPUs, not the links) only shows the machine was
    busy. The floor of 0.5 still rules out a cap in the wrong unit (bits for bytes: 8x; k for M);
    the ceiling is what guards the cap's accuracy.
    """
    from wirespeed.netem import cluster as C
    for rate in (100_000_000, 300_000_000):
        c, _ = C.up(2, rate, name=cluster_name, measure=False)
        best = 0.0
        for _ in range(3):
            m = C.measure_cluster(c, seconds=0.6)
            for bps in (m["one_flow_bps"], m["parallel_bps"]):
                assert bps <= 1.01 * GOODPUT * rate, (rate, m)
            best = max(best, m["one_flow_bps"])
            if best > 0.5 * GOODPUT * rate:
                break
        assert best > 0.5 * GOODPUT * rate, (rate, best)


@pytest.mark.timeout(60)
def test_leftovers_of_a_killed_run_are_found_and_removed(capsys, cluster_name):
    from wirespeed.netem import cluster as C
    from wirespeed.netem.ns import netns_pids
    # A run killed mid-way: an `up` SIGKILLed while building, then a process left inside a host.
    proc = subprocess.Popen(cli("cluster", "up", "--name", cluster_name, "--hosts", 4,
                                "--rate", "1gbit", "--flow-rate", "300mbit"),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while not C.leftovers(cluster_name) and time.monotonic() < deadline:
        time.sleep(0.01)
    proc.kill()
    proc.wait()
    host0 = C.host_ns(cluster_name, 0)
    if host0 not in C.leftovers(cluster_name):
        subprocess.run(["ip", "netns", "add", host0], check=True)
    sleeper = subprocess.Popen(["ip", "netns", "exec", host0, "sleep", "60"])
    try:
        time.sleep(0.3)
        assert netns_pids(host0)
        code, out, _ = run_here(capsys, "cluster", "status", "--name", cluster_name)
        if code == 1:  # the killed `up` may or may not have finished its state file
            assert "leftover namespaces" in out and host0 in out

        # `up` removes the leftovers (and the process inside) before building afresh.
        code, out, err = run_here(capsys, "cluster", "up", "--name", cluster_name, "--hosts", 2,
                                  "--rate", "100mbit", "--no-measure")
        assert code == 0, err
        assert "removed an earlier cluster" in out and host0 in out
        assert sleeper.wait(timeout=10) != 0
        assert sorted(C.leftovers(cluster_name)) == sorted(
            [C.host_ns(cluster_name, 0), C.host_ns(cluster_name, 1), C.switch_ns(cluster_name)])

        # `down` with no state file at all still finds every namespace by its prefix.
        import os
        os.unlink(C.state_path(cluster_name))
        code, out, _ = run_here(capsys, "cluster", "down", "--name", cluster_name)
        assert code == 0 and C.leftovers(cluster_name) == []
    finally:
        if sleeper.poll() is None:
            sleeper.kill()
            sleeper.wait()


@pytest.mark.timeout(30)
def test_delay_is_refused_in_one_line_without_netem_else_applied(capsys, cluster_name):
    from wirespeed.netem import cluster as C
    code, _, err = run_here(capsys, "cluster", "up", "--name", cluster_name, "--hosts", 2,
                            "--rate", "100mbit", "--delay", "100us", "--no-measure")
    if not C.netem_available(cluster_name):
        assert code == 2
        assert err.count("\n") == 1 and "netem" in err
        assert C.leftovers(cluster_name) == []
    else:
        assert code == 0, err
        qd = subprocess.run(["tc", "-n", C.switch_ns(cluster_name), "qdisc", "show"],
                            capture_output=True, text=True).stdout
        assert "netem" in qd and "delay 100us" in qd


@pytest.mark.timeout(30)
def test_bad_input_is_one_line_and_exit_2(capsys):
    for args, needle in ((("--rate", "1gbps"), "does not parse"), (("--hosts", 0), "--hosts"),
                         (("--rate", "100mbit", "--flow-rate", "200mbit"), "--flow-rate"),
                         (("--name", "Bad_Name"), "not valid"), (("--delay", "soon"), "--delay")):
        code, _, err = run_here(capsys, "cluster", "up", *args)
        assert code == 2, (args, err)
        assert err.count("\n") == 1 and needle in err


@pytest.mark.timeout(30)
@pytest.mark.skipif(shutil.which("setpriv") is None, reason="setpriv (util-linux) not installed")
def test_without_root_one_clear_error(cluster_name):
    p = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all",
                        *cli("cluster", "up", "--name", cluster_name, "--hosts", 2)],
                       capture_output=True, text=True, timeout=25, cwd="/")
    assert p.returncode == 2, p.stderr
    assert p.stderr.count("\n") == 1 and "root or CAP_NET_ADMIN" in p.stderr
