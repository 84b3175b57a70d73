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
