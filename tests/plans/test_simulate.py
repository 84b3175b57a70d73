"""`plan simulate`: the timing model on plans small enough to time by hand (docs/plans-simulate.md).

Each plan is written here as the JSON MSCCL++'s DSL would emit, and every expected time is the
model's own formula written out, so a change to how an op, a NIC, a latency or a packet is priced
shows as a number that moved. No rank is launched."""
from __future__ import annotations

import json

import pytest

from wirespeed.cli.main import main
from wirespeed.errors import UsageError
from wirespeed.plans.format import PlanError, parse
from wirespeed.plans.simulate import BUSBW_FACTOR, compare, fit_size, simulate, table
from wirespeed.plans.topology import GB, NVLINK_IB, PRESETS, parse_topology

OP = 1e-6          # seconds per op
LAT = 10e-6        # port latency
BW = 1e9           # port bandwidth, bytes/s
COPY = 1000e9      # local copy rate
S = 1 << 20        # message size: one chunk per rank, so each put moves S bytes

TOPO = "ranks-per-host=1,nics-per-host=1,port=1GB/s:10us,memory=100GB/s:1us,copy=1000GB/s,op=1us,fabric=none"


def buf(kind, index=0, size=1):
    return {"type": kind, "index": index, "size": size}


def remote(bid, index=0, size=1):
    return {"buffer_id": bid, "index": index, "size": size}


def gpu(rank, tbs, peers=(), ctype="port", remote_type="o", scratch=0):
    """A rank whose thread blocks use `ctype` channels to `peers` (channel i to peers[i]) and
    reach each peer's `remote_type` buffer as remote buffer i."""
    out = {"id": rank, "input_chunks": 1, "output_chunks": 1, "scratch_chunks": scratch,
           "threadblocks": [], "channels": [], "remote_buffers": [], "semaphores": []}
    if peers:
        out["channels"] = [{"channel_type": ctype, "connected_to": list(peers)}]
        out["remote_buffers"] = [{"rank": p, "type": remote_type, "access_channel_types": [ctype]}
                                 for p in peers]
    for i, ops in enumerate(tbs):
        tb = {"id": i, "ops": ops}
        if peers:
            tb["channels"] = [{"channel_type": ctype, "channel_ids": list(range(len(peers)))}]
            tb["remote_buffer_refs"] = [{"access_channel_type": ctype,
                                         "remote_buffer_ids": list(range(len(peers)))}]
        out["threadblocks"].append(tb)
    return out


def plan(gpus, collective="sendrecv", protocol="Simple", name="p"):
    return parse({"name": name, "collective": collective, "protocol": protocol, "inplace": False,
                  "gpus": gpus, "buffer_alignment": 16}, source=f"{name}.json")


def put_signal(ch=0):
    return [{"name": "put", "src_buff": [buf("i")], "dst_buff": [remote(ch)], "channel_ids": [ch],
             "channel_type": "port"},
            {"name": "signal", "channel_ids": [ch], "channel_type": "port"}]


def wait(ch=0, ctype="port"):
    return [{"name": "wait", "channel_ids": [ch], "channel_type": ctype}]


def one_put():
    """Rank 0 puts its input into rank 1's output over a port channel and signals; rank 1 waits."""
    return plan([gpu(0, [put_signal()], peers=[1]), gpu(1, [wait()], peers=[0])])


def test_one_port_put_is_issue_then_bytes_over_the_nic_then_latency():
    r = simulate(one_put(), parse_topology(TOPO), S)
    # rank 0 issues the put (OP); its proxy moves S bytes (S/BW) and then the signal, which
    # arrives LAT later; rank 1's wait ends there. The signal's own issue (OP) hides under S/BW.
    assert r.time == pytest.approx(OP + S / BW + LAT, rel=1e-12)
    assert r.moved == {"nic-out": S}
    assert r.busbw == pytest.approx(S / r.time / GB)        # sendrecv: factor 1


def test_a_tiny_put_is_bound_by_the_issue_of_the_signal_not_the_bytes():
    r = simulate(one_put(), parse_topology(TOPO), 256)
    assert 256 / BW < OP
    assert r.time == pytest.approx(2 * OP + LAT, rel=1e-12)


def test_within_a_host_a_port_channel_uses_the_memory_path():
    r = simulate(one_put(), parse_topology(TOPO + ",ranks-per-host=2"), S)
    assert r.time == pytest.approx(OP + S / 100e9 + 1e-6, rel=1e-12)
    assert r.moved == {"memory": S}


