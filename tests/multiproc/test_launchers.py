"""The same `wirespeed bench` command as one rank of a job started by torchrun or mpirun."""
import json
import os
import shutil
import subprocess
import sys

import pytest

from wsutil import ROOT, VENV_BIN
from wirespeed.launch.environment import free_port


def _clean_env(**extra):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RANK", "WORLD_SIZE", "LOCAL_", "MASTER_", "OMPI_", "PMI_", "SLURM_"))}
    env.update(extra)
    return env


def _records(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.timeout(120)
def test_under_torchrun(tmp_path):
    out = tmp_path / "r.jsonl"
    cmd = [str(VENV_BIN / "torchrun"), "--nproc-per-node", "2", "--master-port", str(free_port()),
           "-m", "wirespeed.cli.main", "bench", "-c", "all_reduce,all_gather", "-b", "1K", "-e", "64K",
           "-f", "8", "-n", "3", "-w", "1", "--no-save", "--json", str(out)]
    p = subprocess.run(cmd, cwd=ROOT, env=_clean_env(), capture_output=True, text=True, timeout=110)
    assert p.returncode == 0, p.stderr[-2000:]
    recs = _records(out)
    assert {r["world_size"] for r in recs} == {2}
    assert {r["collective"] for r in recs} == {"all_reduce", "all_gather"}
    assert all(r["wrong"] == 0 for r in recs)
    assert p.stdout.count("# all_reduce | backend gloo") == 1  # rank 0 alone prints


@pytest.mark.timeout(120)
@pytest.mark.skipif(shutil.which("mpirun") is None, reason="Open MPI's mpirun is not installed")
def test_under_mpirun_with_gloo(tmp_path):
    out = tmp_path / "r.jsonl"
    cmd = ["mpirun", "-np", "3", "--oversubscribe", "-x", f"MASTER_PORT={free_port()}", "-x", "PATH",
           sys.executable, "-m", "wirespeed.cli.main", "bench", "-c", "broadcast", "--root", "2",
           "-b", "4K", "-e", "4K", "-n", "3", "-w", "1", "--no-save", "--json", str(out)]
    if os.geteuid() == 0:
        cmd.insert(1, "--allow-run-as-root")
    p = subprocess.run(cmd, cwd=ROOT, env=_clean_env(), capture_output=True, text=True, timeout=110)
    assert p.returncode == 0, p.stdout[-1000:] + p.stderr[-2000:]
    recs = _records(out)
    assert len(recs) == 1 and recs[0]["world_size"] == 3 and recs[0]["root"] == 2
    assert recs[0]["wrong"] == 0
