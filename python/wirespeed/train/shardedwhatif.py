"""`train --what-if-only`: a sharded data-parallel step (FSDP2, ZeRO-3) of a network too large to
run here, on GPUs and links it names, from the network's parameter shapes alone; nothing trains.

What it assumes (each printed in its header, docs/train.md "--what-if-only"):
- **The units**: FSDP2's, as `train` shards (train/nets.blocks_of): each block, and the root
  (what no block holds: a GPT's embeddings, final norm and head). The network is built on torch's
  meta device, so only its shapes exist.
- **The traffic**: per step, each unit's parameters all_gathered in the forward pass and again in
  the backward pass (reshard_after_forward, FSDP2's default and ZeRO-3's; once with
  --no-reshard-after-forward; the root once: FSDP2
  keeps the root's parameters gathered from its forward through its backward), at 2 bytes a parameter (bf16,
  what a GPU run gathers), and its gradients reduce_scattered after its backward, at 2 bytes
  (--reduce-dtype bf16) or 4.
- **The time of a call**: the bandwidth-optimal bound, latency left out (a few-billion-parameter
  network's calls are tens to hundreds of MB): the larger of the host link's share, (H-1)/H x S at
  the what-if rate (all of a host's NICs together; what train's wire bound uses), and each GPU's
  own intake, (N-1)/N x S at its NVLink rate (NVLINK_GBS: one direction, per GPU; V100 150, A100
  300, H100 450 GB/s, the NVLink 2, 3 and 4 figures).
- **The compute**: --what-if-gpu's (train/gpuflops: 6 x parameters x tokens at the peak x MFU),
  split among the units by their parameters (a GPT's FLOPs are its matrix products, as parameters),
  a third forward and two thirds backward.
- **The overlap** (simulate): one link, its calls in issue order, and one compute stream. A
  block's forward waits for its gather; the next block's gather is issued when a block starts
  computing (FSDP2's one-ahead prefetch), as in the backward pass, where a block's reduce_scatter
  is issued when its backward ends. The step ends with the root's reduce_scatter; exposed =
  (step - compute) / step. The optimizer step is left out.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import UsageError
from ..explain.costs import busbw_factor
from .whatif import rate_below

# GB/s one way per GPU: NVLink 2 (V100), 3 (A100), 4 (H100): the vendors' per-GPU totals halved.
NVLINK_GBS = {"V100": 150.0, "A100": 300.0, "H100": 450.0}
GATHER_BYTES = 2   # bf16 parameters, as a GPU run gathers them
DEFAULT_RATES = "100gbit,200gbit,400gbit,800gbit"


@dataclass(frozen=True)
class Layout:
    hosts: int
    per_host: int
    rate_bps: float          # each host's link, bits per second
    nvlink_bytes_s: float    # each GPU's intake from its host's other GPUs

    @property
    def world(self) -> int:
        return self.hosts * self.per_host


def unit_params(spec) -> tuple[list[int], int]:
    """(parameters of each FSDP block in forward order, the root's: what no block holds)."""
    import torch
    from .nets import blocks_of, build
    with torch.device("meta"):
        net = build(spec, "meta")
    blocks = [sum(p.numel() for p in b.parameters()) for b in blocks_of(net, spec)]
    return blocks, sum(p.numel() for p in net.parameters()) - sum(blocks)


def call_us(collective: str, nbytes: float, lay: Layout) -> float:
    """The bandwidth-optimal time of one call of nbytes (the whole, unsharded size), in us."""
    inter = busbw_factor(collective, lay.hosts) * nbytes * 8 / lay.rate_bps if lay.hosts > 1 else 0.0
    intra = busbw_factor(collective, lay.world) * nbytes / lay.nvlink_bytes_s if lay.per_host > 1 else 0.0
    return max(inter, intra) * 1e6


def simulate(blocks: list[int], root: int, compute_us: float, lay: Layout, reduce_bytes: int,
             reshard: bool = True) -> dict:
    """One step as the module docstring says: step, link-busy and exposed figures, in us. Without
    `reshard` (--no-reshard-after-forward) every block stays gathered from its forward through its
    backward, as the root does: no gathers in the backward pass."""
    total = sum(blocks) + root
    fwd = [compute_us / 3 * n / total for n in blocks]
    root_fwd = compute_us / 3 * root / total
    link, busy = [0.0], [0.0]   # when the link is next free; how long it carried calls

    def send(coll: str, params: int, nbytes_each: int, issued: float) -> float:
        start = max(issued, link[0])
        took = call_us(coll, params * nbytes_each, lay)
        link[0] = start + took
        busy[0] += took
        return link[0]

    k = len(blocks)
    # forward: the root's gather, then block 0's (both issued at the start); block i+1's when
    # block i starts computing; the root's own compute (a GPT's head) after the last block
    root_ready = send("all_gather", root, GATHER_BYTES, 0.0)
    ready = send("all_gather", blocks[0], GATHER_BYTES, 0.0) if k else root_ready
    t = root_ready
    for i in range(k):
        start = max(t, ready)
        if i + 1 < k:
            ready = send("all_gather", blocks[i + 1], GATHER_BYTES, start)
        t = start + fwd[i]
    t += root_fwd
    # backward: the root's (kept gathered) first, while the last block's gather goes out; block i
    # issues block i-1's gather when it starts and its own reduce_scatter when it ends; the root's
    # reduce_scatter last, when its embedding's gradients are done after block 0
    ready = send("all_gather", blocks[-1], GATHER_BYTES, t) if k and reshard else t
    t += 2 * root_fwd
    end = t
    for i in range(k - 1, -1, -1):
        start = max(t, ready)
        if i and reshard:
            ready = send("all_gather", blocks[i - 1], GATHER_BYTES, start)
        t = start + 2 * fwd[i]
        end = send("reduce_scatter", blocks[i], reduce_bytes, t)
    end = send("reduce_scatter", root, reduce_bytes, t)
    step = max(t, end)
    return {"step_us": step, "compute_us": compute_us, "link_busy_us": busy[0],
            "exposed_pct": 100.0 * (step - compute_us) / step if step > 0 else 0.0}


def network_bound_below(blocks: list[int], root: int, compute_us: float, lay: Layout, reduce_bytes: int,
                        reshard: bool = True) -> float:
    """The host link rate (bit/s) below which exposed communication passes NETWORK_BOUND_SHARE of
    the step (whatif.rate_below, up to 1 Pbit/s); inf when no rate keeps it under (NVLink, or the
    first and last calls no compute can hide, alone pass it), 0 when even 100 kbit/s does. Needs 2
    hosts or more: one host has no link to price."""
    def exposed(rate):
        return simulate(blocks, root, compute_us, Layout(lay.hosts, lay.per_host, rate, lay.nvlink_bytes_s),
                        reduce_bytes, reshard)["exposed_pct"] / 100
    return rate_below(exposed, hi=1e15)


def run(cfg, gpu: tuple, hosts: int, per_host: int, rates: list[int]) -> str:
    """The what-if's text: assumptions, then one line per link rate, then the network-bound rate."""
    from .gpuflops import gpu_step_us, step_flops
    if cfg.parallel != "fsdp":
        raise UsageError("--what-if-only models a sharded step (FSDP2, ZeRO-3): add --parallel fsdp")
    if hosts < 2:
        raise UsageError("--what-if-only prices the links between hosts: give --what-if-hosts 2 or more")
    name, peak, mfu = gpu
    nvlink = NVLINK_GBS.get(name)
    if nvlink is None:
        raise UsageError(f"--what-if-only needs the GPU's NVLink rate: choose --what-if-gpu "
                         f"{', '.join(NVLINK_GBS)}")
    blocks, root = unit_params(cfg.spec)
    params = sum(blocks) + root
    compute = gpu_step_us(step_flops(cfg.spec, params), peak, mfu)
    reduce_bytes = 2 if cfg.reduce_dtype == "bf16" else 4
    reshard = cfg.reshard_after_forward
    gathered = sum(blocks) * (2 if reshard else 1) + root   # the backward's gathers only with resharding
    per_step = gathered * GATHER_BYTES + params * reduce_bytes
    lines = [f"# what-if only (nothing trained): {cfg.spec.describe()}, {params / 1e9:.3g} B parameters "
             f"in {len(blocks) + (1 if root else 0)} FSDP units, FSDP2 ({'ZeRO-3' if reshard else 'no resharding after forward'}) on {hosts} hosts x {per_host} {name} = "
             f"{hosts * per_host} GPUs",
             f"# compute {compute / 1e3:.1f} ms a step ({name} {peak:g} TFLOPS x MFU {mfu:g}, "
             f"6 x parameters x tokens); gathers in bf16, gradients reduced in "
             f"{'bf16' if reduce_bytes == 2 else 'fp32'}: {per_step / 1e9:.3g} GB of calls a step; each "
             f"call at its bandwidth bound, latency left out; intra-host {nvlink:g} GB/s a GPU (NVLink)",
             f"{'link':>10} {'step ms':>9} {'compute ms':>11} {'link busy ms':>13} {'exposed':>8}"]
    for rate in rates:
        lay = Layout(hosts, per_host, float(rate), nvlink * 1e9)
        r = simulate(blocks, root, compute, lay, reduce_bytes, reshard)
        lines.append(f"{rate / 1e9:>5.4g} Gb/s {r['step_us'] / 1e3:>9.1f} {r['compute_us'] / 1e3:>11.1f} "
                     f"{r['link_busy_us'] / 1e3:>13.1f} {r['exposed_pct']:>7.0f}%")
    bound = network_bound_below(blocks, root, compute, Layout(hosts, per_host, 1e9, nvlink * 1e9), reduce_bytes,
                                reshard)
    lines.append("# network-bound (exposed above 10% of the step) below "
                 + ("every rate: NVLink, or the first and last calls no compute hides, alone pass 10%" if math.isinf(bound)
                    else "no rate: even 100 kbit/s keeps it under" if bound == 0
                    else f"{bound / 1e9:.0f} Gbit/s per host" if bound >= 1e11 else f"{bound / 1e9:.3g} Gbit/s per host"))
    return "\n".join(lines)
