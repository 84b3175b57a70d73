"""`wirespeed bench --plan`: execution plans run by real rank processes, over shared memory and
wirespeed's engine, timed and checked by the harness (every element of every checked call).

--host-per-rank gives every rank a host id of its own, so two local ranks are two hosts to the
executor and to the engine: a port channel then goes over TCP, a memory channel is refused."""
from __future__ import annotations

import ctypes
import json
import os

import pytest

from planfiles import allreduce_port_ll_2r, fixture, write
from wirespeed.plans.format import parse
from wirespeed.plans.layout import smallest_size


def allreduce_oneshot(n, packets=False):
    return fixture(f"allreduce_oneshot{'_ll' if packets else ''}_{n}r")


def allreduce_port_2r():
    return fixture("allreduce_ring_port_2r_2h")
from wsutil import wirespeed

SMALL = ("-b", "1K", "-e", "64K", "-f", "8", "-w", "2", "-n", "4", "--no-save", "--no-progress")


def bench(plan_path, tmp_path, *extra, timeout=90):
    out = tmp_path / "records.jsonl"
    p = wirespeed("bench", "--plan", plan_path, *SMALL, "--json", out, "-T", "30", *extra, timeout=timeout)
    records = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    return p, records


def assert_right(p, records, plan_name, ranks, sizes=(1024, 8192, 65536), collective="all_reduce"):
    assert p.returncode == 0, p.stdout + p.stderr
    assert [r["bytes"] for r in records] == list(sizes)
    for r in records:
        assert (r["collective"], r["backend"], r["world_size"]) == (collective, "wirespeed", ranks)
        assert r["plan"] == plan_name and r["plan_file"].endswith(".json")
        assert r["checked"] and r["wrong"] == 0 and r["time_us"] > 0 and r["busbw_gbps"] > 0
    assert f"plan {plan_name}" in p.stdout
    assert not [f for f in os.listdir("/dev/shm") if f.startswith("wirespeed-plan-")]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("packets", [False, True], ids=["memory-channels", "ll-packets"])
def test_two_ranks_all_reduce(tmp_path, packets):
    plan = allreduce_oneshot(2, packets)
    p, records = bench(write(tmp_path / "plan.json", plan), tmp_path)
    assert_right(p, records, plan["name"], 2)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("packets", [False, True], ids=["memory-channels", "ll-packets"])
