"""`wirespeed train --tune`: real searches on 2 local ranks (the default and candidates, each a
real `train` in fresh processes), the guard that keeps a compression which changes training out
of the recommendation, and the pure parts (the guard's arithmetic, the reproducing command)."""
import json

import pytest

from wsutil import wirespeed
from wirespeed.train import guard
from wirespeed.train.tunereport import reproduce

TINY_GPT = ["--model", "gpt", "--layers", "1", "--hidden", "32", "--seq-len", "16", "--vocab", "64",
            "--batch-size", "4"]


def _tune(tmp_path, net, candidates, *extra, timeout=800, warmup=2):
    out = tmp_path / "tune.jsonl"
    p = wirespeed("train", "--tune", *net, "--backend", "gloo", "-N", "2", "-w", str(warmup), "-T", "120",
                  "--candidates", candidates, "--json", out, "--no-save", *extra, timeout=timeout)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "Traceback" not in p.stderr
    return p, [json.loads(line) for line in open(out)]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_small_tune_runs_the_default_and_two_candidates_and_records_each(tmp_path):
    p, recs = _tune(tmp_path, TINY_GPT, "comm-hook=fp16; bucket-mb=1+threads=1", "-n", "4", "--repeat", "2")
    assert "loss tolerance 2.0%" in p.stdout
    # The rounding-only twin runs on this tiny GPT too, and its floor is ~0 (its kernels do not
    # split their sums differently at 2 threads; measured 3e-7): the fixed tolerance alone decides.
    assert "# noise floor: drift " in p.stdout and "[noise-floor twin --threads " in p.stdout
    floor = recs[0]["noise_floor"]
    assert floor["from"].startswith("--threads ") and floor["param_drift"] < 1e-4 and floor["loss_rel_diff"] < 1e-4
    assert floor["drift_bound"] == floor["loss_bound"] == 0.02
    assert all(r["noise_floor"] == floor for r in recs)
    labels = [r["config"]["label"] for r in recs]
    assert labels[:3] == ["default", "--comm-hook fp16", "--bucket-mb 1 --threads 1"], p.stdout
    # and when both won their first run, their combination (train/search.combine)
    assert labels[3:] in ([], ["--bucket-mb 1 --comm-hook fp16 --threads 1"]), p.stdout
    assert all(r["config"]["family"] == "combined" for r in recs[3:])
    for r in recs:
        assert r["schema"] == "wirespeed.train/1"
        for key in ("config", "samples_per_s", "loss_rel_diff", "param_drift", "default", "recommended"):
            assert key in r, (key, r)
        assert len(r["losses"]) == 2 + 4   # warm-up and timed steps
    default = recs[0]
    assert default["default"] and not any(r["default"] for r in recs[1:])
    # The default against itself: the same seed and data, the same arithmetic, bit for bit.
    assert default["loss_rel_diff"] == 0 and default["param_drift"] == 0 and default["runs"] >= 2
    assert sum(r["recommended"] for r in recs) <= 1
    fp16 = recs[1]
    assert fp16["config"]["compression"] and fp16["comm_hook"] == "fp16"
    # fp16 sends half the bytes, and its rounding moves the parameters, a little.
    assert fp16["bytes_per_step"] == pytest.approx(default["bytes_per_step"] / 2, rel=0.01)
    assert 0 < fp16["param_drift"] < 0.02
    assert "[compression]" in next(ln for ln in p.stdout.splitlines() if ln.startswith("--comm-hook fp16"))
    rec_line = [ln for ln in p.stdout.splitlines() if ln.startswith("# recommended:")]
    assert len(rec_line) == 1
    if fp16["recommended"]:
        assert "COMPRESSION" in rec_line[0]
        assert "register_comm_hook(None, default_hooks.fp16_compress_hook)" in p.stdout
        assert "wirespeed train --model gpt" in p.stdout and "--comm-hook fp16" in p.stdout


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_leader_runs_again_with_threads_on_top(tmp_path):
    # A default made slow on purpose (buckets of 2 KB: over a hundred all_reduces a step instead
    # of one), so the candidate --bucket-mb 25 leads (measured 1.4-2.2x its first run here, 1.17x
    # against the default's latest run once in CI: the labels below prove it won, by over 1%);
    # 16 intra-op threads a rank on this machine's cores lose on their own (0.5-0.8x), so no
    # combination is made. The stage after it runs the leader with those threads on top, judged
    # against the leader. (A default slowed by oversubscribed threads swung 3.5x between runs.)
    net = ["--model", "gpt", "--layers", "2", "--hidden", "64", "--seq-len", "32", "--vocab", "64",
           "--batch-size", "4", "--bucket-mb", "0.002"]   # a step long enough to time steadily
    p, recs = _tune(tmp_path, net, "bucket-mb=25; threads=16", "-n", "4", "--repeat", "1")
    labels = [r["config"]["label"] for r in recs]
    assert labels == ["default", "--bucket-mb 25", "--threads 16", "--bucket-mb 25 --threads 16"], p.stdout
    assert recs[1]["speedup_vs_default"] > 1 and recs[2]["speedup_vs_default"] < 1, p.stdout
    top = recs[3]
    assert top["config"]["family"] == "on top" and top["config"]["on_top_of"] == "--bucket-mb 25"
    assert all(r["config"]["on_top_of"] is None for r in recs[:3])
    if top["pruned"]:   # slower than its leader: its verdict says against what
        assert "--bucket-mb 25 (which it adds to)" in top["pruned"]["why"] and top["pruned"]["why"] in top["verdict"]
    # the default ran again right before the stage: 2 runs, the second just before the on-top one
    assert recs[0]["runs"] == 2


