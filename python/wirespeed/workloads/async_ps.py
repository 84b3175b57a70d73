"""async-ps: a parameter server whose workers never wait for each other (MXNet's `dist_async`).

Ranks 0..S-1 are servers; bucket b belongs to server b % S. The other ranks are workers. Each step a
worker sends every bucket's gradient to its owner and receives that bucket's current value back
(push and pull in one exchange), waiting only for its servers. A server serves whichever worker's
push arrives first, applies it at once (sum, or w -= lr * g with sgd) and replies. So a fast worker
runs ahead and a slow one is never waited for; the price is staleness: a push is applied to a
value that other workers' pushes changed since this worker last pulled it.

Staleness of a push = updates applied to its bucket between the worker's last pull of that bucket and
this push (0 in synchronous training). StalenessLedger keeps the account; every push is counted.

It needs non-blocking point-to-point messages and a receive from any source, which the Backend
interface does not have, so it runs on torch.distributed's gloo with CPU tensors and says so
otherwise (gloo's request objects report completion only through wait(), so they cannot be polled).
"""
from __future__ import annotations

import time

import torch

from ..bench.dtypes import DTYPES
from ..bench.harness import summarize
from ..errors import UsageError
from .check import check_slice, finish
from .config import servers_for
from .data import LR, fill_grad, fill_weights, grad_divisor, reference


class StalenessLedger:
    """Per bucket, the count of applied updates (its version) and the version each worker last pulled."""

    def __init__(self):
        self.version: dict[int, int] = {}
        self.pulled: dict[tuple[int, int], int] = {}
        self.staleness: list[int] = []

    def apply(self, worker: int, bucket: int) -> int:
        """Account one push from `worker` to `bucket`, answered with the updated value; its staleness."""
        v = self.version.get(bucket, 0)
        s = v - self.pulled.get((worker, bucket), 0)
        self.version[bucket] = v + 1
        self.pulled[(worker, bucket)] = v + 1
        self.staleness.append(s)
        return s

    def summary(self) -> tuple[float, float, float]:
        """(sum, max, count) of the staleness of every push so far."""
        st = self.staleness
        return float(sum(st)), float(max(st, default=0)), float(len(st))


def _require_gloo(device: str):
    import torch.distributed as dist
    if (not dist.is_available() or not dist.is_initialized() or dist.get_backend() != "gloo"
            or device != "cpu"):
        raise UsageError("async-ps needs torch.distributed's gloo on CPU tensors: a server receives "
                         "from whichever worker is first (any-source receive), which NCCL and the "
                         "other backends lack; use --backend gloo --device cpu")
    return dist


def serve(dist, plan, state, workers: list[int], steps: int, optimizer: bool, ledger, watchdog,
          rank: int, servers: int) -> None:
    """Serve `steps` pushes of every owned bucket from every worker, in arrival order.

    A push is a header [worker, bucket] (tag 0, received from any source, so whichever worker is
    first is served first) followed by the gradient (tag bucket + 1) from that worker."""
    owned = [b for b in plan.buckets if b.index % servers == rank]
    if not owned:
        return
    by_index = {b.index: b for b in owned}
    x0 = next(iter(state.values()))
    size = max(b.numel for b in owned)
    buf = torch.empty(size, dtype=x0.dtype, device=x0.device)
    header = torch.zeros(2, dtype=torch.int64)
    replies: dict[int, list] = {b.index: [] for b in owned}
    total = steps * len(owned) * len(workers)
    for served in range(total):
        watchdog.step(f"serving async-ps pushes ({served} of {total} served)")
        dist.recv(header, src=None, tag=0)
        w, bi = int(header[0]), int(header[1])
        b = by_index[bi]
        g = buf[:b.numel]
        dist.recv(g, src=w, tag=bi + 1)
        for r in replies[bi]:  # the value may change only once its earlier replies have left
            r.wait()
        x = state[bi]
        ledger.apply(w, bi)
        if optimizer:
            x.add_(g, alpha=-LR)
        else:
            x.add_(g)
        replies[bi] = [dist.isend(x, dst=w, tag=bi + 1)]
    for rs in replies.values():
        for r in rs:
            r.wait()


