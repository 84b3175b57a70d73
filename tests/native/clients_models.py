"""Scenarios for worker_clients.py: training and sharding code that builds on the backend, run on
wirespeed and on gloo (or against an exact local computation), results handed back for comparison."""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


def _flat(ts) -> list[float]:
    return torch.cat([t.detach().reshape(-1).double() for t in ts]).tolist()


class TinyTransformer(nn.Module):
    def __init__(self, vocab=32, d=16, layers=2):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(nn.TransformerEncoderLayer(d, nhead=2, dim_feedforward=32, dropout=0.0,
                                                               batch_first=True) for _ in range(layers))
        self.head = nn.Linear(d, vocab)

    def forward(self, x):
        h = self.emb(x)
        for layer in self.layers:
            h = layer(h)
        return self.head(h)


def fsdp2_training(rank, world, mesh, steps=3):
    """fully_shard a tiny transformer on `mesh`, train `steps` SGD steps on per-rank batches; this
    rank's losses and the full parameters after training. (SGD, not Adam: Adam divides by the
    gradient's magnitude, so a last-bit difference in a near-zero gradient, from summing in another
    order, becomes a whole step, and no tolerance would tell a bug from rounding.)"""
    from torch.distributed.fsdp import fully_shard
    torch.manual_seed(0)
    model = TinyTransformer()
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(100 + rank)
    losses = []
    for _ in range(steps):
        x = torch.randint(0, 32, (2, 8), generator=gen)
        loss = F.cross_entropy(model(x[:, :-1]).reshape(-1, 32), x[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    params = [p.full_tensor() for p in model.parameters()]
    return {"losses": losses, "params": _flat(params)}


def _mlp():
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


HOOKS = ("ALLREDUCE", "FP16_COMPRESS", "BF16_COMPRESS", "QUANTIZE_PER_TENSOR", "QUANTIZE_PER_CHANNEL",
         "POWER_SGD", "POWER_SGD_RANK2", "BATCHED_POWER_SGD", "BATCHED_POWER_SGD_RANK2", "NOOP",
         "builtin:ALLREDUCE", "builtin:FP16_COMPRESS")


def ddp_with_hook(rank, group, hook: str, steps=4):
    """DDP on `group` with one built-in comm hook: the parameters after `steps` SGD steps, or the
    error the hook raised."""
    try:
        return {"params": _ddp_steps(rank, group, hook, steps)}
    except Exception as e:  # noqa: BLE001 - compared with gloo's outcome by the test
        return {"error": f"{type(e).__name__}: {str(e)[:200]}"}


def _ddp_steps(rank, group, hook, steps):
    from torch.distributed.algorithms.ddp_comm_hooks import DDPCommHookType, register_ddp_comm_hook
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
    from torch.nn.parallel import DistributedDataParallel as DDP
    model = DDP(_mlp(), process_group=group, bucket_cap_mb=0.0005)   # several buckets
    if hook.startswith("builtin:"):
        model._register_builtin_comm_hook(getattr(dist.BuiltinCommHookType, hook.split(":")[1]))
    elif "POWER_SGD" in hook:
        # Compress from the second step on, every matrix however small, so PowerSGD really runs.
        state = psgd.PowerSGDState(process_group=group, matrix_approximation_rank=2 if "RANK2" in hook else 1,
                                   start_powerSGD_iter=2, min_compression_rate=0.0)
        model.register_comm_hook(state, psgd.batched_powerSGD_hook if "BATCHED" in hook else psgd.powerSGD_hook)
    else:
        register_ddp_comm_hook(DDPCommHookType[hook], model, group)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(7 + rank)
    for _ in range(steps):
        x = torch.randn(5, 8, generator=gen)
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()
    return _flat(model.parameters())


def dtensor_2d(rank, world):
    """A 2-D DeviceMesh from init_device_mesh("cpu"), DTensor shardings over it, and a sharded
    matmul, each against the same computation on full local tensors (exact: small integers)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    wrong = []
    mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("dp", "tp"))
    info = {"dims": mesh.mesh_dim_names, "backends": [dist.get_backend(mesh.get_group(d)) for d in ("dp", "tp")],
            "classes": [type(mesh.get_group(d)).__name__ for d in ("dp", "tp")]}
    a = (torch.arange(64, dtype=torch.float64).reshape(8, 8) % 7) - 3
    b = (torch.arange(64, dtype=torch.float64).reshape(8, 8) % 5) - 2
    for placements in ([Shard(0), Shard(1)], [Replicate(), Shard(0)], [Shard(1), Replicate()]):
        d = distribute_tensor(a, mesh, placements)
        if not torch.equal(d.full_tensor(), a):
            wrong.append(f"full_tensor {placements}")
        if not torch.equal(d.redistribute(mesh, [Replicate(), Replicate()]).to_local(), a):
            wrong.append(f"redistribute {placements}")
    da = distribute_tensor(a, mesh, [Shard(0), Replicate()])
    db = distribute_tensor(b, mesh, [Replicate(), Shard(1)])
    if not torch.equal((da @ db).full_tensor(), a @ b):
        wrong.append("matmul")
    s = distribute_tensor(a, mesh, [Shard(0), Shard(1)]).sum()
    if s.full_tensor().item() != a.sum().item():
        wrong.append("sum")
    info["wrong"] = wrong
    return info


def dtensor_1d(rank, world, group):
    """A 1-D mesh from init_device_mesh and one from DeviceMesh.from_group."""
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    wrong = []
    a = (torch.arange(world * 6, dtype=torch.float32).reshape(world * 2, 3) % 9) - 4
    for name, mesh in (("init_device_mesh", init_device_mesh("cpu", (world,))),
                       ("from_group", DeviceMesh.from_group(group, "cpu"))):
        d = distribute_tensor(a, mesh, [Shard(0)])
        if d.to_local().shape[0] != 2 or not torch.equal(d.full_tensor(), a):
            wrong.append(name)
    return {"wrong": wrong}


def compiled_collective(rank, world, group, backend):
    """torch.compile (`backend`: inductor, or aot_eager without code generation) of a function
    calling a functional collective."""
    import torch.distributed._functional_collectives as funcol

    def f(x):
        return funcol.all_reduce(x * 2, "sum", group) + 1

    x = torch.arange(6, dtype=torch.float32) + rank
    got = torch.compile(f, fullgraph=True, backend=backend)(x)
    exp = sum((torch.arange(6, dtype=torch.float32) + r) * 2 for r in range(world)) + 1
    return {"equal": bool(torch.equal(got, exp)), "got": got.tolist()}
