"""A deliberately stuck job, for docs/debugging.md: three all_reduces, the first under
torch.profiler; rank 1 skips the last one, as a rank with a bug would, and waits. The others time out
(5 s) and report which collective, its number, and who had not reached it.

    TORCH_FR_BUFFER_SIZE=2000 TORCH_FR_DUMP_TEMP_FILE=/tmp/fr/rank_ \\
        .venv/bin/torchrun --nproc-per-node 3 examples/stuck_job.py

Each rank writes torch.profiler's trace of its first step to /tmp/fr/profile_<rank>.json.
"""
import datetime
import os
import time

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

import wirespeed.native  # noqa: F401  (registers the "wirespeed" backend)

dist.init_process_group("wirespeed", timeout=datetime.timedelta(seconds=5))
rank = dist.get_rank()
grad = torch.ones(1 << 16)
out = os.path.dirname(os.environ.get("TORCH_FR_DUMP_TEMP_FILE", "/tmp/fr/rank_"))
os.makedirs(out, exist_ok=True)
with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
    dist.all_reduce(grad)
prof.export_chrome_trace(f"{out}/profile_{rank}.json")
for step in range(2):
    if rank == 1 and step == 1:
        print("rank 1: skipping the all_reduce of step 1", flush=True)
        time.sleep(15)          # alive, but not in the collective: the others wait for it
        break
    try:
        dist.all_reduce(grad)
    except RuntimeError as e:
        print(f"rank {rank}: {type(e).__name__}: {e}", flush=True)
        time.sleep(3)           # keep the store (rank 0) up while the peers report
        break
os._exit(0)
