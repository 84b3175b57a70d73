"""Synchronous aggregation strategies: how the ranks turn their gradients into the summed gradient
(or, with --optimizer sgd, into the updated weights). Each is real communication over the chosen
backend's collectives, bucket by bucket in launch order; async-ps lives in async_ps.py.

- allreduce: all_reduce per bucket, every rank ends with the sum (DDP; with sgd every rank updates
  its own replica);
- reduce-broadcast: reduce to rank 0, which updates, then broadcast back (MXNet's `local` kvstore);
- sharded-ps: S server ranks each own 1/S of every bucket: push = reduce to the owners, the owner
  updates its shard, pull = gather the shards to everyone (MXNet's `dist_sync`). With S equal to the
  world size that is one reduce_scatter and one all_gather per bucket; with fewer servers, a reduce
  and a broadcast per shard, since the collectives reduce_scatter/all_gather have no subset form.
"""
from __future__ import annotations

import torch

from ..bench.dtypes import DType
from .bucketing import BucketPlan
from .data import LR, fill_grad, fill_weights


class StepState:
    """One rank's gradient buckets (and weight replicas with sgd), each padded to `pad` elements so a
    bucket splits evenly into shards; the padding is zero on every rank and never checked."""

    def __init__(self, plan: BucketPlan, dt: DType, device: str, rank: int, pad: int, optimizer: bool):
        self.plan, self.dt, self.rank, self.optimizer = plan, dt, rank, optimizer
        self.padded = [-(-b.numel // pad) * pad for b in plan.buckets]
        self.grads = [torch.zeros(n, dtype=dt.torch, device=device) for n in self.padded]
        self.weights = ([torch.zeros(n, dtype=dt.torch, device=device) for n in self.padded]
                        if optimizer else [])

    def fill(self, seed: int, divisor: int) -> None:
        for b, g in zip(self.plan.buckets, self.grads):
            g[b.numel:].zero_()
            fill_grad(g[:b.numel], seed, b.offset, self.dt, divisor)
        for b, w in zip(self.plan.buckets, self.weights):
            w[b.numel:].zero_()
            fill_weights(w[:b.numel], b.offset, self.dt)

    def results(self) -> list[torch.Tensor]:
        """Per bucket, what the step produced: the weights with sgd, else the summed gradient."""
        src = self.weights if self.optimizer else self.grads
        return [t[:b.numel] for b, t in zip(self.plan.buckets, src)]

    def nbytes(self) -> int:
        return sum(self.padded) * self.dt.itemsize * (2 if self.optimizer else 1)


def _sgd(w: torch.Tensor, g: torch.Tensor) -> None:
    w.add_(g, alpha=-LR)


class Strategy:
    name = ""

    @staticmethod
    def pad(world: int, servers: int) -> int:
        """Buckets are padded to a multiple of this many elements."""
        return 1

    def __init__(self, backend, state: StepState, rank: int, world: int, servers: int):
        self.b, self.s, self.rank, self.world, self.servers = backend, state, rank, world, servers

    def calls_per_step(self) -> int:
        raise NotImplementedError

    def step(self) -> None:
        raise NotImplementedError


class AllReduce(Strategy):
    name = "allreduce"

    def calls_per_step(self):
        return len(self.s.grads)

    def step(self):
        for i, g in enumerate(self.s.grads):
            self.b.all_reduce(g, g, "sum")
            if self.s.optimizer:
                _sgd(self.s.weights[i], g)


class ReduceBroadcast(Strategy):
    name = "reduce-broadcast"
    ROOT = 0

    def calls_per_step(self):
        return 2 * len(self.s.grads)

    def step(self):
        for i, g in enumerate(self.s.grads):
            self.b.reduce(g, g, "sum", self.ROOT)
            out = g
            if self.s.optimizer:
                out = self.s.weights[i]
                if self.rank == self.ROOT:
                    _sgd(out, g)
            self.b.broadcast(out, out, self.ROOT)


class ShardedPS(Strategy):
    name = "sharded-ps"

    @staticmethod
    def pad(world, servers):
        return servers  # shards of equal size (servers == world for reduce_scatter / all_gather)

    def __init__(self, backend, state, rank, world, servers):
        super().__init__(backend, state, rank, world, servers)
        self.collective = servers == world
        if self.collective:
            dt, dev = state.dt.name, str(state.grads[0].device) if state.grads else "cpu"
            dev = "cuda" if dev.startswith("cuda") else "cpu"
            # In place where the backend can (no extra buffer); else through a separate shard buffer.
            self.rs_inplace = backend.unsupported("reduce_scatter", dt, "sum", True, dev) is None
            self.ag_inplace = backend.unsupported("all_gather", dt, None, True, dev) is None
            if not self.rs_inplace or not self.ag_inplace:
                self.tmp = [torch.empty(n // world, dtype=state.dt.torch, device=g.device)
                            for n, g in zip(state.padded, state.grads)]

    def calls_per_step(self):
        return len(self.s.grads) * (2 if self.collective else 2 * self.servers)

    def step(self):
        if self.collective:
            return self._step_collective()
        for i, g in enumerate(self.s.grads):
            shard = g.numel() // self.servers
            for owner in range(self.servers):
                piece = g[owner * shard:(owner + 1) * shard]
                self.b.reduce(piece, piece, "sum", owner)  # push to the owner
                out = piece
                if self.s.optimizer:
                    out = self.s.weights[i][owner * shard:(owner + 1) * shard]
                    if self.rank == owner:
                        _sgd(out, piece)
                self.b.broadcast(out, out, owner)  # pull from the owner

    def _step_collective(self):
        r = self.rank
        for i, g in enumerate(self.s.grads):
            shard = g.numel() // self.world
            mine = g[r * shard:(r + 1) * shard]
            if self.rs_inplace:
                self.b.reduce_scatter(g, mine, "sum")
            else:
                self.b.reduce_scatter(g, self.tmp[i], "sum")
                mine.copy_(self.tmp[i])
            full = g
            if self.s.optimizer:
                full = self.s.weights[i]
                _sgd(full[r * shard:(r + 1) * shard], mine)
            own = full[r * shard:(r + 1) * shard]
            if self.ag_inplace:
                self.b.all_gather(own, full)
            else:
                self.tmp[i].copy_(own)
                self.b.all_gather(self.tmp[i], full)


SYNC_STRATEGIES = {s.name: s for s in (AllReduce, ReduceBroadcast, ShardedPS)}