@pytest.fixture(scope="module")
def resnet18_tune(tmp_path_factory):
    """One search on resnet18 at 32 px, batch 4, 1 thread per rank: a network whose short run
    amplifies rounding (BatchNorm over 1 x 1 maps), so its noise floor is far above 2% (measured: the
    twin at 2 threads moved the parameters 38% and the loss 20% after 10 steps); the candidates:
    PowerSGD at rank 1 and the twin's own configuration. Its 10 training steps are 5 warm-up and 5
    timed ones: the guard judges every step's loss and the final parameters, which the split does
    not change, and runs of fewer than 6 timed steps are never stopped early (both candidates'
    first steps were below the in-run pruning floor on this 2-core machine, and a stopped run has
    no guard figures: search.prune_threshold)."""
    net = ["--model", "resnet18", "--image-size", "32", "--batch-size", "4", "--threads", "1"]
    return _tune(tmp_path_factory.mktemp("r18"), net, "comm-hook=powersgd:1; threads=2", "-n", "5",
                 "--repeat", "1", warmup=5)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_powersgd_at_rank_1_changes_the_loss_and_is_shown_but_never_recommended(resnet18_tune):
    # resnet18 at 32 px, batch 4: its loss on the fixed batch falls fast, and a rank-1 gradient
    # visibly bends that fall (measured: 284% apart after 10 steps, parameters 50% apart), far
    # beyond 2x what rounding alone does to it (loss 20%).
    p, recs = resnet18_tune
    psgd = next(r for r in recs if r["comm_hook"] == "powersgd:1")
    assert psgd["loss_rel_diff"] > 0.02 and psgd["param_drift"] > 0.02
    assert not psgd["recommended"]
    row = next(ln for ln in p.stdout.splitlines() if ln.startswith("--comm-hook powersgd:1"))
    assert "changes training by" in row and "never recommended" in row and "[compression]" in row
    assert psgd["loss_rel_diff"] > psgd["noise_floor"]["loss_bound"]
    # the only other candidate is a thread count, which changes no arithmetic: if anything, that
    assert "# recommended: keep the default" in p.stdout or \
        next(r for r in recs if r["recommended"])["config"]["label"] == "--threads 2"


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_noise_floor_is_measured_printed_recorded_and_lets_rounding_through(resnet18_tune):
    p, recs = resnet18_tune
    floor = recs[0]["noise_floor"]
    assert all(r["noise_floor"] == floor for r in recs)
    # measured from the default's twin at 2 threads, and far above the 2% tolerance on this net
    assert floor["from"] == "--threads 2" and floor["factor"] == 2
    assert floor["param_drift"] > 0.02 and floor["loss_rel_diff"] > 0
    assert floor["drift_bound"] == pytest.approx(2 * floor["param_drift"])
    assert floor["loss_bound"] == pytest.approx(max(0.02, 2 * floor["loss_rel_diff"]))
    header = next(ln for ln in p.stdout.splitlines() if ln.startswith("# noise floor:"))
    assert f"drift {floor['param_drift']:.2%}, loss {floor['loss_rel_diff']:.2%}, from --threads 2" in header
    # The candidate that is the twin's configuration lands on the twin's bits: above the fixed
    # tolerance, inside the floor, so not refused (the fixed 2% alone refused it).
    twin = next(r for r in recs if r["config"]["label"] == "--threads 2")
    assert twin["param_drift"] == pytest.approx(floor["param_drift"], rel=1e-6)
    assert twin["param_drift"] > twin["loss_tolerance"] == 0.02
    assert "never recommended" not in twin["verdict"] and "within the noise floor" in twin["verdict"], p.stdout


