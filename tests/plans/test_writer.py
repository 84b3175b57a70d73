"""The plan writer and wirespeed's algorithms as plans: the committed fixtures are exactly what the
writer makes now (regenerate with `python -m wirespeed.plans.algorithms --out tests/plans/fixtures`),
and every plan is well formed: indices resolve, channels pair, signals match waits."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from wirespeed.plans import algorithms
from wirespeed.plans.writer import I, O, S, PlanBuilder, Remote

FIXTURES = Path(__file__).parent / "fixtures"
EXPECTED = algorithms.fixtures()
TOP = {"name", "collective", "protocol", "inplace", "reuse_resources", "gpus", "num_threads_per_block",
       "use_double_scratch_buffer", "buffer_alignment", "min_message_size", "max_message_size"}
SIGNALS = {"signal", "rlxsignal", "pws", "pwsf"}
WAITS = {"wait", "rlxwait"}


def _ops(ops):
    for op in ops:
        yield op
        if op["name"] == "pipeline":
            yield from _ops(op["ops"])


def problems(plan: dict) -> list[str]:
    """What is malformed in `plan`: dangling indices, unpaired channels, signals without waits."""
    out = []
    if set(plan) != TOP:
        out.append(f"top-level keys {sorted(set(plan) ^ TOP)}")
    gpus = plan["gpus"]
    n = len(gpus)
    peers = []  # per rank: {type: [peer by channel index]}
    for r, g in enumerate(gpus):
        if g["id"] != r:
            out.append(f"gpu {r} has id {g['id']}")
        d = {}
        for c in g["channels"]:
            d.setdefault(c["channel_type"], []).extend(c["connected_to"])
        peers.append(d)
    for r in range(n):
        for t, lst in peers[r].items():
            for p in set(lst):
                if not (0 <= p < n) or p == r:
                    out.append(f"rank {r}: {t} channel to {p}")
                elif lst.count(p) != peers[p].get(t, []).count(r):
                    out.append(f"{t} channels {r}->{p}: {lst.count(p)}, {p}->{r}: {peers[p].get(t, []).count(r)}")
    signals, waits = Counter(), Counter()  # (rank, type, peer, k): count
    for r, g in enumerate(gpus):
        where = f"rank {r}"
        chunks = {"i": g["input_chunks"], "o": g["output_chunks"], "s": g["scratch_chunks"]}
        for rb in g["remote_buffers"]:
            for a in rb["access_channel_types"]:
                if r == rb["rank"] or rb["rank"] not in peers[r].get(a, []):
                    out.append(f"{where}: remote buffer on {rb['rank']} with no {a} channel to it")
        ntb = len(g["threadblocks"])
        for t_i, tb in enumerate(g["threadblocks"]):
            w = f"{where} tb {t_i}"
            if tb["id"] != t_i:
                out.append(f"{w} has id {tb['id']}")
            chans = {c["channel_type"]: c["channel_ids"] for c in tb["channels"]}
            rbufs = {c["access_channel_type"]: c["remote_buffer_ids"] for c in tb["remote_buffer_refs"]}
            for t, ids in chans.items():
                if any(not 0 <= i < len(peers[r].get(t, [])) for i in ids):
                    out.append(f"{w}: {t} channel ids {ids} past the rank's list")
            for t, ids in rbufs.items():
                if any(not 0 <= i < len(g["remote_buffers"]) for i in ids):
                    out.append(f"{w}: remote buffer ids {ids} past the rank's list")
            if sum(1 for _ in _ops(tb["ops"])) > 64:
                out.append(f"{w}: over the executor's 64 ops a block")
            for op in _ops(tb["ops"]):
                name, ctype = op["name"], op.get("channel_type")
                local_ids = chans.get(ctype, [])
                for i in op.get("channel_ids", []):
                    if not 0 <= i < len(local_ids):
                        out.append(f"{w} {name}: channel id {i} past the block's {ctype} list")
                        continue
                    idx = local_ids[i]
                    if idx >= len(peers[r].get(ctype, [])):
                        continue  # reported with the block's list above
                    p = peers[r][ctype][idx]
                    key = (r, ctype, p, peers[r][ctype][:idx].count(p))
                    if name in SIGNALS:
                        signals[key] += 1
                    if name in WAITS:
                        waits[key] += 1
                for ref in op.get("src_buff", []) + op.get("dst_buff", []):
                    if "type" in ref:
                        if ref["index"] + ref["size"] > chunks[ref["type"]]:
                            out.append(f"{w} {name}: {ref} past the {chunks[ref['type']]} chunks")
                    elif "buffer_id" in ref:
                        ids = rbufs.get(ctype, [])
                        if not 0 <= ref["buffer_id"] < len(ids):
                            out.append(f"{w} {name}: buffer_id {ref['buffer_id']} past the block's list")
                            continue
                        rb = g["remote_buffers"][ids[ref["buffer_id"]]]
                        theirs = gpus[rb["rank"]]
                        size = {"i": theirs["input_chunks"], "o": theirs["output_chunks"],
                                "s": theirs["scratch_chunks"]}[rb["type"]]
                        if ref["index"] + ref["size"] > size:
                            out.append(f"{w} {name}: {ref} past rank {rb['rank']}'s {size} chunks")
                if name == "barrier" and op["num_threadblocks"] > ntb:
                    out.append(f"{w}: barrier of {op['num_threadblocks']} blocks, the rank has {ntb}")
                tbg = op.get("tbg_info")
                if tbg and not 0 <= tbg["tb_id"] < tbg["tbg_size"]:
                    out.append(f"{w} {name}: tbg_info {tbg}")
    # a signal on r's k-th channel to p is consumed by a wait on p's k-th channel to r
    for (r, t, p, k), cnt in signals.items():
        if waits[(p, t, r, k)] != cnt:
            out.append(f"{t} channel {r}->{p} #{k}: {cnt} signals, {waits[(p, t, r, k)]} waits")
    for (p, t, r, k), cnt in waits.items():
        if (r, t, p, k) not in signals:
            out.append(f"{t} channel {r}->{p} #{k}: no signals, {cnt} waits")
    return out


def test_fixtures_are_the_writers_output():
    on_disk = {p.name for p in FIXTURES.glob("*.json")}
    assert on_disk == set(EXPECTED), "regenerate: python -m wirespeed.plans.algorithms --out tests/plans/fixtures"
    for name, plan in EXPECTED.items():
        assert (FIXTURES / name).read_text() == algorithms.dump(plan), f"{name} drifted from the writer"


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fixture_is_well_formed(name):
    plan = json.loads((FIXTURES / name).read_text())
    assert problems(plan) == []
    assert plan["name"] + ".json" == name


def test_the_fixture_set():
    # one host: 2, 4 and 8 ranks; port plans: 2 and 4 hosts of 1 and 2 ranks
    assert len(EXPECTED) == 6 * 3 + 5 * 4
    assert "allreduce_ring_port_4r_2h.json" in EXPECTED and "allreduce_oneshot_ll_8r.json" in EXPECTED
    protocols = {json.loads(algorithms.dump(p))["protocol"] for p in EXPECTED.values()}
    assert protocols == {"Simple", "LL"}


# -- the builder ---------------------------------------------------------------------------


def test_channels_pair_k_th_with_k_th():
    b = PlanBuilder("t", "test", 3)
    a = b.channel(0, 1, "memory")
    c = b.channel(0, 2, "memory")
    second = b.channel(0, 1, "memory", k=1)
    back = b.channel(1, 0, "memory", k=1)
    assert (a.index, c.index, second.index, back.index) == (0, 1, 2, 1)
    assert b.channel(0, 1, "memory") == a  # asking again gives the same channel
    gpus = b.to_json()["gpus"]
    assert gpus[0]["channels"] == [{"channel_type": "memory", "connected_to": [1, 2, 1]}]
    assert gpus[1]["channels"] == [{"channel_type": "memory", "connected_to": [0, 0]}]
    assert gpus[2]["channels"] == [{"channel_type": "memory", "connected_to": [0]}]


def test_thread_block_lists_index_the_rank_lists():
    b = PlanBuilder("t", "test", 3).chunks(input=2, output=2, scratch=2)
    c1, c2 = b.channel(0, 1, "port"), b.channel(0, 2, "port")
    b.threadblock(0).put(I(0), Remote(1, "s", 0), c1)  # rank-level buffer 0, port channel 0
    tb = b.threadblock(0)
    tb.put(I(1), Remote(2, "s", 1), c2, signal=True)  # rank buffer 1, channel 1: local index 0 for both
    tb.put(I(0), Remote(1, "s", 1), c1, signal=True, flush=True)
    tb.wait([c1, c2])
    g = b.to_json()["gpus"][0]
    assert g["remote_buffers"] == [{"rank": 1, "type": "s", "access_channel_types": ["port"]},
                                   {"rank": 2, "type": "s", "access_channel_types": ["port"]}]
    t = g["threadblocks"][1]
    assert t["channels"] == [{"channel_type": "port", "channel_ids": [1, 0]}]
    assert t["remote_buffer_refs"] == [{"access_channel_type": "port", "remote_buffer_ids": [1, 0]}]
    names = [op["name"] for op in t["ops"]]
    assert names == ["pws", "nop", "pwsf", "wait"]
    assert t["ops"][0]["channel_ids"] == [0] and t["ops"][2]["channel_ids"] == [1]
    assert t["ops"][2]["dst_buff"] == [{"buffer_id": 1, "index": 1, "size": 1}]
    assert t["ops"][3]["channel_ids"] == [1, 0]


def test_nops_where_the_executor_needs_a_syncthreads():
    b = PlanBuilder("t", "test", 2).chunks(input=1, output=1, scratch=1)
    ch = b.channel(0, 1, "memory")
    tb = b.threadblock(0)
    tb.signal(ch, relaxed=True)
    tb.wait(ch, relaxed=True)  # after a signal: no nop
    tb.signal(ch)  # relays the wait on another thread: nop
    tb.put(I(0), Remote(1, "s", 0), ch)  # nothing waits for a signal to have gone out: no nop
    tb.barrier(0, 1)  # a barrier syncs by itself
    tb.copy(S(0), O(0))
    names = [op["name"] for op in b.to_json()["gpus"][0]["threadblocks"][0]["ops"]]
    assert names == ["rlxsignal", "rlxwait", "nop", "signal", "put", "barrier", "copy"]
    assert [op["name"] for op in b.to_json(nops=False)["gpus"][0]["threadblocks"][0]["ops"]] == [
        "rlxsignal", "rlxwait", "signal", "put", "barrier", "copy"]


def test_pipeline_nests_its_ops():
    b = PlanBuilder("t", "test", 2).chunks(input=1, output=1, scratch=1)
    ch = b.channel(0, 1, "memory")
    tb = b.threadblock(0)
    sem = b.semaphore(0, init_value=1)
    with tb.pipeline(unit_size=1 << 20, num_chunks=1):
        tb.sem_acquire(sem)
        tb.put(I(0), Remote(1, "s", 0), ch)
        tb.signal(ch)
    tb.wait(ch)
    g = b.to_json()["gpus"][0]
    pipe = g["threadblocks"][0]["ops"][0]
    assert pipe["iter_context"] == {"unit_size": 1 << 20, "num_chunks": 1}
    assert [op["name"] for op in pipe["ops"]] == ["sem_acquire", "nop", "put", "nop", "signal"]
    assert g["threadblocks"][0]["ops"][1:] == [{"name": "wait", "channel_ids": [0], "channel_type": "memory"}]
    assert g["semaphores"] == [{"init_value": 1}]


def test_packet_and_reduce_ops():
    b = PlanBuilder("t", "allreduce", 3, protocol="LL").chunks(input=1, output=1, scratch=2)
    tb = b.threadblock(0)
    tb.put_packets([I(0), I(0)], [Remote(1, "s", 0), Remote(2, "s", 0)])
    tb.reduce_packets(I(0), [S(0), S(1)], O(0), send_to=[Remote(1, "s", 1)])
    tb.reduce_packets(I(0), [S(0)], O(0), copy_to=S(1))
    tb.unpack_packets(S(0), O(0))
    plan = b.to_json()
    assert plan["use_double_scratch_buffer"] is True
    ops = [op for op in plan["gpus"][0]["threadblocks"][0]["ops"] if op["name"] != "nop"]
    assert [op["name"] for op in ops] == ["ppkt", "respkt", "recpkt", "upkt"]
    assert ops[1]["dst_buff"][1] == {"buffer_id": 0, "index": 1, "size": 1}
    assert ops[2]["dst_buff"] == [{"type": "o", "index": 0, "size": 1}, {"type": "s", "index": 1, "size": 1}]
    b2 = PlanBuilder("t", "allreduce", 2).chunks(input=2, output=2)
    t2 = b2.threadblock(0)
    t2.read_reduce(I(0), [Remote(1, "i", 0)], O(0), send_to=[Remote(1, "o", 0)], tbg=(1, 2))
    t2.reduce([I(0), I(1)], O(0))
    rres, _, re = b2.to_json()["gpus"][0]["threadblocks"][0]["ops"]
    assert rres["name"] == "rres" and rres["tbg_info"] == {"tb_id": 1, "tbg_size": 2}
    assert [r.get("buffer_id") for r in rres["src_buff"] + rres["dst_buff"]] == [None, 0, None, 1]
    assert re == {"name": "re", "src_buff": [{"type": "i", "index": 0, "size": 1},
                                             {"type": "i", "index": 1, "size": 1}],
                  "dst_buff": [{"type": "o", "index": 0, "size": 1}], "reduce_op": "sum"}


@pytest.mark.parametrize("misuse", [
    lambda b, tb, m, p: tb.put(I(0), Remote(1, "s", 0), m, signal=True),  # memory put has no signal form
    lambda b, tb, m, p: tb.put(I(0), Remote(1, "s", 0), p, flush=True),  # no put+flush
    lambda b, tb, m, p: tb.put(I(0), Remote(2, "s", 0), b.channel(0, 1, "port")),  # buffer on 2 via channel to 1
    lambda b, tb, m, p: tb.put([I(0), I(1)], Remote(1, "s", 0), m),  # two sources, one destination
    lambda b, tb, m, p: tb.put_packets(I(0), Remote(1, "o", 0)),  # packets outside scratch
    lambda b, tb, m, p: tb.signal([m, p]),  # two channel types in one op
    lambda b, tb, m, p: tb.copy(I(0), Remote(1, "o", 0)),  # a remote reference with no channel
    lambda b, tb, m, p: b.threadblock(1).signal(m),  # rank 0's channel in rank 1's block
    lambda b, tb, m, p: b.channel(0, 0, "memory"),  # a channel to itself
])
def test_builder_refuses_misuse(misuse):
    b = PlanBuilder("t", "test", 3).chunks(input=2, output=2, scratch=2)
    tb = b.threadblock(0)
    with pytest.raises((ValueError, TypeError)):
        misuse(b, tb, b.channel(0, 1, "memory"), b.channel(0, 1, "port"))


def test_builder_refuses_what_the_executor_cannot_hold():
    b = PlanBuilder("t", "test", 2).chunks(input=1, output=1, scratch=1)
    ch = b.channel(0, 1, "memory")
    tb = b.threadblock(0)
    for _ in range(64):
        tb.signal(ch)  # no nops between signals
    b.to_json()  # 64 ops: the most a block holds
    tb.signal(ch)
    with pytest.raises(ValueError, match="65 ops"):
        b.to_json()
    wide = PlanBuilder("t", "test", 10).chunks(input=1, output=1, scratch=1)
    chans = [wide.channel(0, p, "port") for p in range(1, 10)]
    wide.threadblock(0).signal(chans)  # 9 channels in one op
    with pytest.raises(ValueError, match="more channels"):
        wide.to_json()


# -- the sanity check itself sees what it claims to ----------------------------------------


def _pair_plan(signals_0: int, waits_1: int) -> dict:
    b = PlanBuilder("t", "test", 2).chunks(input=1, output=1, scratch=1)
    c01, c10 = b.channel(0, 1, "memory"), b.channel(1, 0, "memory")
    t0, t1 = b.threadblock(0), b.threadblock(1)
    t0.put(I(0), Remote(1, "s", 0), c01)
    for _ in range(signals_0):
        t0.signal(c01)
    for _ in range(waits_1):
        t1.wait(c10)
    t1.copy(S(0), O(0))
    return b.to_json()


def test_problems_sees_unmatched_signals_and_bad_indices():
    assert problems(_pair_plan(1, 1)) == []
    assert problems(_pair_plan(2, 1)) == ["memory channel 0->1 #0: 2 signals, 1 waits"]
    assert problems(_pair_plan(0, 1)) == ["memory channel 0->1 #0: no signals, 1 waits"]
    plan = _pair_plan(1, 1)
    plan["gpus"][1]["channels"] = []  # rank 1 no longer has its side of the pair
    assert any("memory channels 0->1: 1, 1->0: 0" in p for p in problems(plan))
    plan = _pair_plan(1, 1)
    plan["gpus"][0]["threadblocks"][0]["ops"][0]["dst_buff"][0]["index"] = 1  # past rank 1's scratch
    assert any("past rank 1's 1 chunks" in p for p in problems(plan))
    plan = _pair_plan(1, 1)
    plan["gpus"][1]["threadblocks"][0]["ops"][0]["channel_ids"] = [3]
    assert any("channel id 3 past" in p for p in problems(plan))
