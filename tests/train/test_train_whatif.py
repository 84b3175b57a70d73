"""The training step's bounds and what-if (train/whatif.py), on records whose times come
from a known latency and link: every figure is checked against the same arithmetic written out
here by hand, so a wrong factor, a wrong layout or a wrong overlap rule fails."""
import math

import pytest

from wirespeed.cli.main import main
from wirespeed.train.whatif import (NETWORK_BOUND_SHARE, StepModel, bench_sizes, bounds,
                                               wire_bytes)

pytestmark = pytest.mark.timeout(60)

RATE = 1e9          # bit/s
LAT_US = 100.0      # per ring step
MB = 1 << 20


def ring_all_reduce_us(nbytes: int, hosts: int, rate: float = RATE) -> float:
    """gloo's ring over one rank per host: 2(n-1) steps of S/n each (docs/predict.md)."""
    steps = 2 * (hosts - 1)
    return steps * LAT_US + steps * (nbytes / hosts) * 8 / rate * 1e6


def bench_record(nbytes: int, hosts: int = 2) -> dict:
    return {"schema": "wirespeed.bench/1", "collective": "all_reduce", "backend": "gloo",
            "dtype": "float32", "op": "sum", "device": "cpu", "world_size": hosts, "bytes": nbytes,
            "count": nbytes // 4, "inplace": True, "time_us": ring_all_reduce_us(nbytes, hosts),
            "algbw_gbps": 1.0, "busbw_gbps": 1.0, "wrong": 0, "link_rate_gbps": RATE / 1e9,
            "env": {"hosts": [f"h{i}" for i in range(hosts)]}}


CALLS = [("all_reduce", 1 * MB), ("all_reduce", 25 * MB), ("all_reduce", 14 * MB)]


def train_record(step_us: float, compute_us: float) -> dict:
    return {"backend": "gloo", "device": "cpu", "model": "gpt", "parallel": "ddp", "batch_size": 8,
            "unit": "seq", "optimizer": "sgd", "step_us": step_us, "compute_us": compute_us,
            "bytes_per_step": sum(n for _, n in CALLS)}


def model_for(step_us, compute_us):
    sizes = bench_sizes(CALLS)["all_reduce"]
    return StepModel(train_record(step_us, compute_us), CALLS, [bench_record(n) for n in sizes])


def test_wire_bytes_are_the_bus_factor_of_each_call():
    assert wire_bytes(CALLS, 1) == 0
    total = 40 * MB
    assert wire_bytes(CALLS, 2) == pytest.approx(total)                 # 2(2-1)/2 = 1
    assert wire_bytes(CALLS, 4) == pytest.approx(1.5 * total)           # 2(4-1)/4
    fsdp = [("all_gather", 8 * MB), ("all_gather", 8 * MB), ("reduce_scatter", 8 * MB)]
    assert wire_bytes(fsdp, 4) == pytest.approx(0.75 * 24 * MB)         # (4-1)/4 each


def test_bounds_are_the_wire_time_and_the_larger_of_it_and_compute():
    b = bounds(900e3, 200e3, CALLS, 2, RATE)
    wire = 40 * MB * 8 / RATE * 1e6
    assert b["wire_us"] == pytest.approx(wire)
    assert b["lower_limit_us"] == pytest.approx(max(200e3, wire))
    assert b["step_vs_limit"] == pytest.approx(900e3 / max(200e3, wire))
    # One host, or no known rate: no wire time, the limit is the compute.
    for hosts, rate in ((1, RATE), (2, None)):
        b = bounds(900e3, 200e3, CALLS, hosts, rate)
        assert b["wire_us"] is None and b["lower_limit_us"] == 200e3


def test_the_bench_adds_a_small_anchor_below_the_step_sizes():
    assert bench_sizes(CALLS) == {"all_reduce": [64 << 10, 1 * MB, 14 * MB, 25 * MB]}
    assert bench_sizes([("all_gather", 4096)]) == {"all_gather": [4096]}