def test_the_guard_measures_the_loss_curve_against_the_exact_run():
    exact = [4.0, 3.0, 2.0, 2.0, 2.0, 2.0, 2.0]
    assert guard.loss_rel_diff(exact, list(exact)) == 0
    # final loss 5% off; the last five steps' mean 1% off: the larger counts
    assert guard.loss_rel_diff(exact, exact[:-1] + [2.1]) == pytest.approx(0.05)
    assert guard.loss_rel_diff(exact, exact[:-1]) == float("inf")   # different steps
    assert guard.within({"loss_rel_diff": 0.01, "param_drift": 0.019}, 0.02)
    assert not guard.within({"loss_rel_diff": 0.0, "param_drift": 0.03}, 0.02)
    # unmeasured (a run stopped inside its first steps records nulls) is never within
    stopped = {"loss_rel_diff": None, "param_drift": None}
    assert not guard.within(stopped, 0.02, guard.Floor(loss=1.0, drift=1.0, source="x"))
    assert guard.changed_by(stopped) == float("inf") and not guard.within({}, 0.02)


def test_the_noise_floor_widens_the_guard_only_beyond_the_tolerance():
    rounding = guard.Floor(loss=0.2, drift=0.38, source="--threads 2")
    assert rounding.bounds(0.02) == (pytest.approx(0.4), pytest.approx(0.76))
    fp16 = {"loss_rel_diff": 0.33, "param_drift": 0.59}
    powersgd = {"loss_rel_diff": 2.84, "param_drift": 0.50}
    assert guard.within(fp16, 0.02, rounding) and guard.only_by_floor(fp16, 0.02, rounding)
    assert not guard.within(powersgd, 0.02, rounding)
    # a floor of ~0 (the twin on the same bits) or none measured: the tolerance alone, as before
    for floor in (guard.Floor(0.0, 3e-7, "--threads 2"), guard.NO_FLOOR,
                  guard.Floor(float("inf"), 0.1, "--threads 2")):
        assert floor.bounds(0.02) == (0.02, 0.02)
        assert not guard.within({"loss_rel_diff": 0.0, "param_drift": 0.03}, 0.02, floor)
    assert guard.twin_threads(1) == 2 and guard.twin_threads(8) == 7


def test_the_reproducing_command_is_the_users_own_without_tunes_flags():
    argv = ["train", "--tune", "--model", "resnet50", "--budget", "600", "--bucket-mb", "25",
            "--loss-tolerance=1%", "--json", "x.jsonl", "--cluster", "--backend", "wirespeed"]
    line = reproduce(argv, ["--bucket-mb", "100", "--comm-hook", "fp16", "--grad-as-bucket-view"],
                     {"WIRESPEED_NSTREAMS": "4"})
    assert line == ("WIRESPEED_NSTREAMS=4 wirespeed train --model resnet50 --cluster --backend wirespeed "
                    "--bucket-mb 100 --comm-hook fp16 --grad-as-bucket-view")


