"""The knobs of the parallel wrappers `wirespeed train` exposes as flags, so that every candidate
`train --tune` tries is also a plain run: DDP's communication hooks (torch's own, nothing of ours),
and what each flag does to the wrapper's arguments.

A comm hook replaces DDP's built-in all_reduce of each bucket:
- fp16 / bf16: torch's fp16_compress_hook / bf16_compress_hook: each bucket cast to 16 bits,
  divided by the world size, summed, cast back. Half the bytes; gradients rounded to 11 (fp16) or
  8 (bf16) significant bits: COMPRESSION, which changes training (a little).
- powersgd:R: torch's powerSGD_hook with a PowerSGDState of matrix_approximation_rank R: each
  gradient matrix sent as two rank-R factors (and the rounding error fed back into the next
  step). Far fewer bytes, a low-rank gradient: COMPRESSION, which changes training (rank 1
  visibly). Its warm-up: the first start_powerSGD_iter steps all_reduce plainly (torch's
  advice; 2 is the least it allows with error feedback), here POWERSGD_WARMUP.
"""
from __future__ import annotations

from ..errors import UsageError

HOOKS = ("none", "fp16", "bf16", "powersgd:RANK")
POWERSGD_WARMUP = 2
REDUCE_DTYPES = ("fp32", "bf16")


def parse_comm_hook(text: str) -> str:
    """The hook's canonical name, or a one-line UsageError."""
    t = str(text).strip().lower()
    if t in ("none", "fp16", "bf16"):
        return t
    if t.startswith("powersgd:"):
        rank = t.split(":", 1)[1]
        if rank.isdecimal() and 1 <= int(rank) <= 1024:
            return f"powersgd:{int(rank)}"
        raise UsageError(f"--comm-hook {text}: PowerSGD's rank must be a whole number from 1 to "
                         "1024 (powersgd:1, powersgd:4)")
    raise UsageError(f"--comm-hook {text}: choose from {', '.join(HOOKS)}")


MAX_THREADS = 4096
MAX_PREFETCH = 64


def check_options(cfg) -> None:
    """A one-line UsageError for an option out of its bounds or of the other wrapper than
    cfg.parallel's: the flags' and every --candidates entry's one check."""
    if cfg.threads > MAX_THREADS:
        raise UsageError(f"--threads {cfg.threads}: at most {MAX_THREADS}")
    if cfg.prefetch > MAX_PREFETCH:
        raise UsageError(f"--prefetch {cfg.prefetch}: at most {MAX_PREFETCH} blocks")
    ddp_only = [f for f, on in (("--comm-hook", cfg.comm_hook != "none"),
                                ("--grad-as-bucket-view", cfg.grad_as_bucket_view),
                                ("--static-graph", cfg.static_graph)) if on]
    fsdp_only = [f for f, on in (("--no-reshard-after-forward", not cfg.reshard_after_forward),
                                 ("--prefetch", cfg.prefetch > 0),
                                 ("--reduce-dtype", cfg.reduce_dtype != "fp32")) if on]
    if cfg.reduce_dtype not in REDUCE_DTYPES:
        raise UsageError(f"--reduce-dtype {cfg.reduce_dtype}: choose fp32 or bf16")
    if cfg.parallel == "fsdp" and ddp_only:
        raise UsageError(f"{ddp_only[0]} is a DDP option; --parallel fsdp has no buckets to hook")
    if cfg.parallel == "ddp" and fsdp_only:
        raise UsageError(f"{fsdp_only[0]} is an FSDP2 option: add --parallel fsdp")


def compresses(hook: str) -> bool:
    return hook != "none"


def describe_hook(hook: str) -> str:
    """How a recommendation names the hook: compression always said as such."""
    if hook in ("fp16", "bf16"):
        return f"{hook} gradient compression (DDP comm hook {hook}_compress_hook)"
    if hook.startswith("powersgd:"):
        return (f"PowerSGD gradient compression at rank {hook.split(':')[1]} (DDP comm hook "
                "powerSGD_hook; a low-rank gradient)")
    return "no comm hook"


def make_hook(hook: str, group=None):
    """(state, hook function) for DDP.register_comm_hook; None for "none"."""
    if hook == "none":
        return None
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
    if hook == "fp16":
        return group, default_hooks.fp16_compress_hook
    if hook == "bf16":
        return group, default_hooks.bf16_compress_hook
    rank = int(hook.split(":")[1])
    state = powerSGD_hook.PowerSGDState(process_group=group, matrix_approximation_rank=rank,
                                        start_powerSGD_iter=POWERSGD_WARMUP, random_seed=0)
    return InOrder(state, powerSGD_hook.powerSGD_hook), InOrder.run


