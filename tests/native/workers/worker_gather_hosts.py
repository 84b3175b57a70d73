"""Worker (6 ranks on 3 host ids, dealt round robin: leaders 0, 1, 2): torch's gather and scatter
on the wirespeed backend across hosts, which go through the host leaders (algo/leaders_gs.rs),
from every root (a leader and not), empty tensors among them, each checked element by element."""
import datetime
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # tests/
from native.ranks import report  # noqa: E402
import wirespeed.native  # noqa: E402,F401

rank = int(os.environ["RANK"])
world = int(os.environ["WORLD_SIZE"])
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
os.environ["WIRESPEED_HOSTID"] = f"host{rank % 3}"
g = dist.new_group(backend="wirespeed")


def data(src: int, dst: int, n: int) -> torch.Tensor:
    return torch.arange(n, dtype=torch.float32) + 1000 * src + 10 * dst


bad, checked = [], 0
for root in range(world):
    n = 37 * root  # root 0: empty tensors
    outs = [torch.full((n,), -1.0) for _ in range(world)] if rank == root else None
    dist.gather(data(rank, root, n), outs, dst=root, group=g)
    if rank == root:
        bad += [f"gather to {root}: piece of {j}" for j, o in enumerate(outs) if not torch.equal(o, data(j, root, n))]
        checked += 1
    out = torch.full((n,), -1.0)
    dist.scatter(out, [data(root, j, n) for j in range(world)] if rank == root else None, src=root, group=g)
    if not torch.equal(out, data(root, rank, n)):
        bad.append(f"scatter from {root}")
    checked += 1
report({"rank": rank, "bad": bad, "checked": checked})
dist.barrier()
os._exit(0)