def test_a_recommendation_that_passes_only_by_the_noise_floor_says_so():
    from wirespeed.train.nets import NetSpec
    from wirespeed.train.rank import TrainConfig
    from wirespeed.train.search import DEFAULT, Candidate, Search
    from wirespeed.train.tunereport import render
    base = TrainConfig(NetSpec("resnet18", 4, image_size=32), threads=1)
    fp16, psgd = Candidate((("comm_hook", "fp16"),), (), "hook"), Candidate((("comm_hook", "powersgd:1"),), (), "hook")

    def rec(sps, loss, drift):
        return {"model": "resnet18", "parallel": "ddp", "world_size": 2, "samples_per_s": sps, "exposed_pct": 50,
                "bytes_per_step": 1e6, "loss_rel_diff": loss, "param_drift": drift}
    # the figures measured on resnet18 at 32 px (the twin at 2 threads: loss 20%, drift 38%), speeds made up
    runs = {0: [rec(10, 0, 0)], 1: [rec(20, 0.33, 0.59)], 2: [rec(30, 2.84, 0.50)]}
    for floor, fp16_ok in ((guard.Floor(0.1994, 0.3783, "--threads 2"), True), (guard.NO_FLOOR, False)):
        s = Search([DEFAULT, fp16, psgd], runs=runs, floor=floor)
        text, records = render(s, [(i, dict(r[0])) for i, r in runs.items()], base, "gloo", 0.02,
                               ["train", "--tune", "--model", "resnet18"], "t")
        assert [r["recommended"] for r in records] == [False, fp16_ok, False], text
        assert "never recommended" in records[2]["verdict"]
        if fp16_ok:
            assert "# noise floor: drift 37.83%, loss 19.94%, from --threads 2" in text
            assert records[1]["verdict"] == "within the noise floor, not the tolerance"
            line = next(ln for ln in text.splitlines() if ln.startswith("# recommended:"))
            assert "within the noise floor" in line and "COMPRESSION" in line and "not proven harmless" in line
        else:
            assert "# noise floor: not measured" in text and "# recommended: keep the default" in text


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_candidate_slower_over_its_first_steps_is_stopped_pruned_and_not_repeated(tmp_path):
    # A real slow configuration: torch's intra-op threads at four times this machine's cores in
    # each of the 2 ranks (the default runs 1), so the ranks' OpenMP threads fight over the cores
    # every matrix product (measured here: 0.14x the default's samples/s over the first 3 steps).
    import os
    threads = max(16, 4 * (os.cpu_count() or 1))
    net = ["--model", "gpt", "--layers", "2", "--hidden", "64", "--seq-len", "32", "--vocab", "64",
           "--batch-size", "4"]
    p, recs = _tune(tmp_path, net, f"threads={threads}", "-n", "8", "--repeat", "2")
    default, slow = recs
    assert default["pruned"] is None and default["runs"] == 2 and default["iters"] == 8
    assert slow["config"]["label"] == f"--threads {threads}"
    pruned = slow["pruned"]
    assert pruned["after_steps"] == 3 and slow["iters"] == 3 and len(slow["losses"]) == 2 + 3, pruned
    assert pruned["samples_per_s"] < pruned["below"] < pruned["default_samples_per_s"]
    assert pruned["why"] == f"pruned after 3 steps ({pruned['vs_default']:.2f}x the default's samples/s)"
    # stopped in its first run, so its repeat was never started, and never recommended
    assert slow["runs"] == 1 and not slow["recommended"] and "never recommended" in slow["verdict"]
    # fewer steps than the exact run: no guard figures, the fields null
    assert slow["loss_rel_diff"] is None and slow["param_drift"] is None
    row = next(ln for ln in p.stdout.splitlines() if ln.startswith(f"--threads {threads} "))
    assert pruned["why"] in row and " - " in row, row
    assert "# recommended: keep the default" in p.stdout
    assert "stopped and pruned" in p.stdout


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_spent_budget_skips_the_candidates_and_says_so(tmp_path):
    # A budget of 1 s: the default and its rounding-only twin run regardless (every candidate is
    # judged against them), then no candidate's estimated run (the runs so far: seconds each) fits.
    # Under FSDP2, so its search runs for real here too.
    p, recs = _tune(tmp_path, [*TINY_GPT, "--parallel", "fsdp"], "reduce-dtype=bf16; prefetch=1", "-n", "2",
                    "--repeat", "2", "--budget", "1")
    assert [r["config"]["label"] for r in recs] == ["default"] and recs[0]["parallel"] == "fsdp"
    assert recs[0]["noise_floor"]["from"].startswith("--threads ")
    for label in ("--reduce-dtype bf16", "--prefetch 1"):
        line = next(ln for ln in p.stdout.splitlines() if ln.startswith(f"# skipped: {label}: "))
        assert "not run: about" in line and "s of the budget left" in line, line
    assert "# the budget cut the later runs of: default" in p.stdout
    assert recs[0]["runs"] == 1 and "# recommended: keep the default" in p.stdout


