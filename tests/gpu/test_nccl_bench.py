"""NCCL on CUDA tensors: only where this machine has GPUs (CI has none and skips)."""
import json

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU visible")

from wsutil import wirespeed  # noqa: E402


@pytest.mark.timeout(300)
def test_nccl_every_collective_checked(tmp_path):
    n = torch.cuda.device_count()
    out = tmp_path / "r.jsonl"
    p = wirespeed("bench", "--backend", "nccl", "--device", "cuda", "-N", n, "-c", "all",
                  "-d", "float32,bfloat16,int8", "-o", "sum,max,avg", "--sizes", "0,1000,1M",
                  "-n", "3", "-w", "1", "--no-save", "--json", out, timeout=280)
    assert p.returncode == 0, p.stderr[-2000:]
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert recs and all(r["wrong"] == 0 and r["device"] == "cuda" for r in recs)


@pytest.mark.timeout(300)
def test_gloo_on_cuda_tensors(tmp_path):
    p = wirespeed("bench", "--backend", "gloo", "--device", "cuda", "-N", "2", "-c", "all_reduce",
                  "-b", "4K", "-e", "1M", "-f", "16", "--no-save", timeout=280)
    assert p.returncode == 0, p.stderr[-2000:]


@pytest.mark.timeout(300)
def test_device_cpu_without_backend_runs_gloo_on_a_gpu_box(tmp_path):
    out = tmp_path / "r.jsonl"
    p = wirespeed("bench", "--device", "cpu", "-N", "2", "-b", "4K", "-e", "4K", "-n", "3", "-w", "1",
                  "--no-save", "--json", out, timeout=280)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "backend gloo, device cpu" in p.stdout
    assert all(json.loads(line)["backend"] == "gloo" for line in out.read_text().splitlines())


@pytest.mark.timeout(300)
def test_two_nccl_ranks_share_one_gpu_as_two_hosts(tmp_path):
    # Refused on one host (NCCL would say "Duplicate GPU"), run as two hosts on GPU 0 alone.
    env = {"CUDA_VISIBLE_DEVICES": "0"}
    refused = wirespeed("bench", "--backend", "nccl", "-N", "2", "-b", "4K", "-e", "4K", "--no-save",
                        env=env, timeout=120)
    assert refused.returncode == 2 and "--host-per-rank" in refused.stderr
    out = tmp_path / "r.jsonl"
    p = wirespeed("bench", "--backend", "nccl", "-N", "2", "--host-per-rank", "-b", "4K", "-e", "1M",
                  "-f", "16", "-n", "5", "-w", "2", "--no-save", "--json", out, env=env, timeout=280)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "# ranks 0,1 share GPU" in p.stdout and "MPS" in p.stdout
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert recs and all(r["wrong"] == 0 and r["world_size"] == 2 for r in recs)


@pytest.mark.timeout(400)
def test_compare_runs_gloo_on_cuda_where_bench_does(tmp_path):
    # 2 ranks on one GPU: bench runs gloo on CUDA tensors, so compare must not skip it.
    p = wirespeed("compare", "--backends", "gloo", "--dtypes", "float32", "--devices", "cuda",
                  "--nprocs", "2", "--sizes", "4K,64K", "-n", "3", "-w", "1", "--no-save",
                  env={"CUDA_VISIBLE_DEVICES": "0"}, timeout=380)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert "# wirespeed compare: 1 combination x" in p.stdout and "gloo on cuda" not in p.stdout
    assert "gloo float32" in p.stdout
