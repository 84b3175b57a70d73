"""The mpi backend on real ranks under real mpirun: every collective x dtype x op checked by the
harness, nothing silently skipped, and a dead or hung rank ending the job with a non-zero exit."""
import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from wirespeed.backends.mpi import missing
from wirespeed.launch.mpirun import launch_mpirun
from wirespeed.bench.collectives import COLLECTIVES
from wirespeed.bench.dtypes import DTYPES, OPS

pytestmark = pytest.mark.skipif(missing() is not None, reason=f"mpi backend unavailable: {missing()}")

CLI = [sys.executable, "-m", "wirespeed.cli.main"]
# The variants MPI does not have, as docs/compare.md lists them; everything else must run.
NOT_IN_MPI = {("broadcast", False), ("reduce_scatter", True)}


def expected_cases(ops, sizes, world):
    out = set()
    for name, coll in COLLECTIVES.items():
        for dtype in (DTYPES if name != "barrier" else ["float32"]):
            for op in (ops if coll.reduces else [None]):
                for size in (sizes if name != "barrier" else [0]):
                    # The size a record carries: what the collective makes of the requested size.
                    _, send, recv = coll.counts(size, DTYPES[dtype].itemsize, world)
                    nbytes = max(send, recv) * DTYPES[dtype].itemsize
                    for inplace in coll.variants:
                        if (name, inplace) not in NOT_IN_MPI:
                            out.add((name, dtype, op, nbytes, inplace))
    return out


@pytest.mark.timeout(240)
@pytest.mark.parametrize("nproc,ops,sizes", [
    (1, list(OPS), [0, 8, 1000, 12288]),
    (3, list(OPS), [0, 8, 1000, 12288]),
    # Four ranks and a larger size reach Open MPI's segmented algorithms, where the user op for
    # float16/bfloat16 is called on pieces of the buffer.
    (4, ["sum"], [0, 1000, 256 << 10]),
])
def test_every_collective_dtype_op_is_checked(tmp_path, nproc, ops, sizes):
    out = tmp_path / "r.jsonl"
    proc = subprocess.run(CLI + ["bench", "--backend", "mpi", "-N", str(nproc), "-c", "all", "-d", "all",
                                 "-o", ",".join(ops), "--sizes", ",".join(map(str, sizes)), "-n", "2",
                                 "-w", "1", "-T", "120", "--json", str(out), "--no-save"],
                          capture_output=True, text=True, timeout=230)
    assert proc.returncode == 0, proc.stderr[-2000:]
    records = [json.loads(line) for line in out.read_text().splitlines()]
    got = {(r["collective"], r["dtype"], r["op"], r["bytes"], r["inplace"]) for r in records}
    assert got == expected_cases(ops, sizes, nproc)
    assert all(r["backend"] == "mpi" and r["world_size"] == nproc and r["checked"] for r in records)
    wrong = [r for r in records if r["wrong"]]
    assert not wrong, wrong[:5]
    assert "Rank   0 on" in proc.stdout


def _script(tmp_path, body: str) -> str:
    path = tmp_path / "rank.py"
    path.write_text(textwrap.dedent(body))
    return str(path)


def _survivors(script: str) -> list[str]:
    ps = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [line for line in ps.splitlines() if script in line and "ps -eo" not in line]


@pytest.mark.timeout(90)
def test_a_killed_rank_ends_the_job(tmp_path):
    script = _script(tmp_path, """
        import os, signal
        import torch
        from wirespeed.backends.mpi import MpiBackend
        from wirespeed.launch.environment import rank_info
        info = rank_info(need_master=False)
        b = MpiBackend(); b.init(info, "cpu", 30)
        t = torch.ones(1 << 16)
        b.all_reduce(t, t, "sum")
        if info.rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        for _ in range(100000):
            b.all_reduce(t, t, "sum")
    """)
    t0 = time.monotonic()
    code = launch_mpirun([], 2, program=[sys.executable, script])
    assert code != 0
    assert time.monotonic() - t0 < 60
    assert _survivors(script) == []


@pytest.mark.timeout(90)
def test_a_hung_rank_is_a_timeout_error(tmp_path, capfd):
    # MPI itself never times out: the harness watchdog on the waiting rank must end it, with the
    # timeout's exit code, and mpirun must then end the rank that hangs.
    script = _script(tmp_path, """
        import time
        import torch
        from wirespeed.backends.mpi import MpiBackend
        from wirespeed.bench.watchdog import Watchdog
        from wirespeed.launch.environment import rank_info
        info = rank_info(need_master=False)
        b = MpiBackend(); b.init(info, "cpu", 2)
        b.barrier()
        if info.rank == 1:
            time.sleep(600)
        dog = Watchdog(2.0, info.rank)
        dog.step("all_reduce with a hung peer")
        t = torch.ones(16)
        b.all_reduce(t, t, "sum")
    """)
    t0 = time.monotonic()
    code = launch_mpirun([], 2, program=[sys.executable, script])
    assert code == 3
    assert time.monotonic() - t0 < 60
    assert "no progress for 2 s while all_reduce with a hung peer" in capfd.readouterr().err
    assert _survivors(script) == []


@pytest.mark.timeout(60)
def test_mpi_backend_usage_errors_are_one_line():
    env = {k: v for k, v in os.environ.items() if not k.startswith("WIRESPEED_")}
    # Ranks started by torchrun (or by hand with its variables) cannot form an MPI job.
    torchrun_env = dict(env, RANK="0", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT="1")
    proc = subprocess.run(CLI + ["bench", "--backend", "mpi", "--sizes", "8", "--no-save"],
                          env=torchrun_env, capture_output=True, text=True, timeout=50)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "mpirun" in proc.stderr, proc.stderr
    proc = subprocess.run(CLI + ["bench", "--backend", "mpi", "--device", "cuda", "--no-save"],
                          env=env, capture_output=True, text=True, timeout=50)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "cpu" in proc.stderr, proc.stderr
