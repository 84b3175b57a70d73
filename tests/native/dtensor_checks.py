"""DTensor and tensor parallelism on a mesh, each result against the same computation on whole
tensors in this process: every redistribution between Replicate, Shard(0), Shard(1) and Partial,
sharded matmuls, a small tensor-parallel model (SequenceParallel LayerNorm, Colwise -> Rowwise,
loss_parallel) and, on 4 ranks, the same model under FSDP2 x TP on a 2-D mesh. Run by
worker_dtensor.py on a wirespeed mesh and on a gloo mesh of the same ranks.

Tolerance: redistributions and matmuls use small integers, so they are exact. Training is float32,
and sharded matmuls sum in another order than the whole ones, so the losses and parameters after
three SGD steps are compared within TRAIN_ATOL (the measured gap on gloo and wirespeed is ~1e-7; a
lost or reused buffer gives inf, NaN or errors of 1e-2 and up). SGD rather than Adam, whose
division by a near-zero gradient turns a last-bit difference into a whole step.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

TRAIN_ATOL = 2e-5
STEPS = 3


def _placements():
    from torch.distributed.tensor import Partial, Replicate, Shard
    return {"Replicate": Replicate(), "Shard(0)": Shard(0), "Shard(1)": Shard(1), "Partial": Partial()}


def _whole(world: int, shape) -> torch.Tensor:
    n = 1
    for s in shape:
        n *= s
    return ((torch.arange(n, dtype=torch.float32) * 7) % 19 - 9).reshape(shape)


def redistributions(rank: int, world: int, mesh) -> dict:
    """Every (from, to) pair, on an even and an uneven shape: 'ok', a description of what is
    wrong, or 'raised <Type>' (torch refuses some pairs on any backend; the test compares with gloo)."""
    from torch.distributed.tensor import DTensor, Partial, distribute_tensor
    out = {}
    ps = _placements()
    for shape in ((2 * world, 3 * world), (2 * world + 1, 3 * world - 1)):
        whole = _whole(world, shape)
        for src_name, src in ps.items():
            for dst_name, dst in ps.items():
                key = f"{src_name}->{dst_name} {shape[0]}x{shape[1]}"
                try:
                    if isinstance(src, Partial):
                        # rank r holds whole * (r + 1) / sum(1..world) in parts that sum exactly:
                        # each rank's share is an integer tensor, the last rank takes the rest.
                        part = torch.div(whole, world, rounding_mode="floor")
                        local = part if rank < world - 1 else whole - part * (world - 1)
                        d = DTensor.from_local(local, mesh, [src], run_check=False)
                    else:
                        d = distribute_tensor(whole, mesh, [src])
                    r = d.redistribute(mesh, [dst])
                    got = r.full_tensor()
                    if not torch.equal(got, whole):
                        out[key] = f"wrong: {int((got != whole).sum())} of {whole.numel()} elements differ"
                    elif not isinstance(dst, Partial) and not torch.equal(
                            r.to_local(), distribute_tensor(whole, mesh, [dst]).to_local()):
                        out[key] = "wrong local shard"
                    else:
                        out[key] = "ok"
                except Exception as e:  # noqa: BLE001 - compared with gloo's outcome by the test
                    out[key] = f"raised {type(e).__name__}"
    return out


def matmuls(rank: int, world: int, mesh) -> list[str]:
    """Sharded matmuls (contraction-dim shards give Partial results) against the whole product."""
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    wrong = []
    a = _whole(world, (4, 6 * world))
    b = (_whole(world, (6 * world, 2 * world)) % 5) - 2
    for pa, pb, name in ((Shard(1), Shard(0), "contracted shards (Partial)"),
                         (Shard(0), Replicate(), "row shards"),
                         (Replicate(), Shard(1), "column shards")):
        c = distribute_tensor(a, mesh, [pa]) @ distribute_tensor(b, mesh, [pb])
        if not torch.equal(c.full_tensor(), a @ b):
            wrong.append(name)
        if not torch.equal(c.redistribute(mesh, [Shard(1)]).full_tensor(), a @ b):
            wrong.append(f"{name}, then Shard(1)")
    return wrong


class TPBlock(nn.Module):
    """LayerNorm -> up -> relu -> down -> head: the shapes a transformer's MLP and output take."""

    def __init__(self, d=12, hidden=24, vocab=12):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.up = nn.Linear(d, hidden)
        self.down = nn.Linear(hidden, d)
        self.head = nn.Linear(d, vocab)

    def forward(self, x):
        return self.head(self.down(F.relu(self.up(self.norm(x)))))


