"""`wirespeed bench --backend wirespeed` runs and checks every collective (2 real ranks)."""
import pytest


@pytest.mark.timeout(180)
def test_bench_runs_every_collective_on_the_wirespeed_backend(run_cli):
    p = run_cli("bench", "-N", "2", "--backend", "wirespeed", "-c", "all", "-b", "8", "-e", "256K", "-f", "32",
                  "-d", "float32,bfloat16,int8", "--no-save", timeout=170)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    for coll in ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all", "send_recv",
                 "barrier"):
        assert f"# {coll} | backend wirespeed" in p.stdout, coll
    assert "Out of bounds values : 0 OK" in p.stdout
