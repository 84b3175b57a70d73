"""Worker: torch.compile(DDP(model)) trained on a wirespeed group and on a gloo group of the same
ranks (same seed, same per-rank data), plain and with no_sync() gradient accumulation; reports
each run's parameters after training, or the run's traceback. Between runs dynamo is reset, so
each wirespeed run compiles afresh (and after a reset). Then a compiled function whose
collectives dynamo does not turn into graph ops (broadcast, barrier, reduce, send/recv: it breaks
the graph there and torch calls the group from the gap), on each backend."""
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


def graph_breaks(backend: str) -> dict:
    torch._dynamo.reset()
    g = groups[backend]

    def f(x):
        y = x * 2
        dist.broadcast(y, 0, group=g)
        dist.all_reduce(y, group=g)
        z = torch.empty(world * y.numel())
        dist.all_gather_into_tensor(z, y, group=g)
        dist.barrier(group=g)
        w = y + rank
        dist.reduce(w, 0, group=g)
        if rank == 0:
            dist.send(w, 1, group=g)
        elif rank == 1:
            dist.recv(w, 0, group=g)
        return z, w
    z, w = torch.compile(f, backend="aot_eager")(torch.arange(4.0) + rank)
    # w: the reduce's result where it is defined (root, and rank 1 which received it)
    return {"z": z.tolist(), "w": w.tolist() if rank <= 1 else None}


out = {"rank": rank}
for backend in ("gloo", "wirespeed"):
    try:
        out[f"{backend}_graph_breaks"] = graph_breaks(backend)
    except Exception:  # noqa: BLE001 - the test shows the traceback
        out[f"{backend}_graph_breaks"] = {"crash": traceback.format_exc()[-3000:]}
    dist.barrier(group=groups["gloo"])
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