def comm_us(hosts: int, rate: float = RATE) -> float:
    return sum(ring_all_reduce_us(n, hosts, rate) for _, n in CALLS)


def test_the_what_if_reproduces_the_measured_step_and_scales_the_unhidden_communication():
    compute = 300e3
    t2 = comm_us(2)
    step = compute + 0.6 * t2                 # 40% of the communication hidden under compute
    m = model_for(step, compute)
    assert m.comm_us == pytest.approx(t2, rel=1e-9)
    hidden = 0.4 * t2
    assert m.hidden_us == pytest.approx(hidden)
    # At the measured layout the model gives back the measured step.
    (p2,) = m.predicted([2], [None])
    assert p2["step_us"] == pytest.approx(step, rel=1e-6)
    assert p2["predicted"] is True and p2["schema"] == "wirespeed.train/1"
    # At 4 hosts, and at 4 hosts on a 10x faster link: the hidden part stays, the rest is the ring's.
    p4, p4fast = m.predicted([4], [None, 10 * RATE])
    assert p4["step_us"] == pytest.approx(compute + comm_us(4) - hidden, rel=1e-4)
    expect_fast = compute + max(0.0, comm_us(4, 10 * RATE) - hidden)
    assert p4fast["step_us"] == pytest.approx(expect_fast, rel=1e-4)
    assert p4["world_size"] == 4 and p4["samples_per_s"] == pytest.approx(4 * 8 / (p4["step_us"] * 1e-6))
    assert p4["wire_us"] == pytest.approx(1.5 * 40 * MB * 8 / RATE * 1e6)


def test_communication_that_slowed_compute_is_a_cost_that_grows_with_the_traffic():
    compute = 300e3
    t2 = comm_us(2)
    step = compute + t2 + 50e3               # longer than doing the two one after the other
    m = model_for(step, compute)
    assert m.hidden_us == pytest.approx(-50e3)
    (p4,) = m.predicted([4], [None])
    assert p4["step_us"] == pytest.approx(compute + comm_us(4) * (1 + 50e3 / t2), rel=1e-4)


def test_the_network_bound_rate_puts_exposed_communication_at_the_threshold():
    compute = 300e3
    m = model_for(compute + 0.5 * comm_us(2), compute)
    (p,) = m.predicted([4], [None])
    gbps = p["network_bound_below_gbps"]
    assert gbps and gbps > 0
    step, _ = m.step_at(m.layout.blocks(4, 1), gbps * 1e9)
    assert (step - compute) / step == pytest.approx(NETWORK_BOUND_SHARE, abs=1e-3)
    # Latency alone past the threshold: no rate is enough (a null in the record).
    tiny = model_for(1e3 + comm_us(2), 1e3)
    (q,) = tiny.predicted([8], [None])
    assert q["network_bound_below_gbps"] is None
    assert math.isfinite(q["step_us"])


@pytest.mark.parametrize("args,needle", [
    (["--what-if-hosts", "4"], "run on the emulated cluster (--cluster) or say the links' rate"),
    (["--what-if-hosts", "1", "--measured-link-rate", "1gbit"], "host counts of 2 or more"),
    (["--what-if-hosts", "four", "--cluster"], "host counts of 2 or more"),
    (["--what-if-rate", "fast", "--cluster"], "--what-if-rate 'fast' does not parse"),
    (["--measured-link-rate", "1gb"], "--measured-link-rate '1gb' does not parse"),
])
def test_what_if_flags_are_checked_up_front(capsys, args, needle):
    with pytest.raises(SystemExit) as e:
        main(["train", "--model", "gpt", *args])
    out, err = capsys.readouterr()
    assert e.value.code == 2 and err.count("\n") == 1 and needle in err, err
    assert out == ""


