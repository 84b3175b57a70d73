"""Real runs of `wirespeed model` on local gloo ranks: every strategy's result is the exact
reference and, bit for bit, the plain all_reduce's; async-ps accounts for every push."""
import json

import pytest

from wsutil import wirespeed

SHAPES = "conv: 64x3x7x7\nbn: 64\nbn.b: 64\nblock: 128x64x3x3\nfc: 10x2048\nfc.b: 10\n"


def _records(path):
    return {r["strategy"]: r for r in map(json.loads, open(path))}


@pytest.mark.timeout(240)
def test_all_strategies_agree_exactly(tmp_path):
    f = tmp_path / "net.txt"
    f.write_text(SHAPES)
    # 3 ranks: sharded-ps on every rank (reduce_scatter + all_gather), async-ps 1 server 2 workers.
    out = tmp_path / "a.jsonl"
    p = wirespeed("model", "--shapes", f, "-N", "3", "--strategy", "all", "--overlap", "--bucket-mb",
                  "0.1", "-w", "1", "-n", "3", "--json", out, "-T", "60", timeout=200)
    assert p.returncode == 0, p.stdout + p.stderr
    recs = _records(out)
    assert set(recs) == {"allreduce", "reduce-broadcast", "sharded-ps", "async-ps", "allreduce+overlap"}
    total = (64 * 147 + 128 + 128 * 64 * 9 + 10 * 2049) * 4
    for r in recs.values():
        assert r["error"] == 0 and r["ranks_agree"], r
        assert r["total_bytes"] == total and r["arrays"] == 6 and r["world_size"] == 3
        assert r["time_us"] > 0 and r["gbps_per_rank"] == pytest.approx(total / r["time_us"] / 1e3)
    sync = {"allreduce", "reduce-broadcast", "sharded-ps", "allreduce+overlap"}
    assert len({recs[s]["digest"] for s in sync}) == 1
    assert recs["sharded-ps"]["servers"] == 3
    a = recs["async-ps"]
    assert a["servers"] == 1 and a["workers"] == 2
    assert a["pushes"] == a["expected_pushes"] == 2 * 4 * r["buckets"]
    assert 0 <= a["staleness_mean"] <= a["staleness_max"]
    o = recs["allreduce+overlap"]
    assert o["comm_us"] > 0 and o["compute_us"] > 0 and o["serial_us"] > 0
    assert "allreduce+overlap" in p.stdout and "staleness mean" in p.stdout

    # sgd on the owners; sharded-ps with 2 of 3 ranks serving (reduce + broadcast per shard);
    # async-ps with 2 servers and 1 worker, which can never be stale.
    out2 = tmp_path / "b.jsonl"
    p = wirespeed("model", "--shapes", f, "-N", "3", "--strategy", "all", "--servers", "2",
                  "--optimizer", "sgd", "--bucket-mb", "flat", "-w", "0", "-n", "2", "--json", out2,
                  "-T", "60", timeout=200)
    assert p.returncode == 0, p.stdout + p.stderr
    recs = _records(out2)
    for r in recs.values():
        assert r["error"] == 0 and r["optimizer"] == "sgd" and r["buckets"] == 1, r
    assert len({recs[s]["digest"] for s in ("allreduce", "reduce-broadcast", "sharded-ps")}) == 1
    assert recs["sharded-ps"]["servers"] == 2
    assert recs["async-ps"]["staleness_max"] == 0 and recs["async-ps"]["pushes"] == 2 * 1


@pytest.mark.timeout(120)
def test_real_network_one_call_per_tensor():
    p = wirespeed("model", "--model", "resnet18", "-N", "2", "--bucket-mb", "0", "-w", "0", "-n", "1",
                  "-T", "60", timeout=110)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "resnet18 (torchvision), 62 arrays, 11,689,512 parameters" in p.stdout
    row = next(line for line in p.stdout.splitlines() if line.startswith("allreduce"))
    assert row.split()[2] == "62"   # calls per step
    assert row.split()[8] == "0"    # error


@pytest.mark.parametrize("args,needle", [
    (["--model", "resnet51"], "unknown model"),
    ([], "--model NAME"),
    (["--model", "alexnet", "--shapes", "x"], "not both"),
    (["--shapes", "/nonexistent/shapes"], "cannot read"),
    (["--model", "alexnet", "--bucket-mb", "lots"], "--bucket-mb"),
    (["--model", "alexnet", "--strategy", "ring"], "unknown strategy"),
    (["--model", "alexnet", "--strategy", "async-ps", "-N", "2", "--servers", "2"],
     "at least one server and one worker"),
    (["--model", "alexnet", "--strategy", "sharded-ps", "-N", "2", "--servers", "3"], "between 1 and"),
    (["--model", "alexnet", "-d", "int32"], "floating-point"),
    (["--model", "llama2-7b", "-N", "2"], "GiB"),
])
def test_usage_errors(args, needle, capsys, monkeypatch):
    """In process (the launcher refuses before any rank starts): one line, exit 2."""
    from wirespeed.cli.main import main
    for k in ("RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"):
        monkeypatch.delenv(k, raising=False)
    with pytest.raises(SystemExit) as e:
        main(["model", *args])
    assert e.value.code == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("wirespeed: error:") and needle in lines[0], err


def test_list_prints_every_model(capsys):
    from wirespeed.cli.main import main
    assert main(["model", "--list"]) == 0
    out = capsys.readouterr().out
    assert "resnet50" in out and "25,557,032" in out and "6,738,415,616" in out
