"""The predict model without ranks: cost counts of each algorithm, the fit, and the CLI on records.

The counts are checked against the textbook figures (a ring all_reduce of S over n ranks: 2(n-1)
steps, 2(n-1)/n * S through each link); the fit against records built from known parameters,
with noise, so a wrong solver or a wrong weighting shows as a wrong parameter.
"""
from __future__ import annotations

import json
import random

import pytest

from wirespeed.errors import UsageError
from wirespeed.explain import costs as C
from wirespeed.explain import fields as F
from wirespeed.explain import predict as P

S = 1 << 24


def L(*host_of):
    return F.Layout(tuple(host_of))


def test_ring_all_reduce_counts_one_rank_per_host():
    t, _ = C.terms("all_reduce", "ring", F.Layout.blocks(4, 1), S)
    assert (t.net_steps, t.net_bytes) == (6, pytest.approx(1.5 * S))
    assert not t.uses_shm


def test_ring_shares_a_host_link_when_ranks_alternate_hosts():
    # Blocks: one ring edge leaves each host per step. Round robin: every edge crosses, and a
    # host's two ranks send over its one link at once: twice the bytes on it.
    blocks, _ = C.terms("all_reduce", "ring", L(0, 0, 1, 1), S)
    robin, _ = C.terms("all_reduce", "ring", L(0, 1, 0, 1), S)
    assert blocks.net_bytes == pytest.approx(6 * S / 4)
    assert robin.net_bytes == pytest.approx(2 * blocks.net_bytes)
    one_host, _ = C.terms("all_reduce", "ring", L(0, 0, 0, 0), S)
    assert not one_host.uses_net and one_host.shm_steps == 6


def test_hier_is_shm_then_the_leaders_ring_or_doubling():
    t, desc = C.terms("all_reduce", "hier", F.Layout.blocks(2, 4), S)
    assert t.shm_steps == 2 and t.shm_bytes == pytest.approx(2 * 3 / 4 * S)
    assert (t.net_steps, t.net_bytes) == (2, pytest.approx(S)) and "ring among 2" in desc
    small, desc = C.terms("all_reduce", "hier", F.Layout.blocks(4, 1), 64 * 1024)
    assert "doubling" in desc and small.net_steps == 2  # log2(4) swaps of the whole buffer
    odd, desc = C.terms("all_reduce", "hier", F.Layout.blocks(3, 1), 64 * 1024)
    assert "ring" in desc and odd.net_steps == 4


def test_doubling_and_tree_step_counts():
    assert C.doubling(F.Layout.blocks(8, 1), S).net_steps == 3
    assert C.doubling(F.Layout.blocks(6, 1), S).net_steps == 2 + 2  # fold in, 2 swaps, fold out
    tree = C.binomial(F.Layout.blocks(5, 1), S)
    assert tree.net_steps == 3 and tree.net_bytes == pytest.approx(3 * S)


def test_direct_all_to_all_counts_the_busiest_host_link():
    # 2 hosts x 2 ranks: each rank sends S/4 to each of 2 remote ranks; a host sends 4 of those.
    t, _ = C.terms("all_to_all", "direct", F.Layout.blocks(2, 2), S)
    assert t.net_steps == 1 and t.net_bytes == pytest.approx(S)


@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_busbw_factor_and_count_agree_with_the_harness(n):
    from wirespeed.bench.collectives import COLLECTIVES
    for name, coll in COLLECTIVES.items():
        assert C.busbw_factor(name, n) == pytest.approx(coll.busbw_factor(n)), name
        if name != "barrier":
            assert C.count_for(name, 1 << 20, 4, n) == coll.counts(1 << 20, 4, n)[0], name


def test_unknown_algorithm_for_a_collective_is_a_usage_error():
    with pytest.raises(UsageError, match="does not apply to all_to_all"):
        C.algorithm_for("gloo", "all_to_all", "ring")
    assert C.algorithm_for("gloo", "all_reduce", None) == ("ring", "gloo's")
    assert C.algorithm_for("wirespeed", "all_reduce", "auto")[0] == "hier"


