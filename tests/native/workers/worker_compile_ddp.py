"""Worker: torch.compile(DDP(model)) trained on a wirespeed group and on a gloo group of the same
ranks (same seed, same per-rank data), plain and with no_sync() gradient accumulation; reports
each run's parameters after training, or the run's traceback. Between runs dynamo is reset, so
each wirespeed run compiles afresh (and after a reset)."""
import datetime
import os
import sys
import traceback

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # tests/
from native.ranks import report  # noqa: E402
import wirespeed.native  # noqa: E402,F401

torch.set_num_threads(1)
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
dist.init_process_group("wirespeed", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
groups = {"wirespeed": dist.group.WORLD, "gloo": dist.new_group(backend="gloo")}
STEPS, MICRO = 3, 2


def model():
    # ~3 MiB of parameters in 1 MiB layers: with bucket_cap_mb=1, DDP's reducer makes several
    # buckets and dynamo's DDP optimizer splits the compiled graph at them.
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 16))


def train(backend: str, no_sync: bool) -> dict:
    torch._dynamo.reset()
    m = model()
    ddp = DDP(m, process_group=groups[backend], bucket_cap_mb=1)
    step = torch.compile(ddp, backend="aot_eager")
    opt = torch.optim.SGD(m.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(100 + rank)
    for _ in range(STEPS):
        batches = [torch.randn(4, 512, generator=gen) for _ in range(MICRO if no_sync else 1)]
        if no_sync:
            with ddp.no_sync():          # gradients accumulate locally; the last batch syncs them
                for x in batches[:-1]:
                    step(x).pow(2).mean().backward()
        step(batches[-1]).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    return {"params": torch.cat([p.detach().reshape(-1) for p in m.parameters()]).tolist()}


out = {"rank": rank}
for no_sync in (False, True):
    for backend in ("gloo", "wirespeed"):
        name = f"{backend}{'_no_sync' if no_sync else ''}"
        try:
            out[name] = train(backend, no_sync)
        except Exception:  # noqa: BLE001 - the test shows the traceback
            out[name] = {"crash": traceback.format_exc()[-3000:]}
        dist.barrier(group=groups["gloo"])
report(out)
dist.destroy_process_group()
os._exit(0)