def two_senders(both: bool):
    """Ranks 0 and 1 (host 0) put to ranks 2 and 3 (host 1) at once; or only rank 0 does."""
    idle = [[{"name": "nop"}]]
    return plan([gpu(0, [put_signal()], peers=[2]), gpu(1, [put_signal()] if both else idle, peers=[3]),
                 gpu(2, [wait()], peers=[0]), gpu(3, [wait()] if both else idle, peers=[1])])


def test_two_puts_through_one_nic_take_twice_the_bytes_time_of_one():
    topo = parse_topology(TOPO + ",ranks-per-host=2")
    one = simulate(two_senders(False), topo, S).time
    two = simulate(two_senders(True), topo, S).time
    assert one == pytest.approx(OP + S / BW + LAT, rel=1e-12)
    assert two == pytest.approx(OP + 2 * S / BW + LAT, rel=1e-12)
    assert (two - OP - LAT) == pytest.approx(2 * (one - OP - LAT), rel=1e-12)
    # with a NIC per rank they no longer share
    apart = simulate(two_senders(True), parse_topology(TOPO + ",ranks-per-host=2,nics-per-host=2"), S)
    assert apart.time == pytest.approx(one, rel=1e-12)


def test_a_copying_proxy_delays_the_wire_by_its_first_piece():
    # proxy-copy=256K: the proxy copies S in 4 pieces at COPY; the wire starts after the first.
    piece = 256 << 10
    r = simulate(one_put(), parse_topology(TOPO + ",proxy-copy=256K"), S)
    assert r.time == pytest.approx(OP + piece / COPY + S / BW + LAT, rel=1e-12)
    # a copy slower than the wire: the last piece leaves after all the copying
    slow = 0.5e9
    r = simulate(one_put(), parse_topology(TOPO + ",proxy-copy=256K,copy=0.5GB/s"), S)
    assert r.time == pytest.approx(OP + S / slow + piece / BW + LAT, rel=1e-12)


def test_ranks_beyond_the_cores_slow_their_cpu_work_not_the_wire():
    # 2 ranks on 1 core: each op's issue and the proxy's copy take twice as long; the wire does not.
    piece = 256 << 10
    r = simulate(one_put(), parse_topology(TOPO + ",proxy-copy=256K,cores=1"), S)
    assert r.time == pytest.approx(2 * OP + 2 * piece / COPY + S / BW + LAT, rel=1e-12)
    # as many cores as ranks (or more): nothing changes
    for cores in (2, 8):
        r = simulate(one_put(), parse_topology(TOPO + f",proxy-copy=256K,cores={cores}"), S)
        assert r.time == pytest.approx(OP + piece / COPY + S / BW + LAT, rel=1e-12)


def fan_in():
    """Ranks 0 and 1 (hosts 0 and 1) each put S into rank 2 (host 2) at once, rank 1 into rank 2's
    scratch; rank 2 waits for both."""
    r1 = gpu(1, [put_signal()], peers=[2])
    r1["remote_buffers"][0]["type"] = "s"
    sink = gpu(2, [wait(0) + wait(1)], peers=[0, 1], scratch=1)
    return plan([gpu(0, [put_signal()], peers=[2]), r1, sink])


def test_a_nic_fed_by_two_hosts_at_once_carries_the_later_transfer_at_the_fanin_rate():
    fan = 0.5e9
    # without the term the NIC in queues both puts at the port rate
    assert simulate(fan_in(), parse_topology(TOPO), S).time == pytest.approx(OP + 2 * S / BW + LAT, rel=1e-12)
    # with it, the put that finds the NIC busy with the other host's crosses it at the fan-in rate
    r = simulate(fan_in(), parse_topology(TOPO + ",port-fanin=0.5GB/s"), S)
    assert r.time == pytest.approx(OP + S / BW + S / fan + LAT, rel=1e-12)
    # one sender into a NIC, or a fan-in rate above the port's, changes nothing
    assert simulate(one_put(), parse_topology(TOPO + ",port-fanin=0.5GB/s"), S).time == \
        pytest.approx(OP + S / BW + LAT, rel=1e-12)
    assert simulate(fan_in(), parse_topology(TOPO + ",port-fanin=5GB/s"), S).time == \
        pytest.approx(OP + 2 * S / BW + LAT, rel=1e-12)


def test_the_fanin_rate_parses_and_can_be_unset():
    assert parse_topology("cpu-emulated,port-fanin=0.1GB/s").port_fanin == pytest.approx(0.1e9)
    assert parse_topology("cpu-emulated,port-fanin=0.1GB/s,port-fanin=none").port_fanin is None
    assert PRESETS["cpu-emulated"].port_fanin is None