def test_in_run_pruning_judges_the_first_steps_against_the_defaults_first_steps():
    from wirespeed.train.rank import steps_rate
    from wirespeed.train.search import IN_RUN_MARGIN, default_noise, first_steps_rate, prune_threshold
    # The default's records as a run writes them: 4 samples per rank, 2 ranks, each timed step's
    # slowest rank in us; its first 3 steps (median 11 ms) slower than the rest (10 ms).
    first = {"batch_size": 4, "world_size": 2, "samples_per_s": 800.0,
             "step_times_us": [12000, 10000, 11000, 10000, 10000, 10000, 10000, 10000]}
    assert first_steps_rate(first) == pytest.approx(8 / 0.011)
    # one run: no spread measured yet, the margin alone
    assert default_noise([first]) == 0
    below = prune_threshold([first], iters=8)
    assert below == pytest.approx(8 / 0.011 * (1 - IN_RUN_MARGIN))
    # a candidate's first steps as each rank timed them: the slowest rank per step, then the median
    slow = [[0.020, 0.021, 0.019], [0.018, 0.022, 0.020]]   # 20 ms: 400 samples/s
    near = [[0.013, 0.012, 0.013], [0.012, 0.013, 0.012]]   # 13 ms: 615 samples/s
    assert steps_rate(slow, 4) == pytest.approx(400) and steps_rate(slow, 4) < below
    assert steps_rate(near, 4) == pytest.approx(8 / 0.013) and steps_rate(near, 4) > below
    # a second default run 10% faster over its first steps: the spread widens the margin
    second = dict(first, step_times_us=[10000] * 8)
    noise = default_noise([first, second])
    assert noise == pytest.approx((800 - 8 / 0.011) / ((800 + 8 / 0.011) / 2))
    assert prune_threshold([first, second], 8) == pytest.approx(800 * (1 - IN_RUN_MARGIN - 2 * noise))
    # never: before the default has run, on runs too short to save steps, or when the default's
    # own runs spread so far that no margin is left
    assert prune_threshold([], 8) == 0
    assert prune_threshold([first], 5) == 0
    assert prune_threshold([first, dict(first, step_times_us=[5000] * 8)], 8) == 0


