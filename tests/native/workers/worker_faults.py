"""Worker (4 ranks): DDP on wirespeed equals DDP on gloo; mismatches, bad tensors, a slow peer and
a killed peer each raise their own typed error on every rank within the timeout."""
import copy
import datetime
import os
import signal
import sys
import threading
import time
import traceback

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # tests/
from native.ranks import report  # noqa: E402
import wirespeed.native as wn  # noqa: E402

rank = int(os.environ["RANK"])
world = int(os.environ["WORLD_SIZE"])
dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
out = {"rank": rank}


def expect_error(fn):
    """(exception class name, message, seconds taken) of what fn raises, or ('none', ...)."""
    t0 = time.monotonic()
    try:
        fn()
    except Exception as e:  # noqa: BLE001
        return type(e).__name__, str(e)[:300], time.monotonic() - t0
    return "none", "", time.monotonic() - t0


def ddp_params(group, seed_model, steps=6):
    torch.manual_seed(100 + rank)  # different initial weights per rank: DDP must broadcast rank 0's
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 3))
    ddp = DDP(model, process_group=group, bucket_cap_mb=0.002)  # several buckets, overlapped with backward
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    g = torch.Generator().manual_seed(seed_model + rank)
    for _ in range(steps):
        x = torch.randn(8, 16, generator=g)
        y = torch.randn(8, 3, generator=g)
        opt.zero_grad()
        nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
    return [p.detach().clone() for p in ddp.parameters()]


try:
    # DDP on ranks 0 and 1 (two addends: any summation order gives the same bits).
    ws2 = dist.new_group([0, 1], backend="wirespeed")
    gl2 = dist.new_group([0, 1], backend="gloo")
    if rank < 2:
        a = ddp_params(ws2, 7)
        b = ddp_params(gl2, 7)
        out["ddp_equal"] = all(torch.equal(x, y) for x, y in zip(a, b))
        out["ddp_moved"] = not all(torch.equal(x, y) for x, y in zip(a, ddp_params(gl2, 7, steps=0)))

    ws = dist.new_group(backend="wirespeed")
    # Size and dtype mismatches: every rank raises, the group stays usable.
    n = 10 if rank == 1 else 12
    out["size_mismatch"] = expect_error(lambda: dist.all_reduce(torch.ones(n), group=ws))
    dt = torch.float64 if rank == 2 else torch.float32
    out["dtype_mismatch"] = expect_error(lambda: dist.all_reduce(torch.ones(4, dtype=dt), group=ws))
    t = torch.ones(5)
    dist.all_reduce(t, group=ws)
    out["after_mismatch"] = t.tolist()
    # Tensors the backend cannot take: a clear error naming what is supported.
    out["dtype"] = expect_error(lambda: dist.all_reduce(torch.ones(4).to(torch.float8_e4m3fn), group=ws))
    out["op"] = expect_error(lambda: dist.all_reduce(torch.ones(4), op=dist.ReduceOp.BAND, group=ws))
    dist.barrier(group=ws)

    # A slow peer: rank 3 arrives after the 2 s timeout; the others time out, rank 3 learns why.
    slow = dist.new_group(backend="wirespeed", timeout=datetime.timedelta(seconds=2))
    dist.barrier()
    if rank == 3:
        time.sleep(4)
    out["slow"] = expect_error(lambda: dist.all_reduce(torch.ones(1000), group=slow))
    out["after_slow"] = expect_error(lambda: dist.all_reduce(torch.ones(10), group=slow))
    dist.barrier()

    # A killed peer in the middle of large all_reduces: survivors raise within seconds.
    kill = dist.new_group(backend="wirespeed", timeout=datetime.timedelta(seconds=30))
    big = torch.ones(16 << 20)  # 64 MiB
    dist.all_reduce(big, group=kill)
    dist.barrier(group=kill)
    if rank == 3:
        threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGKILL)).start()

    def loop():
        for _ in range(1000):
            dist.all_reduce(big, group=kill)
    out["killed"] = expect_error(loop)
except Exception:  # noqa: BLE001
    out["crash"] = traceback.format_exc()
report(out)
os._exit(0)