def test_a_measured_link_rate_stands_in_for_records_without_one():
    """--measured-link-rate on a real cluster: the same model as records that carry the rate."""
    compute = 300e3
    step = compute + 0.6 * comm_us(2)
    bare = [{k: v for k, v in bench_record(n).items() if k != "link_rate_gbps"}
            for n in bench_sizes(CALLS)["all_reduce"]]
    m = StepModel(train_record(step, compute), CALLS, bare, RATE)
    assert m.rate_bps == RATE
    (p,) = m.predicted([4], [None])
    (q,) = model_for(step, compute).predicted([4], [None])
    assert p["step_us"] == pytest.approx(q["step_us"], rel=1e-9)


def test_the_fairer_bound_waits_for_the_first_bucket_before_the_wire():
    from wirespeed.train.shell import _with_ceiling, fair_bound_line
    from wirespeed.train.whatif import fair_bound
    # compute 282 ms; first bucket handed over 120 ms in; 409 ms of wire: 120 + 409 = 529 ms
    assert fair_bound(669e3, 282e3, 120e3, 409e3) == (529e3, pytest.approx(669 / 529))
    # compute-bound: the wire ends inside the compute
    assert fair_bound(300e3, 282e3, 10e3, 100e3) == (282e3, pytest.approx(300 / 282))
    # a record as train writes it, with TCP's measured rate (2 hosts, 100 MB each way at 2 Gbit/s)
    rec = {"backend": "wirespeed", "step_us": 669e3, "compute_us": 282e3, "hosts": 2,
           "wire_bytes_per_step": 100e6, "wire_us": 400e3, "timeline": {"comm_start_ms": 120.0}}
    _with_ceiling(rec, {"each_way_bps": 2e9, "between": ["h1", "h2"], "streams": 4})
    assert rec["wire_tcp_us"] == pytest.approx(400e3)
    assert rec["fair_bound_us"] == pytest.approx(520e3) and rec["fair_bound_rate"] == "tcp"
    assert "first bucket ready 120 ms + wire 400 ms at TCP's measured rate) = 520 ms" in fair_bound_line(rec)
    assert "1.29x it" in fair_bound_line(rec)


def test_the_gpu_what_ifs_flops_against_hand_computed_values():
    import torch
    import torch.nn as nn
    from wirespeed.train.gpuflops import forward_flops, gpt_step_flops, gpu_rate, gpu_step_us, on_gpu
    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.Flatten(), nn.Linear(8 * 8 * 8, 10))
    # conv: 2 x (2 x 8 x 8 x 8 outputs) x (3 x 3 x 3 inputs each) = 55296; linear: 2 x 20 x 512 = 20480
    assert forward_flops(net, torch.zeros(2, 3, 8, 8)) == 55296 + 20480
    # a GPT of 1e9 parameters, 8 sequences of 256 tokens: 6 x 1e9 x 2048
    assert gpt_step_flops(10**9, 8 * 256) == 1.2288e13
    assert gpu_rate("a100") == ("A100", 312.0, 0.4)
    assert gpu_rate("H100", mfu=0.5) == ("H100", 989.0, 0.5)
    # 1.2288e13 FLOPs at 312 TFLOPS x 0.4 = 124.8 TFLOP/s: 98.46 ms
    assert gpu_step_us(1.2288e13, 312.0, 0.4) == pytest.approx(98461.54, rel=1e-6)
    # resnet50 at 224 px: about 4.1 G multiply-adds forward (8.2 GFLOPs), the published figure
    import torchvision
    with torch.device("meta"):
        r50 = torchvision.models.resnet50()
        assert forward_flops(r50, torch.empty(1, 3, 224, 224)) == pytest.approx(8.2e9, rel=0.02)
    # the step with a GPU's compute: 100 ms of communication, 30 of it hidden on the CPU
    pred = {"step_us": 500e3, "compute_us": 400e3, "comm_us": 100e3, "samples_per_s": 16.0,
            "exposed_pct": 20.0, "fitted_on": {"hidden_us": 30e3}}
    g = on_gpu(pred, 20e3)   # a 20 ms GPU compute hides at most 20 ms: 20 + (100 - 20) = 100 ms
    assert g["step_us"] == pytest.approx(100e3) and g["exposed_pct"] == pytest.approx(80.0)
    assert g["samples_per_s"] == pytest.approx(80.0)
    # a CPU's slowdown of the two (hidden below 0) is not carried: nothing hidden, 200 + 100
    g = on_gpu({**pred, "fitted_on": {"hidden_us": -50e3}}, 200e3)
    assert g["step_us"] == pytest.approx(300e3)


