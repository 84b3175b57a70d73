"""Real runs of `wirespeed train` on local ranks: DDP and FSDP2 on gloo and wirespeed, the model
state checked on every rank and across backends, the records; and a rank that dies mid-step."""
import json
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from wsutil import ROOT, wirespeed

TINY_GPT = ["--model", "gpt", "--layers", "2", "--hidden", "32", "--seq-len", "16", "--vocab", "64",
            "--batch-size", "2"]
REQUIRED = ("backend", "world_size", "model", "parallel", "samples_per_s", "step_us", "compute_us",
            "exposed_pct", "bytes_per_step", "state_digest")


def _train(tmp_path, nproc, parallel, net=TINY_GPT, backends="gloo,wirespeed", timeout=200):
    out = tmp_path / "t.jsonl"
    p = wirespeed("train", *net, "--parallel", parallel, "--backend", backends, "-N", nproc,
                  "-w", "1", "-n", "3", "-T", "60", "--json", out, "--no-save", timeout=timeout)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "Traceback" not in p.stderr
    recs = [json.loads(line) for line in open(out)]
    return p, recs


def _check(p, recs, nproc, parallel, params):
    assert [r["backend"] for r in recs] == ["gloo", "wirespeed"]
    for r in recs:
        assert all(k in r for k in REQUIRED), r
        assert r["schema"] == "wirespeed.train/1" and r["world_size"] == nproc
        assert r["parallel"] == parallel
        assert r["step_us"] > 0 and r["compute_us"] > 0 and 0 <= r["exposed_pct"] < 100
        assert r["samples_per_s"] == pytest.approx(r["samples_per_s_per_rank"] * nproc)
        # Judged after the first two steps, the last reported (docs/train.md).
        assert len(r["params_diff_steps"]) == 2 and max(r["params_diff_steps"]) <= r["params_tolerance"]
        assert r["params_diff"] >= 0 and r["params_rel_diff"] >= 0
    # The same steps from the same start: one state on every rank (the run checked) and, where a
    # sum has only 2 terms (no order to differ in), the same bits on both backends.
    if nproc == 2:
        assert recs[0]["state_digest"] == recs[1]["state_digest"]
    if parallel == "ddp":
        # Every gradient once per step, 4 bytes each.
        assert recs[0]["bytes_per_step"] == 4 * params
    else:
        # Parameters gathered for forward and backward, gradients reduce-scattered: about 3x.
        assert 2 * 4 * params < recs[0]["bytes_per_step"] <= 3 * 4 * params * 1.05
    assert "wirespeed vs gloo: " in p.stdout and "of the step)" in p.stdout
    assert "parameters against gloo's" in p.stdout and "BEYOND" not in p.stdout


def _gpt_params(layers=2, h=32, seq=16, vocab=64):
    block = 2 * 2 * h + (h * 3 * h + 3 * h) + (h * h + h) + (h * 4 * h + 4 * h) + (4 * h * h + h)
    return vocab * h + seq * h + layers * block + 2 * h + h * vocab


@pytest.mark.timeout(240)
@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_two_ranks_agree_on_every_rank_and_across_backends(tmp_path, parallel):
    p, recs = _train(tmp_path, 2, parallel)
    _check(p, recs, 2, parallel, _gpt_params())


@pytest.mark.timeout(240)
def test_timeline_places_the_buckets_in_the_step(tmp_path):
    """--timeline: DDP's buckets go through a comm hook that records them; the marks fall in the
    step in order, and the hook leaves the training what it was (same state on both backends)."""
    out = tmp_path / "t.jsonl"
    # Buckets of ~10 KB: several per step, so the union of their spans is a real sum.
    p = wirespeed("train", *TINY_GPT, "--backend", "gloo,wirespeed", "-N", 2, "-w", "1", "-n", "3",
                  "-T", "60", "--bucket-mb", "0.01", "--timeline", "--json", out, "--no-save",
                  "--no-scaling", timeout=200)
    assert p.returncode == 0, p.stdout + p.stderr
    recs = [json.loads(line) for line in open(out)]
    _check(p, recs, 2, "ddp", _gpt_params())
    for r in recs:
        t = r["timeline"]
        assert 0 < t["forward_ms"] <= t["comm_start_ms"] < t["comm_end_ms"], t
        assert t["comm_end_ms"] <= r["step_max_us"] / 1e3 * 1.01, (t, r["step_max_us"])
        assert 0 < t["comm_busy_ms"] <= t["comm_end_ms"] - t["comm_start_ms"] + 0.01, t
        assert f"# timeline {r['backend']} (median step of the rank done last): forward pass done at" in p.stdout


@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_three_ranks_of_a_torchvision_network(tmp_path, parallel):
    import torchvision
    params = sum(t.numel() for t in torchvision.models.resnet18().parameters())
    # 64 px, batch 4: at 32 px, batch 2 the last BatchNorm sees 2 values per channel and training
    # diverges (gradient norms of 1e4, parameters 7x their norm in 4 steps), where no two runs can
    # be compared.
    net = ["--model", "resnet18", "--image-size", "64", "--batch-size", "4"]
    p, recs = _train(tmp_path, 3, parallel, net=net, timeout=380)
    _check(p, recs, 3, parallel, params)


def _ranks(mark: str) -> dict[int, int]:
    """rank -> pid of the live rank processes carrying the test's marker."""
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/environ", "rb") as f:
                env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
        except OSError:
            continue
        if env.get(b"TRAIN_TEST_MARK") == mark.encode() and b"RANK" in env:
            out[int(env[b"RANK"])] = int(d)
    return out


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_rank_that_dies_mid_step_ends_the_job_within_the_timeout_naming_it(tmp_path):
    timeout = 30
    mark = uuid.uuid4().hex
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR")}
    env["TRAIN_TEST_MARK"] = mark   # not a WIRESPEED_* twin: it reaches the ranks
    cmd = [sys.executable, "-m", "wirespeed.cli.main", "train", *TINY_GPT, "--backend", "wirespeed",
           "-N", "3", "-w", "1", "-n", "1000000", "-T", str(timeout), "--no-save"]
    job = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
    try:
        for line in job.stdout:      # rank 0's header: every rank has joined and builds its model
            if line.startswith("# wirespeed train"):
                break
        time.sleep(3)                # well inside the timed steps
        ranks = _ranks(mark)
        assert sorted(ranks) == [0, 1, 2], ranks
        t0 = time.monotonic()
        os.kill(ranks[1], signal.SIGKILL)
        out, err = job.communicate(timeout=timeout + 60)
        took = time.monotonic() - t0
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode not in (0, None)
    assert took < timeout, took
    assert "Traceback" not in err
    assert "rank 1" in err, err
    assert "wirespeed failed: " in out, out
    assert not _ranks(mark)