def record(world, nbytes, t_us, hosts=None, rate_gbps=None, backend="gloo"):
    r = {"schema": "wirespeed.bench/1", "collective": "all_reduce", "backend": backend,
         "dtype": "float32", "op": "sum", "device": "cpu", "world_size": world, "bytes": nbytes,
         "count": nbytes // 4, "inplace": True, "time_us": t_us, "algbw_gbps": 0.0, "busbw_gbps": 0.0,
         "wrong": 0, "env": {"hosts": hosts or ["a"] * world}}
    if rate_gbps:
        r["link_rate_gbps"] = rate_gbps
    return r


def synthetic(params, sizes, layouts, rate_bps, noise=0.03, seed=7):
    """Records timed by the model itself with known parameters, plus multiplicative noise."""
    rng = random.Random(seed)
    model = P.Model(params=params, per_rate=True, link_rate_bps=rate_bps)
    out = []
    for lay in layouts:
        for s in sizes:
            t = model.time_us(C.terms("all_reduce", "ring", lay, s)[0]) * (1 + rng.uniform(-noise, noise))
            out.append(record(lay.world, s, t, [f"h{h}" for h in lay.host_of], rate_bps / 1e9))
    return out


def test_fit_recovers_known_parameters_through_noise():
    truth = {"a_shm": 20.0, "b_shm": 1e-4, "a_net": 150.0, "b_net": 1 / 0.9}
    sizes = [1 << k for k in range(12, 27, 2)]
    recs = synthetic(truth, sizes, [F.Layout.blocks(1, 2), F.Layout.blocks(2, 1)], 1e9)
    (sf,) = P.fit_all(recs)
    p = sf.model.params
    assert p["b_net"] == pytest.approx(truth["b_net"], rel=0.05)
    assert p["a_net"] == pytest.approx(truth["a_net"], rel=0.25)
    assert p["b_shm"] == pytest.approx(truth["b_shm"], rel=0.1)
    assert sf.model.fit_max < 0.06
    # Predicting 8 hosts from 2 reproduces the model's own 8-host time (bandwidth-bound there).
    truth_model = P.Model(params=truth, per_rate=True, link_rate_bps=1e9)
    lay8 = F.Layout.blocks(8, 1)
    want = truth_model.time_us(C.terms("all_reduce", "ring", lay8, 1 << 26)[0])
    got, _ = P.predict_time(sf, lay8, 1 << 26, None)
    assert got == pytest.approx(want, rel=0.05)


def test_link_rate_what_if_scales_the_network_bytes_only():
    recs = synthetic({"a_shm": 0.0, "b_shm": 0.0, "a_net": 100.0, "b_net": 1.1},
                     [1 << 20, 1 << 24, 1 << 26], [F.Layout.blocks(2, 1)], 1e9, noise=0.0)
    fits = P.fit_all(recs)
    lay = F.Layout.blocks(4, 1)
    slow = P.predicted_records(fits, [lay], [1 << 26], None)[0]
    fast = P.predicted_records(fits, [lay], [1 << 26], 10e9)[0]
    latency = 6 * 100.0
    assert fast["time_us"] - latency == pytest.approx((slow["time_us"] - latency) / 10, rel=1e-6)
    assert fast["link_rate_gbps"] == 10 and fast["predicted"] is True


def test_missing_link_class_is_a_clear_error():
    recs = synthetic({"a_shm": 0.0, "b_shm": 0.0, "a_net": 100.0, "b_net": 1.1},
                     [1 << 20, 1 << 24], [F.Layout.blocks(2, 1)], 1e9, noise=0.0)
    for r in recs:
        r["backend"] = "wirespeed"  # hier: needs the shm class for 2 ranks per host
    fits = P.fit_all(recs)
    with pytest.raises(UsageError, match="no fitted run had two ranks on one host"):
        P.predicted_records(fits, [F.Layout.blocks(2, 2)], [1 << 24])
    local = [record(2, s, 100 + s * 1e-4) for s in (1 << 16, 1 << 20, 1 << 24)]
    with pytest.raises(UsageError, match="no fitted run crossed hosts"):
        P.predicted_records(P.fit_all(local), [F.Layout.blocks(2, 1)], [1 << 24])