def test_back_to_back_runs_overlap_as_a_loop_does():
    # rank 0's next run starts once its thread block has issued the put and the signal (2 OP),
    # not when rank 1 has its data: its proxy queues the next put on the NIC right behind the
    # last, so two runs take S/BW each plus one issue and one latency, not twice a single run.
    one = simulate(one_put(), parse_topology(TOPO), S)
    two = simulate(one_put(), parse_topology(TOPO), S, runs=2)
    assert one.runs == 1 and two.runs == 2
    assert two.time == pytest.approx((OP + 2 * S / BW + LAT) / 2, rel=1e-12)
    assert two.time < one.time
    assert two.steps == 2 * one.steps


def test_the_nvlink_preset_has_no_cpu_share_and_no_proxy_copy():
    assert NVLINK_IB.cores is None and NVLINK_IB.proxy_copy == 0
    assert NVLINK_IB.cpu_slowdown(64) == 1.0
    assert PRESETS["cpu-emulated"].proxy_copy == 1 << 20


def packet_put():
    """LL: rank 0 copies its input into packets in its scratch, its proxy puts them into rank
    1's scratch, rank 1 unpacks them into its output (the packets' flags are the sync)."""
    send = [{"name": "cpkt", "src_buff": [buf("i")], "dst_buff": [buf("s")]},
            {"name": "ppkt", "src_buff": [buf("s")], "dst_buff": [remote(0)], "channel_ids": [0],
             "channel_type": "port"}]
    recv = [{"name": "upkt", "src_buff": [buf("s")], "dst_buff": [buf("o")]}]
    return plan([gpu(0, [send], peers=[1], remote_type="s", scratch=1),
                 gpu(1, [recv], peers=[0], remote_type="s", scratch=1)], protocol="LL")


def test_packets_double_the_bytes_on_the_wire():
    r = simulate(packet_put(), parse_topology(TOPO), S)
    assert r.moved["nic-out"] == 2 * S
    # cpkt: OP + (S read + 2S written) / 2 / COPY; ppkt: OP, then the proxy's 2S / BW and the
    # packets' arrival LAT later; upkt: OP + (2S read + S written) / 2 / COPY.
    local = 1.5 * S / COPY
    assert r.time == pytest.approx(3 * OP + 2 * local + 2 * S / BW + LAT, rel=1e-12)


def handshake_put():
    """Simple with the receiver's go-ahead first: rank 1 signals, rank 0 waits, puts, signals."""
    return plan([gpu(0, [wait() + put_signal()], peers=[1]),
                 gpu(1, [[{"name": "signal", "channel_ids": [0], "channel_type": "port"}] + wait()],
                     peers=[0])], name="simple")


def test_side_by_side_marks_the_faster_plan_per_size():
    topo = parse_topology(TOPO)
    plans = [("simple", handshake_put()), ("ll", packet_put())]
    small, large = compare(plans, topo, [1024, 64 << 20])
    # small: LL pays one latency, the handshake two; large: LL's doubled bytes lose
    assert small[1].time < small[0].time and large[0].time < large[1].time
    lines = table(plans, [small, large], topo)
    fastest = [ln for ln in lines if "<- fastest" in ln]
    assert len(fastest) == 2 and fastest[0].lstrip().startswith("ll") and fastest[1].lstrip().startswith("simple")
    assert lines[0].startswith("topology ")


def nops(n, collective):
    gpus = [gpu(r, [[{"name": "nop"}]]) for r in range(n)]
    for g in gpus:   # one chunk per rank's share: the whole buffer has n of them
        g["output_chunks" if collective == "allgather" else "input_chunks"] = \
            n if collective in ("allgather", "reducescatter") else 1
    return plan(gpus, collective=collective)


@pytest.mark.parametrize("collective,factor", [("allreduce", 1.5), ("allgather", 0.75),
                                               ("reducescatter", 0.75), ("alltoall", 0.75),
                                               ("broadcast", 1.0), ("sendrecv", 1.0)])
def test_busbw_is_algbw_times_the_collectives_factor(collective, factor):
    p = nops(4, collective)
    size = fit_size(p, 1 << 20)
    r = simulate(p, parse_topology(TOPO), size)
    assert r.time == pytest.approx(OP)
    assert r.algbw == pytest.approx(size / OP / GB)     # the message size as layout reads it
    assert r.busbw == pytest.approx(r.algbw * factor)


def test_the_factors_are_the_benchmarks():
    pytest.importorskip("torch")
    from wirespeed.bench.collectives import COLLECTIVES
    names = {"allreduce": "all_reduce", "allgather": "all_gather", "reducescatter": "reduce_scatter",
             "alltoall": "all_to_all", "sendrecv": "send_recv", "broadcast": "broadcast"}
    for ours, theirs in names.items():
        for n in (2, 3, 8):
            assert BUSBW_FACTOR[ours](n) == pytest.approx(COLLECTIVES[theirs].busbw_factor(n))


