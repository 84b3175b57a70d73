"""`wirespeed train` on CUDA tensors with NCCL: only where this machine has GPUs (CI has none and
skips). One rank per GPU; with one GPU the job is a single rank, which still runs DDP and FSDP2
through NCCL and checks the state."""
import json

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU visible")

from wsutil import wirespeed  # noqa: E402


@pytest.mark.timeout(300)
@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_nccl_trains_on_gpus(tmp_path, parallel):
    n = torch.cuda.device_count()
    out = tmp_path / "t.jsonl"
    p = wirespeed("train", "--model", "resnet18", "--image-size", "64", "--batch-size", "8",
                  "--parallel", parallel, "--backend", "nccl", "--device", "cuda", "-N", n,
                  "-w", "2", "-n", "5", "--json", out, "--no-save", timeout=280)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    (r,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert r["device"] == "cuda" and r["world_size"] == n and r["step_us"] > 0 and r["compute_us"] > 0