def test_the_gpu_what_if_says_where_it_cannot_price_nvlink():
    from wirespeed.train.nets import NetSpec
    from wirespeed.train.shell import gpu_lines
    m = model_for(500e3, 400e3)
    (pred,) = m.predicted([2], [None])
    rec = {"backend": "gloo", "parameters": 10**8, "compute_us": 400e3}
    spec, gpu = NetSpec("gpt", 8, seq_len=128), ("V100", 125.0, 0.4)
    # 6 x 1e8 x 1024 tokens = 6.144e11 FLOPs at 50 TFLOP/s: 12.3 ms
    one = gpu_lines(rec, [pred], spec, gpu)
    assert "614.4 GFLOPs" in one and "compute 12.3 ms" in one and "NVLink" not in one
    two = gpu_lines(rec, [dict(pred, ranks_per_host=2)], spec, gpu)
    assert two.splitlines()[-1].startswith("# the pairs inside a host are priced as this CPU's shared memory")


def test_the_sharded_what_if_against_hand_computed_steps():
    from wirespeed.train.nets import NetSpec
    from wirespeed.train.shardedwhatif import Layout, call_us, network_bound_below, simulate, unit_params
    # a GPT block holds 12h^2 + 13h parameters (qkv, proj, up, down with biases; two norms); the
    # root the two embeddings, the final norm and the untied head: 2Vh + Sh + 2h
    blocks, root = unit_params(NetSpec("gpt", 1, layers=32, hidden=2560, heads=32, seq_len=2048, vocab=50257))
    assert blocks == [12 * 2560 ** 2 + 13 * 2560] * 32
    assert root == 2 * 50257 * 2560 + 2048 * 2560 + 2 * 2560
    # 2 hosts of one GPU at 8 Gbit/s (1 GB/s): an all_gather of 2 MB puts half of it on the link
    two = Layout(2, 1, 8e9, 1e12)
    assert call_us("all_gather", 2e6, two) == pytest.approx(1000)
    # 8 GPUs a host, NVLink at 1 GB/s: each GPU takes in 63/64 of the call through it
    assert call_us("all_gather", 2e6, Layout(8, 8, 1e15, 1e9)) == pytest.approx(63 / 64 * 2e3)
    # one block of 1e6 parameters, no root, compute 3 ms (1 forward, 2 backward): gather 1 ms,
    # forward 1-2 ms, gather again 2-3, backward 3-5, reduce_scatter of 4 MB 5-7: nothing overlaps
    r = simulate([10**6], 0, 3000, two, 4)
    assert r["step_us"] == pytest.approx(7000) and r["link_busy_us"] == pytest.approx(4000)
    assert r["exposed_pct"] == pytest.approx(100 * 4000 / 7000)
    # two blocks, compute 6 ms: block 1's forward gather hides under block 0's forward, block 0's
    # backward gather (4-5) under block 1's backward (4-6); block 1's reduce_scatter 6-8, block 0's
    # backward 6-8, its reduce_scatter 8-10
    r = simulate([10**6, 10**6], 0, 6000, two, 4)
    assert r["step_us"] == pytest.approx(10000) and r["exposed_pct"] == pytest.approx(40)
    # without resharding no gathers in the backward pass: block 1's backward 3-5, then block 0's
    # 5-7 beside block 1's reduce_scatter (5-7), block 0's reduce_scatter 7-9
    r = simulate([10**6, 10**6], 0, 6000, two, 4, reshard=False)
    assert r["step_us"] == pytest.approx(9000) and r["link_busy_us"] == pytest.approx(6000)
    # a link too fast to matter: the compute alone, and the network-bound rate at the threshold
    assert simulate([10**6] * 4, 10**5, 6000, Layout(2, 1, 1e15, 1e15), 4)["step_us"] == pytest.approx(6000, rel=1e-4)
    lay = Layout(8, 8, 1e9, 150e9)
    bound = network_bound_below(blocks, root, 683e3, lay, 2)

    def exposed(rate):
        return simulate(blocks, root, 683e3, Layout(8, 8, rate, 150e9), 2)["exposed_pct"] / 100
    assert exposed(bound * 0.99) > NETWORK_BOUND_SHARE >= exposed(bound * 1.01)


