"""DTensor and tensor parallelism on the wirespeed backend, beside gloo, with no benchmark around
it: a Partial -> Shard(1) redistribution (a reduce-scatter along dim 1), functional collectives on
temporaries, and a small tensor-parallel model (SequenceParallel LayerNorm, Colwise -> Rowwise,
loss_parallel) trained three SGD steps on a wirespeed mesh and on a gloo mesh.

    .venv/bin/torchrun --nproc-per-node 2 examples/dtensor_tp.py

Rank 0 prints both backends' results and their largest difference.
"""
import datetime
import os

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Shard
from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel, SequenceParallel, loss_parallel,
                                               parallelize_module)

import wirespeed.native  # noqa: F401  (registers the "wirespeed" backend)

torch.set_num_threads(1)
dist.init_process_group("wirespeed", timeout=datetime.timedelta(seconds=60))
rank, world = dist.get_rank(), dist.get_world_size()
meshes = {"wirespeed": DeviceMesh.from_group(dist.group.WORLD, "cpu"),
          "gloo": DeviceMesh.from_group(dist.new_group(backend="gloo"), "cpu")}


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm, self.up, self.down, self.head = nn.LayerNorm(12), nn.Linear(12, 24), nn.Linear(24, 12), nn.Linear(12, 12)

    def forward(self, x):
        return self.head(self.down(F.relu(self.up(self.norm(x)))))


def run(mesh):
    out = {}
    # every rank holds a part; the sum is the whole. Partial -> Shard(1), then gathered back.
    whole = torch.arange(4 * 6 * world, dtype=torch.float32).reshape(4, 6 * world)
    part = whole / world
    d = DTensor.from_local(part, mesh, [Partial()], run_check=False).redistribute(mesh, [Shard(1)])
    out["redistribute_max_error"] = float((d.full_tensor() - whole).abs().max())
    # functional collectives on temporaries, as DTensor issues them
    scatter = getattr(funcol, "reduce_scatter_single", None) or funcol.reduce_scatter_tensor   # torch 2.6+ name
    rs = scatter(whole * (rank + 1), "sum", 1, mesh)
    want = (whole * sum(range(1, world + 1)))[:, rank * 6:(rank + 1) * 6]
    out["funcol_max_error"] = float((rs.wait() - want).abs().max())
    # a tensor-parallel model, three steps
    torch.manual_seed(0)
    model = parallelize_module(Block(), mesh, {
        "norm": SequenceParallel(), "up": ColwiseParallel(input_layouts=Shard(1)),
        "down": RowwiseParallel(output_layouts=Shard(1)),
        "head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False)})
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(7)
    losses = []
    for _ in range(3):
        x, y = torch.randn(2, 2 * world, 12, generator=gen), torch.randint(0, 12, (2, 2 * world), generator=gen)
        with loss_parallel():
            loss = F.cross_entropy(model(x[:, 2 * rank:2 * rank + 2]).flatten(0, 1), y.flatten(0, 1))
            loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(round(loss.full_tensor().item(), 6))
    out["losses"] = losses
    out["params"] = torch.cat([p.full_tensor().detach().reshape(-1) for p in model.parameters()])
    return out


res = {name: run(mesh) for name, mesh in meshes.items()}
if rank == 0:
    for name, r in res.items():
        print(f"{name:9}  redistribute error {r['redistribute_max_error']}  funcol error {r['funcol_max_error']}  "
              f"losses {r['losses']}")
    print(f"largest parameter difference, wirespeed vs gloo: "
          f"{float((res['wirespeed']['params'] - res['gloo']['params']).abs().max())}")
dist.destroy_process_group()