def test_layouts_from_flags():
    assert P.layouts_from_flags([8], None, 2) == [F.Layout.blocks(4, 2)]
    assert P.layouts_from_flags([8], [2], None) == [F.Layout.blocks(2, 4)]
    assert P.layouts_from_flags(None, [4, 8], None) == [F.Layout.blocks(4, 1), F.Layout.blocks(8, 1)]
    with pytest.raises(UsageError, match="not a multiple"):
        P.layouts_from_flags([6], None, 4)
    with pytest.raises(UsageError, match="say what to predict"):
        P.layouts_from_flags(None, None, None)


def test_emulated_host_names_are_short():
    assert F.short_host("wsnet-t1a2b3c4-h2") == "h2"
    assert F.short_host("node07") == "node07"
    lay = F.layout_of(record(4, 1, 1.0, ["wsnet-x-h0", "wsnet-x-h1", "wsnet-x-h0", "wsnet-x-h1"]))
    assert lay.host_of == (0, 1, 0, 1) and lay.describe() == "2x2"


@pytest.mark.slow
def test_predict_cli_on_a_measured_run(run_cli, tmp_path):
    """Fit a real 2-rank run of this machine (one host: the shm class), predict 4 ranks on it,
    and the predicted records render in `plot` and as their own column in `compare --from`."""
    measured = tmp_path / "m.jsonl"
    run_cli("bench", "-N", 2, "--sizes", "64K,1M,4M", "-n", 3, "-w", 1, "--no-save", "--no-progress",
            "--json", measured, timeout=180, check=True)
    pred = tmp_path / "p.jsonl"
    png = tmp_path / "p.png"
    p = run_cli("predict", "--from", measured, "--nprocs", 4, "--ranks-per-host", 4, "--sizes", "1M,16M",
                "--json", pred, "--plot", png, check=True)
    assert "shm (inside a host): latency" in p.stdout and "fit error over 3 records" in p.stdout
    recs = [json.loads(line) for line in pred.read_text().splitlines()]
    assert [(r["world_size"], r["bytes"], r["predicted"]) for r in recs] == [(4, 1 << 20, True), (4, 1 << 24, True)]
    assert recs[1]["time_us"] > recs[0]["time_us"] > 0
    assert png.stat().st_size > 10_000
    c = run_cli("compare", "--from", measured, pred, "--plot-dir", tmp_path / "cmp", check=True)
    assert "gloo predicted float32" in c.stdout and "gloo float32" in c.stdout
    q = run_cli("plot", measured, pred, "-o", tmp_path / "both.png", check=True)
    assert "(5 records" in q.stdout
    # The network was never measured: predicting two hosts says so, in one line, exit 2.
    e = run_cli("predict", "--from", measured, "--hosts", 2)
    assert e.returncode == 2 and "no fitted run crossed hosts" in e.stderr and "Traceback" not in e.stderr
    e = run_cli("predict", "--from", measured)
    assert e.returncode == 2 and "say what to predict" in e.stderr


def _main(capsys, *args):
    from wirespeed.cli.main import main
    try:
        code = main([str(a) for a in args])
    except SystemExit as e:
        code = e.code
    return code, *capsys.readouterr()


