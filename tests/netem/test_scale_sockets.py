"""Sockets per rank on the emulated cluster, counted in /proc (root only; skipped otherwise).
benchmarks/scale_setup.py runs 2 and 4 hosts x 2 ranks on a cluster of this test's own name: every
rank sets up a wirespeed group, checks one all_reduce and sorts its sockets into the store's, its
listener and its TCP streams, then runs a small all_to_all and counts again. Connections are made
on first use, so the streams follow the peers an algorithm uses, not the job: after the
all_reduce (the hierarchy: host leaders exchange by recursive doubling, the other ranks use
shared memory only) they must equal the streams to wirespeed.scalemodel.small_all_reduce_peers,
and only after the all_to_all, which uses every pair (the script runs it direct: small ones go
through the host leaders by default), every remote rank; a pair opens one stream for messages
this small (scalemodel.opened: all of Layout::pair_streams' only from scalemodel.grow_at bytes
on), rank by rank; the store's keys must be rendezvous.py's requests."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from netem_util import cluster_name  # noqa: F401 (a fixture)
from netem_util import leftovers_of, needs_netns, netns_processes

from wirespeed.scalemodel import blocked, small_all_reduce_peers, store_load, tcp_sockets, tcp_sockets_to

pytestmark = [pytest.mark.netns, pytest.mark.slow, needs_netns]

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "scale_setup.py")


@pytest.mark.timeout(600)
def test_sockets_per_rank_are_pair_streams_count(cluster_name, tmp_path):
    out = tmp_path / "scale.jsonl"
    p = subprocess.run([sys.executable, SCRIPT, "--hosts", "2,4", "--per-host", "2", "--name", cluster_name,
                        "--timeout", "120", "--json", str(out)],
                       capture_output=True, text=True, timeout=580)
    assert p.returncode == 0, (p.stdout[-2000:], p.stderr[-2000:])
    cases = {(c["hosts"], c["per_host"]): c["ranks"] for c in map(json.loads, out.read_text().splitlines())}
    assert sorted(cases) == [(2, 2), (4, 2)], p.stdout[-2000:]
    for (h, k), ranks in cases.items():
        lay = blocked(h, k)
        assert [r["rank"] for r in ranks] == list(range(h * k))
        for r in ranks:
            assert r["ok"], r
            assert r["host"] == f"h{lay[r['rank']]}"
            s = r["sockets"]
            peers = small_all_reduce_peers(lay, r["rank"])
            remote = [p for p in range(h * k) if lay[p] != lay[r["rank"]]]
            assert s["streams"] == tcp_sockets_to(lay, r["rank"], peers, 12, 4096), (h, k, r["rank"], peers, s)
            assert r["sockets_a2a"]["streams"] == tcp_sockets_to(lay, r["rank"], remote, 12, 4096) == len(remote), \
                (h, k, r["rank"], r["sockets_a2a"])
            assert len(remote) < tcp_sockets(lay, r["rank"], 12)  # what every stream of every pair would be
            assert s["listen"] == 1, s  # its own listener (the store's is counted apart)
            # the store: rank 0 serves it (listener, its own client, one accepted per rank)
            assert s["store"] == (h * k + 2 if r["rank"] == 0 else 1), s
            want = store_load(lay, r["rank"])
            assert (r["store"]["keys_read"], r["store"]["keys_written"], r["store"]["requests"]) == \
                (want.read, want.written, want.requests), r["store"]
    # After the all_reduce, on 4 hosts x 2: a leader one stream to each of its 2 doubling partners
    # (its 4 KiB messages open no more), the other ranks none (every remote pair connected at
    # setup with all its streams was 50 on every rank); on 2 hosts a leader 1 to the other leader.
    assert sorted(r["sockets"]["streams"] for r in cases[(4, 2)]) == [0, 0, 0, 0, 2, 2, 2, 2]
    assert sorted(r["sockets"]["streams"] for r in cases[(2, 2)]) == [0, 0, 1, 1]
    # After the all_to_all: one stream to each of the 6 remote ranks (with all of pair_streams'
    # open: 12 to each of 3 counterparts and to a neighbour at one end of the host's block, 1 to
    # each of the 2 others, 50; the full mesh of 12 would be 72)
    assert sorted({r["sockets_a2a"]["streams"] for r in cases[(4, 2)]}) == [6]
    assert "all equal" in p.stdout, p.stdout[-2000:]
    assert netns_processes(cluster_name) == {}
    assert leftovers_of(cluster_name) == []  # the script tore its cluster down