@pytest.mark.parametrize("args,needle", [
    (["--parallel", "fsdp"], "add --what-if-gpu V100, A100 or H100"),
    (["--what-if-gpu", "V100"], "add --parallel fsdp"),
    (["--parallel", "fsdp", "--what-if-gpu", "V100", "--what-if-rate", "1pbit"], "does not parse"),
    (["--parallel", "fsdp", "--what-if-gpu", "V100", "--gpu-tflops", "100", "--what-if-gpu", "X1"],
     "needs the GPU's NVLink rate"),
    (["--parallel", "fsdp", "--what-if-gpu", "V100", "--tune"], "no use for --tune: drop it"),
    (["--parallel", "fsdp", "--what-if-gpu", "V100", "--prefetch", "2"], "no use for --prefetch"),
    (["--parallel", "fsdp", "--what-if-gpu", "V100", "--json", "x.jsonl"], "no use for --json"),
    (["--parallel", "fsdp", "--what-if-gpu", "V100", "--what-if-hosts", "1"], "--what-if-hosts 2 or more"),
])
def test_what_if_only_flags_are_one_line_errors(capsys, args, needle):
    with pytest.raises(SystemExit) as e:
        main(["train", "--what-if-only", "--model", "gpt", *args])
    out, err = capsys.readouterr()
    assert e.value.code == 2 and err.count("\n") == 1 and needle in err, err
    assert out == ""


def test_what_if_only_prices_a_few_billion_parameter_gpt_on_64_gpus(capsys):
    code = main(["train", "--what-if-only", "--model", "gpt", "--layers", "32", "--hidden", "2560",
                 "--heads", "32", "--seq-len", "2048", "--vocab", "50257", "--batch-size", "1",
                 "--parallel", "fsdp", "--what-if-gpu", "V100", "--reduce-dtype", "bf16"])
    out = capsys.readouterr().out
    assert code == 0
    assert "2.78 B parameters in 33 FSDP units" in out and "8 hosts x 8 V100 = 64 GPUs" in out
    rows = [ln.split() for ln in out.splitlines() if ln.strip().endswith("%") and "Gb/s" in ln]
    assert [r[0] for r in rows] == ["100", "200", "400", "800"]
    exposed = [float(r[-1].rstrip("%")) for r in rows]
    assert exposed == sorted(exposed, reverse=True) and exposed[0] > 10 > exposed[-1]
    assert "# network-bound (exposed above 10% of the step) below " in out
    # the figures docs/train.md sets beside the networking chapter's (its table's first row), and
    # the compute they come from: 6 x 2.78e9 x 2,048 tokens at 125 TFLOPS x 0.4
    assert exposed == [43, 7, 3, 2] and "below 166 Gbit/s per host" in out, out
    assert "compute 683.3 ms a step" in out and "16.2 GB of calls a step" in out