def test_four_ranks_all_reduce(tmp_path, packets):
    plan = allreduce_oneshot(4, packets)
    p, records = bench(write(tmp_path / "plan.json", plan), tmp_path, timeout=150)
    # The sweep's sizes, rounded up to the plan's chunks (3 thread blocks share each).
    unit = smallest_size(parse(plan))
    assert_right(p, records, plan["name"], 4, sizes=tuple(-(-b // unit) * unit for b in (1024, 8192, 65536)))


@pytest.mark.timeout(120)
def test_in_place_all_gather(tmp_path):
    """The input is the rank's slice of the output: the harness's buffers alias as the plan's."""
    plan = fixture("allgather_direct_2r")
    p, records = bench(write(tmp_path / "plan.json", plan), tmp_path)
    assert_right(p, records, plan["name"], 2, collective="all_gather")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("make,hosts", [(allreduce_port_2r, "one host"), (allreduce_port_2r, "two hosts"),
                                        (allreduce_port_ll_2r, "two hosts")], ids=["signals-one-host",
                                                                                  "signals-two-hosts",
                                                                                  "ll-packets-two-hosts"])
def test_port_channels_over_the_engine(tmp_path, make, hosts):
    """One host: the engine's shared-memory path; a host per rank: its TCP path. Puts with
    signals, and LL packets whose flags travel with the data."""
    extra = ("--host-per-rank",) if hosts == "two hosts" else ()
    plan = make()
    p, records = bench(write(tmp_path / "plan.json", plan), tmp_path, *extra)
    assert_right(p, records, plan["name"], 2)


@pytest.mark.timeout(90)
def test_sizes_round_up_to_the_plans_chunks(tmp_path):
    # 2 ranks x 1 chunk of 16-byte units: 32-byte steps; 100 -> 128, 120 -> 128 (run once)
    p = wirespeed("bench", "--plan", write(tmp_path / "plan.json", allreduce_oneshot(2)), "--sizes", "100,120,4096",
                  "-w", "1", "-n", "2", "--no-save", "--no-progress", "-T", "30", timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "rounded up to multiples of 32 bytes" in p.stdout and "100->128" in p.stdout
    rows = [line.split()[0] for line in p.stdout.splitlines() if line.strip()[:1].isdigit()]
    assert rows == ["128", "4096"]


@pytest.mark.timeout(90)
def test_a_wrong_plan_is_counted_wrong(tmp_path):
    plan = allreduce_oneshot(2)
    for g in plan["gpus"]:   # each rank "sums" its own input alone: every element wrong
        g["threadblocks"][0]["ops"][-1]["src_buff"] = g["threadblocks"][0]["ops"][-1]["src_buff"][:1]
    p, records = bench(write(tmp_path / "plan.json", plan), tmp_path, "-e", "1K")
    assert p.returncode == 1, p.stdout + p.stderr
    assert records and all(r["wrong"] == 2 * 256 for r in records)
    assert "wrong elements" in p.stderr


@pytest.mark.timeout(60)
def test_a_memory_channel_between_hosts_is_refused(tmp_path):
    p = wirespeed("bench", "--plan", write(tmp_path / "plan.json", allreduce_oneshot(2)), "--host-per-rank",
                  *SMALL, "-T", "30", timeout=60)
    assert p.returncode == 2, p.stdout + p.stderr
    # Refused before any rank starts: the placement is known (each rank a host of its own).
    assert p.stderr.strip().splitlines() == [
        f"wirespeed: error: {tmp_path / 'plan.json'}: rank 0's memory channel 0 leads to rank 1 on another "
        "host: memory channels need shared memory; the plan needs a port channel there"]


@pytest.mark.timeout(60)
def test_refusals_before_any_rank_starts(tmp_path):
    path = write(tmp_path / "plan.json", allreduce_oneshot(2))
    p = wirespeed("bench", "--plan", path, "-N", "3", "--no-save", timeout=60)
    assert p.returncode == 2 and p.stderr.strip().endswith("the plan is for 2 ranks, -N asks for 3: use -N 2")
    p = wirespeed("bench", "--plan", path, "-c", "all_gather", "--no-save", timeout=60)
    assert p.returncode == 2 and "the plan is an allreduce plan, -c asks for all_gather" in p.stderr
    p = wirespeed("bench", "--plan", path, "--backend", "gloo", "--no-save", timeout=60)
    assert p.returncode == 2 and "--plan runs on wirespeed's CPU ranks" in p.stderr
    p = wirespeed("bench", "--plan", tmp_path / "missing.json", "--no-save", timeout=60)
    assert p.returncode == 2 and "no such plan file" in p.stderr
    small = allreduce_oneshot(2)
    small["max_message_size"] = 100
    p = wirespeed("bench", "--plan", write(tmp_path / "small.json", small), "-b", "1K", "--no-save", timeout=60)
    assert p.returncode == 2 and "no size of the sweep lies within the plan's message sizes (0..100" in p.stderr
    assert "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1
    p = wirespeed("bench", "--plan", path, "-b", "1M", "-e", "1T", "--no-save", timeout=60)
    assert p.returncode == 2 and "the plan's arenas need" in p.stderr and "use -e " in p.stderr


@pytest.mark.timeout(60)
def test_a_wait_that_never_ends_is_named(tmp_path):
    plan = allreduce_oneshot(2)
    ops = plan["gpus"][1]["threadblocks"][0]["ops"]
    plan["gpus"][1]["threadblocks"][0]["ops"] = [o for o in ops if o["name"] != "signal"]
    p = wirespeed("bench", "--plan", write(tmp_path / "plan.json", plan), "-b", "1K", "-e", "1K", "-w", "1",
                  "-n", "2", "--no-save", "--no-progress", "-T", "3", timeout=60)
    assert p.returncode == 3, p.stdout + p.stderr
    assert ("rank 0: plan 'allreduce_oneshot_2r': no progress for 2 s: rank 0, tb 0, op 6 (wait) (run 1) "
            "waits for a signal from rank 1 on memory channel 0") in p.stderr
    assert "Traceback" not in p.stderr


class _Wire:
    """Stands in for an engine group: keeps what each send carried."""

    def __init__(self):
        self.sent = []

    def send(self, to, buf, tag, keep):
        ptr, n = buf
        self.sent.append(ctypes.string_at(ptr, n))   # copied now, as the engine would send it
        return len(self.sent)


def test_a_big_put_crosses_in_pieces_each_with_its_own_header(monkeypatch):
    import numpy as np
    from collections import deque
    from wirespeed.plans import execute as ex
    monkeypatch.setattr(ex, "PIECE_WORDS", 4)
    links = ex.PortLinks.__new__(ex.PortLinks)
    wire = _Wire()
    links.out, links.sends = {1: wire}, {1: deque()}
    words = np.arange(10, dtype=np.float32)
    # LL packets: every data word takes two words at the destination, so the pieces' places step by 8
    links.send(1, [ex.PUT_PACKETS, 7, 100, 10, 3], words, stride=2)
    headers = [np.frombuffer(m, dtype=np.uint64).tolist() for m in wire.sent[0::2]]
    assert headers == [[ex.PUT_PACKETS, 7, 100, 4, 3], [ex.PUT_PACKETS, 7, 108, 4, 3],
                       [ex.PUT_PACKETS, 7, 116, 2, 3]]
    data = np.concatenate([np.frombuffer(m, dtype=np.float32) for m in wire.sent[1::2]])
    assert data.tolist() == words.tolist()
    # a signal is one header, no words
    wire.sent.clear()
    links.send(1, [ex.SIGNAL, 7, 0, 0, 0])
    assert len(wire.sent) == 1 and len(wire.sent[0]) == ex.HEADER * 8


def test_port_groups_open_few_streams_unless_the_user_says(monkeypatch):
    from wirespeed.native.rendezvous import knobs_under_environment
    from wirespeed.plans import execute as ex
    monkeypatch.delenv("WIRESPEED_NSTREAMS", raising=False)
    assert knobs_under_environment(ex.port_knobs()) == {"WIRESPEED_NSTREAMS": str(ex.PORT_STREAMS)}
    assert "WIRESPEED_NSTREAMS" not in os.environ     # given as data: the job's own groups keep the default
    monkeypatch.setenv("WIRESPEED_NSTREAMS", "5")
    assert knobs_under_environment(ex.port_knobs()) == {}
    assert os.environ["WIRESPEED_NSTREAMS"] == "5"
    assert os.environ["WIRESPEED_NSTREAMS"] == "5"
