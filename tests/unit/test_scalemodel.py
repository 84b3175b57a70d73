"""The setup model's exact parts (wirespeed.scalemodel) against the code they mirror: the closed
form of sockets per rank against pair_streams pair by pair, the records a rank reads against
rendezvous.needed_records and needed_hosts, a job's store reads against the sum over its ranks; and the figures
docs/scale.md quotes."""
from __future__ import annotations

import pytest

from wirespeed.native.rendezvous import needed_hosts, needed_records
from wirespeed.scalemodel import (blocked, hosts_read, job_store_reads, records_read, store_load, tcp_sockets,
                                  tcp_sockets_blocked)


@pytest.mark.parametrize("hosts", [1, 2, 3, 4, 7, 16])
@pytest.mark.parametrize("per_host", [1, 2, 3, 8])
def test_the_closed_forms_equal_the_pairwise_counts(hosts, per_host):
    lay = blocked(hosts, per_host)
    ids = [f"h{h}" for h in lay]
    for r in range(len(lay)):
        assert tcp_sockets_blocked(hosts, per_host, r) == tcp_sockets(lay, r)
        assert records_read(lay, r) == len(needed_records(r, ids))
    assert job_store_reads(hosts, per_host) == sum(store_load(lay, r).read for r in range(len(lay)))


def test_a_rank_reads_its_hosts_key_and_those_of_the_hosts_it_dials_first():
    ids = ["a", "b", "a", "b", "c"]  # interleaved: 0 and 2 share a host
    assert needed_records(0, ids) == [1, 2, 3, 4]
    assert needed_records(2, ids) == [0, 1, 3, 4]  # host b's key holds 1 with 3
    # every rank gets every address, so that it can dial a lower rank whose dial is late
    assert needed_records(4, ids) == [0, 1, 2, 3]
    assert needed_hosts(0, ids) == ["b", "c"]  # a leader reads its mates' records itself
    assert needed_hosts(2, ids) == ["a", "b", "c"]
    assert needed_hosts(3, ids) == ["b", "c"]  # its own host's key, from leader 1, holds a's
    assert needed_hosts(1, ids) == ["a", "c"]  # a leader reads every other host's addresses
    assert needed_hosts(4, ids) == ["a", "b"]
    for r in range(len(ids)):
        assert hosts_read([0, 1, 0, 1, 2], r) == len(needed_hosts(r, ids))
        assert records_read([0, 1, 0, 1, 2], r) == len(needed_records(r, ids))


def test_the_figures_docs_scale_quotes():
    # 1,024 hosts x 8 ranks, 12 streams: a rank's sockets; rank 0's and the job's store reads
    assert max(tcp_sockets_blocked(1024, 8, r) for r in range(8)) == 19448
    assert store_load(blocked(2, 8)[:8] + [1] * (8192 - 8), 0).read == 8192 + 7 + 1 + 5
    assert job_store_reads(1024, 8) == 4_785_663
    assert job_store_reads(64, 8) <= 64 * 512  # issue 39's bound at 512 ranks
    assert max(tcp_sockets_blocked(64, 8, r) for r in range(8)) == 1208
    assert max(tcp_sockets_blocked(256, 8, r) for r in range(8)) == 4856


def test_a_one_rank_rendezvous_counts_what_the_model_says():
    # the counting proxy on a real rendezvous (one rank, torch's in-process store): its counts are
    # store_load's, and it leaves what it measured in last_setup()
    import datetime

    import torch.distributed as dist

    from wirespeed.native import rendezvous as rv
    group = rv.rendezvous(dist.HashStore(), 0, 1, datetime.timedelta(seconds=10))
    got = rv.last_setup()
    want = store_load([0], 0)
    assert (got["keys_written"], got["keys_read"], got["requests"]) == (want.written, want.read, want.requests)
    assert got["rank"] == 0 and got["world"] == 1 and got["records_read"] == 0
    assert got["bytes_read"] > 0 and got["seconds"] > 0
    del group


def test_after_every_collective_a_leader_holds_its_log_partners_and_no_other_rank_any():
    from wirespeed.scalemodel import collective_peers, leader_partners, streams_after_collectives
    # 16 hosts: leaders at distance 1, 2, 4, 8 either way (8 once): 7 of the 15 others
    assert leader_partners(16, 0) == {1, 2, 4, 8, 12, 14, 15}
    assert leader_partners(5, 2) == {0, 1, 3, 4}  # 2 +- 1, 2 +- 2
    assert leader_partners(1, 0) == set() and leader_partners(2, 1) == {0}
    lay = blocked(16, 4)
    assert collective_peers(lay, 0) == [4, 8, 16, 32, 48, 56, 60]
    assert all(collective_peers(lay, r) == [] for r in range(64) if r % 4)
    assert max(streams_after_collectives(lay, r, 1) for r in range(64)) == 7
    # at 1,024 hosts a leader's partners stay 2 log2 H - 1: 19 (of 1,023 other leaders)
    assert len(leader_partners(1024, 5)) == 19
    # cyclic: leaders are the first rank of each host in host order
    cyc = [r % 3 for r in range(9)]
    assert collective_peers(cyc, 1) == [0, 2] and collective_peers(cyc, 4) == []


def test_a_pair_opens_one_stream_below_the_growth_size_and_every_stream_from_it():
    from wirespeed.scalemodel import grow_at, leaders_largest_message, opened, streams_after_collectives
    # one chunk of 32 KiB per stream: 384 KiB at 12 streams; a pair of one stream has nothing to open
    assert grow_at(12) == 393_216 and grow_at(2) == 65_536 and grow_at(1) == 0
    assert grow_at(12, 0) == 0 and grow_at(12, 1000) == 1000
    assert opened(12, 393_215) == 1 and opened(12, 393_216) == 12 and opened(12, None) == 12
    assert opened(1, 10) == 1 and opened(0, 10**9) == 0
    # 64 hosts x 8, 64 KiB buffers: pieces of 128 B, Bruck's rounds move 32 hosts' blocks of 8 x 8
    # pieces, 256 KiB; the all_reduce's 64 KiB buffer is smaller
    assert leaders_largest_message(64, 8, 64 << 10) == 32 * 64 * 128 == 262_144
    # 3 hosts x 2, 4 KiB: rounds d = 1 and 2 move 1 host's block each (2 x 2 pieces of 680 B)
    assert leaders_largest_message(3, 2, 4096) == 4096
    lay = blocked(64, 8)
    # a leader's 11 partner leaders: one stream each below 384 KiB, 12 each from it
    assert streams_after_collectives(lay, 0, 12, 262_144) == 11
    assert streams_after_collectives(lay, 0, 12, 1 << 20) == streams_after_collectives(lay, 0, 12) == 132