class InOrder:
    """A hook run for one bucket at a time, in DDP's bucket order. PowerSGD issues its second
    all_reduce (of Q) from the first one's completion callback; on the CPU a callback runs when
    the work completes, so with several buckets two ranks may issue the calls of different
    buckets in different orders (gloo aborted: "Received data size doesn't match expected size",
    resnet18 at 32 px, 2 buckets). Starting each bucket's hook only once the previous bucket's is
    done keeps the order the same on every rank; the backward pass is not held up (the hook
    returns at once), only the buckets' communication is kept in a line."""

    def __init__(self, state, hook):
        self.state, self.hook = state, hook
        self.prev = None

    @staticmethod
    def run(self: "InOrder", bucket):
        import torch
        out = torch.futures.Future()

        def start(_=None):
            try:
                self.hook(self.state, bucket).add_done_callback(finish)
            except Exception as e:   # noqa: BLE001 - handed to DDP through the future
                out.set_exception(e)

        def finish(f):
            try:
                out.set_result(f.value())
            except Exception as e:   # noqa: BLE001
                out.set_exception(e)
        prev, self.prev = self.prev, out
        if prev is None:
            start()
        else:
            prev.add_done_callback(start)
        return out


def paste_lines(cfg) -> list[str]:
    """The Python lines that set this configuration up in a user's own script."""
    if cfg.parallel == "ddp":
        args = [f"bucket_cap_mb={cfg.bucket_mb:g}"]
        if cfg.grad_as_bucket_view:
            args.append("gradient_as_bucket_view=True")
        if cfg.static_graph:
            args.append("static_graph=True")
        lines = [f"model = DistributedDataParallel(model, {', '.join(args)})"]
        if cfg.comm_hook in ("fp16", "bf16"):
            lines += ["from torch.distributed.algorithms.ddp_comm_hooks import default_hooks",
                      f"model.register_comm_hook(None, default_hooks.{cfg.comm_hook}_compress_hook)"
                      f"   # {cfg.comm_hook} gradient COMPRESSION"]
        elif cfg.comm_hook.startswith("powersgd:"):
            lines += ["from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd",
                      f"state = psgd.PowerSGDState(process_group=None, matrix_approximation_rank="
                      f"{cfg.comm_hook.split(':')[1]}, start_powerSGD_iter={POWERSGD_WARMUP})",
                      "model.register_comm_hook(state, psgd.powerSGD_hook)   # PowerSGD gradient "
                      "COMPRESSION"]
    else:
        args = [] if cfg.reshard_after_forward else ["reshard_after_forward=False"]
        if cfg.reduce_dtype == "bf16":
            args.append("mp_policy=MixedPrecisionPolicy(reduce_dtype=torch.bfloat16)")
        note = "   # each block, then the model" + \
            ("; bf16 gradient-reduction COMPRESSION" if cfg.reduce_dtype == "bf16" else "")
        lines = [f"fully_shard(block{''.join(', ' + a for a in args)}){note}"]
        if cfg.prefetch:   # as train/rank.py does it, on the blocks in their forward order
            p = cfg.prefetch
            lines += ["for i, block in enumerate(blocks):   # the fully_shard blocks, in forward order",
                      f"    ahead, behind = blocks[i + 1:i + {p + 1}], blocks[max(0, i - {p}):i][::-1]",
                      "    if ahead: block.set_modules_to_forward_prefetch(ahead)",
                      "    if behind: block.set_modules_to_backward_prefetch(behind)"]
    if cfg.threads:
        lines.append(f"torch.set_num_threads({cfg.threads})   # in each rank")
    return lines


def config_flags(cfg, base) -> list[str]:
    """The `wirespeed train` flags that turn `base` into `cfg` (the options above only)."""
    out = []
    if cfg.bucket_mb != base.bucket_mb:
        out += ["--bucket-mb", f"{cfg.bucket_mb:g}"]
    if cfg.comm_hook != base.comm_hook:
        out += ["--comm-hook", cfg.comm_hook]
    if cfg.threads != base.threads:
        out += ["--threads", str(cfg.threads)]
    if cfg.grad_as_bucket_view and not base.grad_as_bucket_view:
        out.append("--grad-as-bucket-view")
    if cfg.static_graph and not base.static_graph:
        out.append("--static-graph")
    if cfg.reshard_after_forward != base.reshard_after_forward:
        out.append("--reshard-after-forward" if cfg.reshard_after_forward else "--no-reshard-after-forward")
    if cfg.prefetch != base.prefetch:
        out += ["--prefetch", str(cfg.prefetch)]
    if cfg.reduce_dtype != base.reduce_dtype:
        out += ["--reduce-dtype", cfg.reduce_dtype]
    return out


def option_argv(cfg) -> list[str]:
    """Every option above as flags, explicit (what the shell forwards to its children)."""
    out = ["--comm-hook", cfg.comm_hook, "--threads", str(cfg.threads), "--prefetch", str(cfg.prefetch),
           "--reduce-dtype", cfg.reduce_dtype,
           "--reshard-after-forward" if cfg.reshard_after_forward else "--no-reshard-after-forward"]
    if cfg.grad_as_bucket_view:
        out.append("--grad-as-bucket-view")
    if cfg.static_graph:
        out.append("--static-graph")
    return out