def test_memory_channel_puts_from_two_blocks_to_one_peer_share_the_pair():
    put = [{"name": "put", "src_buff": [buf("i")], "dst_buff": [remote(0)], "channel_ids": [0],
            "channel_type": "memory"}, {"name": "signal", "channel_ids": [0], "channel_type": "memory"}]
    w = [{"name": "wait", "channel_ids": [0], "channel_type": "memory"}]
    p = plan([gpu(0, [put, put], peers=[1], ctype="memory"), gpu(1, [w + w], peers=[0], ctype="memory")])
    # Two blocks of rank 0 put S bytes each over the one 0->1 pair at once: the second waits
    # for the first; its signal (one channel, signalled and waited twice) ends rank 1's wait.
    r = simulate(p, parse_topology(TOPO), S)
    assert r.time == pytest.approx(2 * OP + 2 * S / 100e9 + 1e-6, rel=1e-9)


def test_sizes_round_to_what_the_chunks_allow():
    p = nops(4, "allreduce")
    unit = fit_size(p, 1)
    assert fit_size(p, 1000 * unit + unit // 3) == 1000 * unit
    assert fit_size(p, 1) == unit


def test_a_deadlocked_plan_is_a_plan_error():
    p = plan([gpu(0, [wait()], peers=[1]), gpu(1, [wait()], peers=[0])])
    with pytest.raises(PlanError, match="deadlock"):
        simulate(p, parse_topology(TOPO), S)


def test_plans_side_by_side_must_do_one_collective():
    with pytest.raises(PlanError, match="one collective"):
        compare([("a", nops(2, "allreduce")), ("b", nops(2, "allgather"))], NVLINK_IB, [1024])


# ---- topology ----

def test_topology_inline_keys_override_the_preset():
    t = parse_topology("cpu-emulated,port=2gbit:100us,ranks-per-host=2")
    assert t.port.bandwidth == 2e9 / 8 and t.port.latency == pytest.approx(100e-6)
    assert t.ranks_per_host == 2 and t.memory == PRESETS["cpu-emulated"].memory
    assert t.name == "cpu-emulated+custom"
    t = parse_topology("memory=150GB/s")   # the rate alone keeps the latency
    assert t.memory.bandwidth == 150e9 and t.memory.latency == NVLINK_IB.memory.latency
    assert parse_topology(None) == NVLINK_IB


def test_topology_from_a_json_file(tmp_path):
    f = tmp_path / "box.json"
    f.write_text(json.dumps({"preset": "cpu-emulated", "ranks_per_host": 4, "switch": "5GB/s:3us"}))
    t = parse_topology(str(f))
    assert t.name == "box" and t.ranks_per_host == 4 and t.switch.bandwidth == 5e9
    assert t.copy == PRESETS["cpu-emulated"].copy


@pytest.mark.parametrize("text,says", [("memory=fast", "a rate is"), ("op=3parsecs", "a time is"),
                                       ("nvlink", "unknown preset"), ("links=2", "unknown key"),
                                       ("ranks-per-host=0", ">= 1"), ("op=1us,nvlink-ib", "not key=value"),
                                       ("cores=0", ">= 1"), ("proxy-copy=lots", "a size in bytes"),
                                       ("/nonexistent/box.json", "no such file")])
def test_bad_topologies_are_one_line(text, says):
    with pytest.raises(UsageError, match=says):
        parse_topology(text)


# ---- the command ----

def test_the_command_prints_a_table_and_writes_records(tmp_path, capsys):
    a, b = tmp_path / "simple.json", tmp_path / "ll.json"
    handshake = {"name": "simple", "collective": "sendrecv", "protocol": "Simple", "gpus": [
        gpu(0, [wait() + put_signal()], peers=[1]),
        gpu(1, [[{"name": "signal", "channel_ids": [0], "channel_type": "port"}] + wait()], peers=[0])]}
    a.write_text(json.dumps(handshake))
    ll = dict(handshake, name="ll", protocol="LL")
    ll["gpus"] = [gpu(0, [[{"name": "cpkt", "src_buff": [buf("i")], "dst_buff": [buf("s")]},
                           {"name": "ppkt", "src_buff": [buf("s")], "dst_buff": [remote(0)],
                            "channel_ids": [0], "channel_type": "port"}]], peers=[1], remote_type="s",
                      scratch=1),
                  gpu(1, [[{"name": "upkt", "src_buff": [buf("s")], "dst_buff": [buf("o")]}]], peers=[0],
                      remote_type="s", scratch=1)]
    b.write_text(json.dumps(ll))
    out_json = tmp_path / "sim.jsonl"
    assert main(["plan", "simulate", str(a), str(b), "--topology", TOPO, "--sizes", "1000,64M",
                 "--json", str(out_json)]) == 0
    out = capsys.readouterr().out
    assert "topology nvlink-ib+custom" in out and "<- fastest" in out
    # 1000 B rounded to the nearest multiple of 32 (16-byte units x 2 ranks x 1 chunk)
    assert "[at 992 B]" in out
    recs = [json.loads(x) for x in out_json.read_text().splitlines()]
    assert len(recs) == 4 and {r["schema"] for r in recs} == {"wirespeed.plan_simulate/1"}
    assert recs[0]["requested_size"] == 1000 and recs[0]["size"] == 992
    assert {r["runs"] for r in recs} == {1}
    # --runs: back-to-back runs, the time per run
    assert main(["plan", "simulate", str(a), "--topology", TOPO, "--sizes", "64M", "--runs", "3",
                 "--json", str(out_json)]) == 0
    rec = json.loads(out_json.read_text())
    assert rec["runs"] == 3 and rec["steps"] == 3 * recs[2]["steps"]


@pytest.mark.parametrize("args,says", [(["--topology", "memory=fast"], "a rate is"),
                                       (["--sizes", "1Q"], "does not parse"),
                                       (["--ranks", "4"], "--ranks says 4")])
def test_the_commands_mistakes_are_one_line_exit_2(tmp_path, capsys, args, says):
    p = tmp_path / "p.json"
    p.write_text(json.dumps({"name": "p", "collective": "sendrecv", "protocol": "Simple",
                             "gpus": [gpu(0, [put_signal()], peers=[1]), gpu(1, [wait()], peers=[0])]}))
    with pytest.raises(SystemExit) as e:
        main(["plan", "simulate", str(p), *args])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and "Traceback" not in err and says in err, err


def test_a_missing_plan_is_one_line_exit_2(capsys):
    with pytest.raises(SystemExit) as e:
        main(["plan", "simulate", "/nonexistent/plan.json"])
    assert e.value.code == 2 and "no such plan file" in capsys.readouterr().err


def test_sizes_outside_the_plans_range_are_marked():
    p = nops(2, "allreduce")
    p.max_size = 4096
    rows = compare([("p", p)], parse_topology(TOPO), [1024, 1 << 20])
    lines = table([("p", p)], rows, parse_topology(TOPO))
    marked = [ln for ln in lines if "outside the plan's message sizes 0..4096" in ln]
    assert len(marked) == 1 and "1048576" not in marked[0] and lines.index(marked[0]) > lines.index("1 MiB (1048576 B)")


def test_op_count_is_the_unrolled_steps_and_too_many_are_refused(monkeypatch):
    from wirespeed.plans import simulate as sim
    from wirespeed.plans.interpret import Machine
    from wirespeed.plans.layout import Layout
    body = [{"name": "put", "src_buff": [buf("i")], "dst_buff": [remote(0)], "channel_ids": [0],
             "channel_type": "memory"}, {"name": "signal", "channel_ids": [0], "channel_type": "memory"}]
    pipe = [{"name": "pipeline", "iter_context": {"unit_size": 4096, "num_chunks": 1}, "ops": body}]
    w = [{"name": "wait", "channel_ids": [0], "channel_type": "memory"}]
    p = plan([gpu(0, [pipe], peers=[1], ctype="memory"),
              gpu(1, [[{"name": "pipeline", "iter_context": {"unit_size": 4096, "num_chunks": 1}, "ops": w}]],
                  peers=[0], ctype="memory")])
    lay = Layout(p, 1 << 20)
    m = Machine(p, lay, data=False)
    assert sim.op_count(p, lay) == sum(len(s) for r in m.steps for s in r) == 256 * 2 + 256
    r = simulate(p, parse_topology(TOPO), 1 << 20)
    # 256 rounds of a 4 KiB put (issue, then 4 KiB over the free pair) and a signal (issue);
    # rank 1's waits keep up, so the last signal's arrival, 1 us after it, ends the run
    assert r.time == pytest.approx(256 * (2 * OP + 4096 / 100e9) + 1e-6, rel=1e-9)
    monkeypatch.setattr(sim, "MAX_STEPS", 700)
    with pytest.raises(PlanError, match="unroll into 768 ops"):
        simulate(p, parse_topology(TOPO), 1 << 20)