def test_the_leader_is_tried_with_each_threads_and_bucket_candidate_on_top():
    from wirespeed.train.nets import NetSpec
    from wirespeed.train.rank import TrainConfig
    from wirespeed.train.search import DEFAULT, Candidate, Search, leader, on_top_of_leader
    base = TrainConfig(NetSpec("resnet50", 8, image_size=64))
    psgd = Candidate((("comm_hook", "powersgd:1"),), (), "hook")
    fp16 = Candidate((("comm_hook", "fp16"),), (), "hook")
    b5, b100 = Candidate((("bucket_mb", 5.0),), (), "bucket"), Candidate((("bucket_mb", 100.0),), (), "bucket")
    t1, t2 = Candidate((("threads", 1),), (), "threads"), Candidate((("threads", 2),), (), "threads")
    knob = Candidate((), (("WIRESPEED_NSTREAMS", "4"),), "WIRESPEED_NSTREAMS")
    plan = [DEFAULT, fp16, psgd, b5, b100, t1, t2, knob]

    def run(gain, drift=0.0):
        return [{"gain_vs_latest_default": gain, "loss_rel_diff": 0.0, "param_drift": drift}]
    # as measured on resnet50 at 64 px (2 hosts, 2 Gbit/s uncapped): PowerSGD the fastest; 2 threads
    # alone far slower (pruned in round 1, tried again on top); 1 thread the default's own (skipped)
    runs = {0: run(1.0), 1: run(1.06), 2: run(1.36), 3: run(1.06), 4: run(0.80), 6: run(0.58), 7: run(1.01)}
    s = Search(plan, runs=runs, pruned={4: "0.80x", 6: "0.58x"}, skipped={5: "the same threads as the default's"})
    assert leader(s, 0.02) == 2
    labels = [c.label(base) for c in on_top_of_leader(s, 2, base)]
    assert labels == ["--bucket-mb 5 --comm-hook powersgd:1", "--bucket-mb 100 --comm-hook powersgd:1",
                      "--comm-hook powersgd:1 --threads 2"]
    # a faster configuration outside the guard cannot lead, nor a pruned one; none faster: no leader
    s.runs[2] = run(1.36, drift=0.5)
    assert leader(s, 0.02) == 1
    assert leader(Search(plan, runs={0: run(1.0), 1: run(0.9)}), 0.02) == 0
    assert on_top_of_leader(s, 0, base) == []
    # the leader already sets a bucket size: only the threads go on top, with its knobs kept
    combo = Candidate((("comm_hook", "fp16"), ("bucket_mb", 5.0)), (("WIRESPEED_NSTREAMS", "4"),), "combined")
    s2 = Search(plan + [combo], runs={**runs, 8: run(1.3)}, skipped={5: "same"})
    assert [(c.label(base)) for c in on_top_of_leader(s2, 8, base)] == \
        ["--bucket-mb 5 --comm-hook fp16 --threads 2 WIRESPEED_NSTREAMS=4"]
    # what the plan already holds (the combination of PowerSGD and 5 MB buckets) is not run again
    both = Candidate((("comm_hook", "powersgd:1"), ("bucket_mb", 5.0)), (), "combined")
    s3 = Search(plan + [both], runs={**runs, 8: run(1.3)}, pruned={4: "0.80x", 6: "0.58x"}, skipped={5: "same"})
    assert [c.label(base) for c in on_top_of_leader(s3, 2, base)] == \
        ["--bucket-mb 100 --comm-hook powersgd:1", "--comm-hook powersgd:1 --threads 2"]
    # the records name what each was built on
    from wirespeed.train.tunereport import render
    rec = {"model": "resnet50", "parallel": "ddp", "world_size": 2, "exposed_pct": 20, "bytes_per_step": 1e6,
           "loss_rel_diff": 0.0, "param_drift": 0.0}
    s4 = Search([DEFAULT, psgd] + on_top_of_leader(s3, 2, base)[1:], built_on={2: 1},
                runs={i: [dict(rec, samples_per_s=10.0 + 5 * i)] for i in range(3)})
    _, records = render(s4, [(i, dict(r[0])) for i, r in s4.runs.items()], base, "wirespeed", 0.02, ["train"], "t")
    assert [r["config"]["on_top_of"] for r in records] == [None, None, "--comm-hook powersgd:1"]
    assert records[2]["config"]["family"] == "on top" and records[2]["recommended"]