def tp_plan():
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel
    return {"norm": SequenceParallel(),
            "up": ColwiseParallel(input_layouts=Shard(1)),
            "down": RowwiseParallel(output_layouts=Shard(1)),
            "head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False)}


def _batches(seed: int, seq: int):
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(2, seq, 12, generator=gen), torch.randint(0, 12, (2, seq), generator=gen))
            for _ in range(STEPS)]


def _reference(batches_per_replica) -> dict:
    """The unsharded model on whole batches: each step averages the replicas' mean losses, as
    data parallelism does."""
    torch.manual_seed(0)
    model = TPBlock()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for step in range(STEPS):
        per = [F.cross_entropy(model(x).flatten(0, 1), y.flatten(0, 1)) for x, y in
               (b[step] for b in batches_per_replica)]
        loss = sum(per) / len(per)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return {"losses": losses, "params": {n: p.detach() for n, p in model.named_parameters()}}


def _train_sharded(model, batches, tp_rank: int, tp_size: int, replicas: int) -> list[float]:
    from torch.distributed.tensor.parallel import loss_parallel
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for x, y in batches:
        seq = x.shape[1] // tp_size
        local = x[:, tp_rank * seq:(tp_rank + 1) * seq]        # SequenceParallel takes this rank's piece
        with loss_parallel():
            logits = model(local)
            loss = F.cross_entropy(logits.flatten(0, 1), y.flatten(0, 1))
            loss.backward()
        opt.step()
        opt.zero_grad()
        full = loss.full_tensor() if hasattr(loss, "full_tensor") else loss
        losses.append(full.item())
    return losses


def _compare(losses, model, ref) -> dict:
    got = {n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach() for n, p in model.named_parameters()}
    gap = max(abs(a - b) for a, b in zip(losses, ref["losses"]))
    pgap = max(float((got[n] - ref["params"][n]).abs().max()) for n in ref["params"])
    finite = all(torch.isfinite(torch.tensor(losses))) and all(bool(torch.isfinite(t).all()) for t in got.values())
    return {"losses": losses, "ref_losses": ref["losses"], "loss_gap": gap, "param_gap": pgap, "finite": finite}


def tp_training(rank: int, world: int, mesh) -> dict:
    """The TP plan on a 1-D mesh of every rank; every rank sees the same batches."""
    from torch.distributed.tensor.parallel import parallelize_module
    batches = _batches(7, 2 * world)
    ref = _reference([batches])
    torch.manual_seed(0)
    model = parallelize_module(TPBlock(), mesh, tp_plan())
    return _compare(_train_sharded(model, batches, rank, world, 1), model, ref)


def fsdp_tp_training(rank: int, world: int, mesh2d) -> dict:
    """FSDP2 over "dp" x the TP plan over "tp" (a 2 x world/2 mesh); dp replicas see different
    batches, so gradients are averaged across them by FSDP's reduce-scatter."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module
    dp, tp = mesh2d["dp"], mesh2d["tp"]
    dp_rank, tp_rank, tp_size = dp.get_local_rank(), tp.get_local_rank(), tp.size()
    per_replica = [_batches(11 + r, 2 * tp_size) for r in range(dp.size())]
    ref = _reference(per_replica)
    torch.manual_seed(0)
    model = parallelize_module(TPBlock(), tp, tp_plan())
    fully_shard(model, mesh=dp)
    losses = _train_sharded(model, per_replica[dp_rank], tp_rank, tp_size, dp.size())
    # this replica's loss; the reference's is the replicas' mean: average them over dp to compare
    t = torch.tensor(losses)
    torch.distributed.all_reduce(t, group=dp.get_group())
    return _compare((t / dp.size()).tolist(), model, ref)