def test_predict_cli_bad_input_is_one_line_and_exit_2(capsys, tmp_path):
    recs = synthetic({"a_shm": 0.0, "b_shm": 0.0, "a_net": 100.0, "b_net": 1.1},
                     [1 << 20, 1 << 24], [F.Layout.blocks(2, 1)], 1e9, noise=0.0)
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    for args, text in ((["--nprocs", "x"], "--nprocs takes whole numbers"),
                       (["--nprocs", 1], "2 ranks or more"),
                       (["--nprocs", 4, "--algo", "direct"], "does not apply to all_reduce"),
                       (["--nprocs", 4, "--link-rate", "fast"], "--link-rate 'fast' does not parse"),
                       (["--against", path, "--link-rate", "10gbit"], "leave out --link-rate")):
        code, out, err = _main(capsys, "predict", "--from", path, *args)
        assert code == 2 and text in err and len(err.strip().splitlines()) == 1, (args, err)
        assert out == ""
    code, out, err = _main(capsys, "predict", "--from", path, "--nprocs", 8, "--json", tmp_path / "p.jsonl")
    assert code == 0 and "bytes at 0.909 of the link rate" in out  # 1 / 1.1, fitted exactly
    code, out, err = _main(capsys, "predict", "--from", tmp_path / "p.jsonl", "--nprocs", 4)
    assert code == 2 and "all predictions" in err


def test_host_rate_flags_parse():
    from wirespeed.cli.cluster import parse_host_rates
    assert parse_host_rates(["h2=200mbit", "3=1gbit"]) == {2: 200 * 10**6, 3: 10**9}
    for bad, text in ((["h2"], "write HOST=RATE"), (["hx=1gbit"], "write HOST=RATE"),
                      (["h1=1gbit", "1=2gbit"], "names h1 twice"), (["h1=fast"], "does not parse")):
        with pytest.raises(UsageError, match=text):
            parse_host_rates(bad)


def test_all_pairs_in_closed_form_equals_the_per_pair_count():
    # all_pairs counts per host what direct() counts per pair (n^2 pairs: minutes at 10,000 ranks).
    rng = random.Random(3)
    for _ in range(300):
        n = rng.randint(1, 12)
        lay = F.Layout(tuple(rng.randint(0, 3) for _ in range(n)))
        nbytes = rng.choice([0.0, 1.0, 7.5])
        pairs = [(a, b) for a in range(n) for b in range(n) if a != b]
        assert C.all_pairs(lay, nbytes) == C.direct(lay, pairs, nbytes), (lay, nbytes)


def test_fit_meaningless_when_bytes_explain_nothing_or_the_error_is_large():
    good = synthetic({"a_shm": 20.0, "b_shm": 1e-4, "a_net": 150.0, "b_net": 1.1},
                     [1 << 16, 1 << 20, 1 << 24], [F.Layout.blocks(1, 2), F.Layout.blocks(2, 1)], 1e9)
    (sf,) = P.fit_all(good)
    assert sf.model.meaningless() == ""
    flat = [record(2, s, t, ["a", "a"]) for s, t in ((1 << 12, 9000.0), (1 << 16, 500.0),
                                                      (1 << 20, 8000.0), (1 << 24, 700.0))]
    (bad,) = P.fit_all(flat)
    why = bad.model.meaningless()
    assert "rms fit error" in why
    with pytest.raises(UsageError, match="no meaningful fit"):
        P.usable_fits([bad])
    assert P.usable_fits([sf, bad])[0] == [sf]


def test_wirespeed_gathers_model_the_planners_ring_and_direct():
    # 4 hosts x 2 ranks, round robin: the host-by-host ring puts one chunk per step on a link,
    # the rank-order ring two (every hop crosses); small chunks and 2 hosts stay direct.
    rr = F.Layout(tuple(r % 4 for r in range(8)))
    S = 64 << 20
    assert C.algorithm_for("wirespeed", "all_gather", "auto")[0] == "hier"
    for coll in ("all_gather", "reduce_scatter"):
        t, name = C.terms(coll, "hier", rr, S)
        assert "ring" in name and t.net_steps == 7 and t.net_bytes == 7 * S / 8
        assert C.terms(coll, "ring", rr, S)[0].net_bytes == 2 * t.net_bytes
        small = C.WIRESPEED_GATHER_RING_MIN * 8 - 8
        assert "direct" in C.terms(coll, "hier", rr, small)[1]
        assert "direct" in C.terms(coll, "hier", F.Layout.blocks(2, 2), S)[1]