def test_the_built_in_search_holds_the_issues_candidates(monkeypatch):
    from wirespeed.train.nets import NetSpec
    from wirespeed.train.rank import TrainConfig
    from wirespeed.train.search import builtin_plan
    from wirespeed.train.shell import ShellSettings
    monkeypatch.setattr("os.cpu_count", lambda: 8)
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(8)))   # what the engine counts
    ddp = TrainConfig(NetSpec("resnet50", 8, image_size=64), nproc=2)
    cluster = ShellSettings(cluster="wsq")   # one rank a host, 2 hosts: the ranks talk across hosts
    labels = [c.label(ddp) for c in builtin_plan(ddp, "wirespeed", cluster)]
    for want in ("--comm-hook fp16", "--comm-hook bf16", "--bucket-mb 5 --comm-hook fp16",
                 "--bucket-mb 100 --comm-hook fp16", "--comm-hook powersgd:1", "--comm-hook powersgd:4",
                 "--bucket-mb 5", "--bucket-mb 50", "--bucket-mb 100", "--grad-as-bucket-view", "--static-graph",
                 # torch's threads: the cores a rank has (8 / 2) and one fewer, all cores and all but one
                 "--threads 3", "--threads 4", "--threads 7", "--threads 8",
                 # wirespeed's knobs across hosts, its I/O threads but the count it runs by default
                 # (2 above 4 CPUs), and a core moved from torch's threads to a third I/O thread
                 "WIRESPEED_ALGO=ring", "WIRESPEED_NSTREAMS=16", "WIRESPEED_CHUNK_BYTES=65536",
                 "WIRESPEED_IO_THREADS=1", "WIRESPEED_IO_THREADS=4", "--threads 3 WIRESPEED_IO_THREADS=3"):
        assert want in labels, (want, labels)
    assert "WIRESPEED_IO_THREADS=2" not in labels and len(labels) == len(set(labels))
    # on one host: its algorithms, and no socket knobs
    local = [c.label(ddp) for c in builtin_plan(ddp, "wirespeed", ShellSettings())]
    assert "WIRESPEED_ALGO=oneshot" in local and not any("IO_THREADS" in x or "NSTREAMS" in x for x in local)
    fsdp = TrainConfig(NetSpec("gpt", 4), parallel="fsdp", nproc=2)
    labels = [c.label(fsdp) for c in builtin_plan(fsdp, "nccl", cluster)]
    for want in ("--reduce-dtype bf16", "--no-reshard-after-forward", "--prefetch 1", "--prefetch 2",
                 "NCCL_SOCKET_NTHREADS=4 NCCL_NSOCKS_PERTHREAD=2", "NCCL_ALGO=Tree"):
        assert want in labels, (want, labels)
    assert not any("hook" in x or "bucket" in x for x in labels)


def test_the_lines_to_paste_are_python_and_name_compression():
    from wirespeed.train.hooks import paste_lines
    from wirespeed.train.nets import NetSpec
    from wirespeed.train.rank import TrainConfig
    gpt, r50 = NetSpec("gpt", 4), NetSpec("resnet50", 8, image_size=64)
    for cfg, compressed in ((TrainConfig(gpt, parallel="fsdp", reduce_dtype="bf16", prefetch=2), True),
                            (TrainConfig(gpt, parallel="fsdp", reshard_after_forward=False, threads=3), False),
                            (TrainConfig(r50, comm_hook="powersgd:1", bucket_mb=5), True),
                            (TrainConfig(r50, comm_hook="bf16", static_graph=True), True),
                            (TrainConfig(r50, grad_as_bucket_view=True), False)):
        lines = paste_lines(cfg)
        compile("\n".join(lines), "paste", "exec")   # each line as a user pastes it
        assert any("COMPRESSION" in ln for ln in lines) == compressed, lines
    # the explicit prefetch, run on stand-in blocks: each gathers the next 2 forward, the previous 2 backward
    calls = []

    class Block:
        def __init__(self, n):
            self.n = n

        def set_modules_to_forward_prefetch(self, mods):
            calls.append(("fwd", self.n, [m.n for m in mods]))

        def set_modules_to_backward_prefetch(self, mods):
            calls.append(("bwd", self.n, [m.n for m in mods]))
    cfg = TrainConfig(gpt, parallel="fsdp", prefetch=2)
    code = "\n".join(ln for ln in paste_lines(cfg) if not ln.startswith("fully_shard"))
    exec(code, {"blocks": [Block(i) for i in range(4)]})
    assert calls == [("fwd", 0, [1, 2]), ("fwd", 1, [2, 3]), ("bwd", 1, [0]), ("fwd", 2, [3]), ("bwd", 2, [1, 0]),
                     ("bwd", 3, [2, 1])]
