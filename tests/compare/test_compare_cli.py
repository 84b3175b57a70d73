"""`wirespeed compare` end to end: real gloo and MPI ranks, interleaved repeats, skips, failures,
saved records, and --from rebuilding the same tables."""
import json
import os
import subprocess
import sys

import pytest

from wirespeed.backends.mpi import missing

CLI = [sys.executable, "-m", "wirespeed.cli.main", "compare"]


def run(args, cwd, timeout=280, knobs=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("WIRESPEED_")}
    env.update(knobs or {})
    return subprocess.run(CLI + args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def table_rows(stdout):
    """Table rows: a size in bytes, then a time (summary lines read '4 KiB: ...')."""
    return [ln for ln in stdout.splitlines()
            if len(ln.split()) > 2 and ln.split()[0].isdigit() and ln.split()[1][0].isdigit()]


@pytest.mark.timeout(300)
@pytest.mark.skipif(missing() is not None, reason=f"mpi backend unavailable: {missing()}")
def test_gloo_against_mpi_with_repeats_then_rebuilt_from_records(tmp_path):
    out = tmp_path / "all.jsonl"
    proc = run(["--backends", "gloo,mpi,nccl", "--dtypes", "float16", "--devices", "cpu,cuda",
                "--nprocs", "2", "--sizes", "4K", "-n", "2", "-w", "1", "--repeat", "2",
                "--json", str(out), "--save-dir", str(tmp_path / "runs")], tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # Interleaved: the whole matrix once, then again.
    order = [ln.split("] ")[1].split(":")[0] for ln in proc.stdout.splitlines() if ln.startswith("[")]
    assert order == ["gloo float16 cpu n=2 (repeat 1 of 2)", "mpi float16 cpu n=2 (repeat 1 of 2)",
                     "gloo float16 cpu n=2 (repeat 2 of 2)", "mpi float16 cpu n=2 (repeat 2 of 2)"]
    assert "#   mpi on cuda: mpi runs on cpu tensors only" in proc.stdout
    assert "#   nccl" in proc.stdout or "#   nccl on cpu" in proc.stdout
    records = [json.loads(ln) for ln in out.read_text().splitlines()]
    assert {(r["backend"], r["repeat"]) for r in records} == {("gloo", 0), ("gloo", 1), ("mpi", 0), ("mpi", 1)}
    assert all(r["dtype"] == "float16" and r["wrong"] == 0 and r["checked"] for r in records)
    rows = table_rows(proc.stdout)
    assert len(rows) == 1 and rows[0].split()[0] == "4096" and "*" in rows[0] and "±" in rows[0]
    assert "4 KiB: " in proc.stdout and "fastest" in proc.stdout
    saved = next((tmp_path / "runs").iterdir())
    assert {p.name for p in saved.iterdir()} >= {"records.jsonl", "summary.txt", "compare_all_reduce_sum.png",
                                                   "logs"}
    assert len(list((saved / "logs").iterdir())) == 4
    again = run(["--from", str(saved), "--plot-dir", str(tmp_path / "replot")], tmp_path, timeout=60)
    assert again.returncode == 0, again.stderr
    assert table_rows(again.stdout) == rows
    assert (tmp_path / "replot" / "compare_all_reduce_sum.png").stat().st_size > 0


@pytest.mark.timeout(120)
def test_a_failing_combination_is_listed_and_fails_the_run(tmp_path):
    # A run that fails once started (the core refuses the algorithm the user exported).
    proc = run(["--backends", "wirespeed", "--dtypes", "float32", "--devices", "cpu", "--nprocs", "2",
                "--sizes", "4K", "-n", "1", "-w", "1", "--no-save"], tmp_path, timeout=110,
               knobs={"WIRESPEED_ALGO": "no-such-algo"})
    assert proc.returncode == 1
    assert "# failed:\n#   wirespeed float32 cpu n=2: " in proc.stdout
    assert proc.stderr.strip().splitlines() == ["wirespeed: error: 1 run failed (listed above)"]


def test_a_combination_that_cannot_fit_in_memory_is_refused_before_any_runs(tmp_path):
    # bench would refuse it before starting ranks: compare asks the same of every combination
    # first (issue 25: --nprocs 1000 used to run every combination to the same error, exit 0).
    proc = run(["--backends", "gloo", "--dtypes", "float32", "--devices", "cpu", "--nprocs", "2",
                "--sizes", "1T", "--no-save"], tmp_path, timeout=110)
    assert proc.returncode == 2 and "[  1/" not in proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "gloo float32 cpu n=2 cannot run here" in lines[0] and "memory" in lines[0]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("args,says", [
    (["--backends", "gloo,foo"], "unknown backend 'foo'"),
    (["--repeat", "0"], "--repeat must be at least 1"),
    (["--from", "no/such/dir"], "no such file"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, says):
    proc = run(args + ["--no-save"], tmp_path, timeout=110)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("wirespeed: error:") and says in lines[0], lines


@pytest.mark.timeout(150)
def test_the_benches_run_with_the_users_core_knobs(tmp_path):
    """A core knob the user exported reaches compare's benches (it used to be dropped with the
    flag twins): an algorithm name the core refuses makes the wirespeed run fail, naming it."""
    proc = run(["--backends", "wirespeed", "--dtypes", "float32", "--devices", "cpu", "--nprocs", "2",
                "--sizes", "4K", "-n", "1", "-w", "1", "--no-save"], tmp_path, timeout=140,
               knobs={"WIRESPEED_ALGO": "no-such-algo", "WIRESPEED_PLOT": str(tmp_path / "twin.png")})
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert 'WIRESPEED_ALGO="no-such-algo" is not an algorithm' in proc.stdout + proc.stderr
    assert not (tmp_path / "twin.png").exists(), "compare's own flag twin reached the bench"