def work(dist, plan, grads, pulled, servers: int, steps: int, warmup: int, rank: int,
         watchdog) -> list[float]:
    """Push and pull every bucket each step; return the timed steps' durations."""
    headers = [torch.tensor([rank, b.index], dtype=torch.int64) for b in plan.buckets]
    times = []
    for step in range(steps):
        watchdog.step(f"async-ps worker step {step + 1} of {steps}")
        t0 = time.perf_counter()
        reqs = []
        for b in plan.buckets:
            owner = b.index % servers
            reqs.append(dist.isend(headers[b.index], dst=owner, tag=0))
            reqs.append(dist.isend(grads[b.index], dst=owner, tag=b.index + 1))
            reqs.append(dist.irecv(pulled[b.index], src=owner, tag=b.index + 1))
        for r in reqs:
            r.wait()
        if step >= warmup:
            times.append(time.perf_counter() - t0)
    return times


def run_async(backend, info, plan, cfg, device: str, watchdog) -> dict:
    dist = _require_gloo(device)
    rank, world = info.rank, info.world_size
    servers = servers_for("async-ps", cfg, world)
    workers = list(range(servers, world))
    steps = cfg.warmup_iters + cfg.iters
    dt = DTYPES[cfg.dtype]
    # Every push of every step is summed into the result, so the data range covers all of them.
    divisor = grad_divisor(len(workers) * steps, cfg.optimizer)
    ledger = StalenessLedger()
    # Each rank ends holding the whole result: servers their own buckets, pulled copies of the rest.
    result = [torch.zeros(b.numel, dtype=dt.torch, device=device) for b in plan.buckets]
    times: list[float] = []
    backend.barrier()
    if rank < servers:
        state = {}
        for b in plan.buckets:
            if b.index % servers == rank:
                if cfg.optimizer:
                    fill_weights(result[b.index], b.offset, dt)
                state[b.index] = result[b.index]
        watchdog.step("serving async-ps pushes")
        serve(dist, plan, state, workers, steps, cfg.optimizer, ledger, watchdog, rank, servers)
    else:
        grads = [torch.empty(b.numel, dtype=dt.torch, device=device) for b in plan.buckets]
        for b in plan.buckets:
            fill_grad(grads[b.index], rank, b.offset, dt, divisor)
        times = work(dist, plan, grads, result, servers, steps, cfg.warmup_iters, rank, watchdog)
    watchdog.step("async-ps final pull")
    backend.synchronize()
    backend.barrier()
    for b in plan.buckets:  # the final synchronous pull: everyone gets the servers' values
        backend.broadcast(result[b.index], result[b.index], b.index % servers)
    backend.synchronize()
    watchdog.step("checking async-ps")
    meter = check_slice(result, plan, rank, world, lambda s, c: reference(
        workers, s, c, dt, divisor, cfg.optimizer, repeats=steps))
    is_worker = rank >= servers
    padded = times if is_worker else [0.0] * cfg.iters
    out, extras = finish(backend, rank, world, [], meter, result,
                         extra=[float(is_worker), *ledger.summary(), *padded])
    out.update(summarize([e[4:] for e in extras if e[0] == 1.0]))
    st_sum = sum(e[1] for e in extras)
    pushes = int(sum(e[3] for e in extras))
    out.update(strategy="async-ps", servers=servers, workers=len(workers),
               calls_per_step=2 * len(plan.buckets), pushes=pushes,
               staleness_mean=st_sum / pushes if pushes else 0.0,
               staleness_max=max(e[2] for e in extras),
               expected_pushes=len(workers) * steps * len(plan.buckets))
    return out
