"""One rank's run of `wirespeed train`: real training steps of a real network on random data under
DDP or FSDP2, timed; the same steps with the communication taken out (compute); bytes handed to
the collectives; and a digest of the model state every rank must share (docs/train.md).

Order on every rank: warm-up steps, then timed steps, each followed by its compute step (the
same step on a twin of the network that never communicates, see _compute_twin), then the
state's digest. Rank 0 keeps copies of the full parameters after the first steps and the last,
for the comparison across backends. A step's time is the slowest rank's
(bench/harness.summarize), the figure its median.
"""
from __future__ import annotations

import hashlib
import sys
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import torch

from ..bench.harness import summarize
from ..errors import RanksDisagree, UsageError
from ..report.records import record
from .whatif import COLLECTIVE_OF, WHATIF_ITERS, WhatIf
from .hooks import make_hook
from .nets import NetSpec, batch, blocks_of, build, loss_of

PARALLEL = ("ddp", "fsdp")
# Steps after which rank 0 keeps the parameters for the comparison across backends: the first,
# and the second, DDP's first with the buckets it rebuilds after the first.
EARLY_STEPS = 2
OPTIMIZERS = ("sgd", "adamw")
LR = {"sgd": 0.01, "adamw": 1e-4}   # small: a few steps must not blow a random network up


@dataclass
class TrainConfig:
    spec: NetSpec
    parallel: str = "ddp"
    bucket_mb: float = 25.0
    optimizer: str = "sgd"
    backend: str = "gloo"
    device: str = "cpu"
    nproc: int = 2
    warmup_iters: int = 2
    iters: int = 10
    timeout_s: float = 300.0
    # After the timed steps, bench the step's own collectives (for the what-if): calls per size.
    whatif_iters: int = 0
    # DDP: time each step's buckets through a comm hook (train/timeline.py).
    timeline: bool = False
    # The wrappers' options (train/hooks.py), each a flag, so every --tune candidate is a plain run.
    comm_hook: str = "none"              # ddp: none, fp16, bf16, powersgd:R
    threads: int = 0                     # torch.set_num_threads in each rank; 0: as started
    grad_as_bucket_view: bool = False    # ddp
    static_graph: bool = False           # ddp
    reshard_after_forward: bool = True   # fsdp
    prefetch: int = 0                    # fsdp: blocks prefetched explicitly each way; 0: FSDP2's own
    reduce_dtype: str = "fp32"           # fsdp: fp32 or bf16 (MixedPrecisionPolicy.reduce_dtype)
    trace: str | None = None             # --trace: rank 0 writes the ranks' timelines here
    # A --tune candidate's run (train/search.py, in-run pruning): after prune_after timed steps,
    # stop when the job's samples/s over them is below prune_below (0: never).
    prune_below: float = 0.0
    prune_after: int = 0


def gpt_blocks_bytes(spec) -> int:
    """The float32 weights and gradients of gpt's blocks alone (nets._Block: qkv 3h^2, proj h^2,
    up and down 4h^2 each: 12h^2 a block), from the flags, building nothing; 0 for other networks."""
    return spec.layers * 12 * spec.hidden ** 2 * 4 * 2 if spec.model == "gpt" else 0


def rank_bytes(cfg: TrainConfig) -> int:
    """An estimate of the memory one rank's training takes, from the network built on torch's
    meta device (nothing allocated): the parameters and gradients of the network and of its
    compute twin, DDP's buckets (a copy of the gradients, twice), AdamW's two moments (twice),
    rank 0's copies of the parameters for the comparison (three), and the activations autograd
    keeps, as the outputs of every leaf module in one forward pass. Buffers inside kernels and
    the allocator's slack are not counted, so this is a floor: a run it refuses cannot fit."""
    with torch.device("meta"):
        net = build(cfg.spec, "meta")
        params = sum(p.numel() * p.element_size() for p in net.parameters())
        outputs = [0]

        def count(_m, _i, out):
            for t in (out if isinstance(out, (tuple, list)) else (out,)):
                if isinstance(t, torch.Tensor):
                    outputs[0] += t.numel() * t.element_size()
        # An in-place module (ReLU(inplace=True)) writes over its input: nothing new to keep.
        hooks = [m.register_forward_hook(count) for m in net.modules()
                 if not list(m.children()) and not getattr(m, "inplace", False)]
        try:
            spec = cfg.spec
            net(torch.zeros(spec.batch_size, spec.seq_len, dtype=torch.long) if spec.model == "gpt"
                else torch.empty(spec.batch_size, 3, spec.image_size, spec.image_size))
        except (RuntimeError, NotImplementedError):   # an op without a meta kernel: count none
            outputs[0] = 0
        finally:
            for h in hooks:
                h.remove()
    copies = 2 * 2 + (2 if cfg.parallel == "ddp" else 0) + (4 if cfg.optimizer == "adamw" else 0) + 3
    return params * copies + outputs[0]


def fsdp_missing() -> str | None:
    """None when FSDP2 (`fully_shard`) exists in this torch, else why not."""
    import torch.distributed.fsdp as fsdp
    if not hasattr(fsdp, "fully_shard"):
        return f"torch {torch.__version__} has no FSDP2 (torch.distributed.fsdp.fully_shard; torch >= 2.6)"
    return None


# torch.distributed calls that FSDP2 (and anything else in Python) makes, counted by wrapping.
# The figure is each call's full buffer, its largest tensor: an all_gather's output, a
# reduce_scatter's input, an all_reduce's tensor (the size nccl-tests and `bench` label a call
# with). DDP's reducer calls the process group from C++, past these wrappers: its bytes are its
# buckets', every gradient once per step.
_COUNTED = ("all_gather_single", "all_gather_into_tensor", "reduce_scatter_single",
            "reduce_scatter_tensor", "all_reduce", "broadcast")


class CallCounter:
    def __init__(self):
        self.bytes = 0
        self.calls = 0
        self.on = True
        self.log: list[tuple[str, int]] | None = None   # (collective, bytes) of each call, when a list
        self.timeline = None   # FSDP2 under --trace: each call's span goes to it (train/timeline.py)

    @contextmanager
    def paused(self):
        self.on = False
        try:
            yield
        finally:
            self.on = True

    @contextmanager
    def installed(self):
        import torch.distributed as dist
        saved = {n: getattr(dist, n) for n in _COUNTED if hasattr(dist, n)}
        for name, fn in saved.items():
            setattr(dist, name, self._wrap(name, fn))
        try:
            yield self
        finally:
            for name, fn in saved.items():
                setattr(dist, name, fn)

    def _wrap(self, name: str, fn):
        def counted(*args, **kw):
            sizes = [t.numel() * t.element_size() for t in (*args, *kw.values())
                     if isinstance(t, torch.Tensor)]
            counts = bool(sizes) and self.on
            if counts:
                nbytes = max(sizes)
                self.bytes += nbytes
                self.calls += 1
                if self.log is not None:
                    self.log.append((COLLECTIVE_OF[name], nbytes))
            start = time.perf_counter()
            out = fn(*args, **kw)
            if counts and self.timeline is not None:
                self.timeline.collective(COLLECTIVE_OF[name], nbytes, start, out)
            return out
        return counted


def _optimizer(cfg: TrainConfig, params):
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=LR["adamw"])
    return torch.optim.SGD(params, lr=LR["sgd"])


def wrap(cfg: TrainConfig, net, device: str):
    """The network under its parallel wrapper; (model, DDP's all_reduces per step as (collective,
    bytes): every gradient once, in buckets planned as DDP plans them, workloads/bucketing.py)."""
    grads = [p for p in net.parameters() if p.requires_grad]
    if cfg.parallel == "ddp":
        from ..workloads.bucketing import plan_buckets
        itemsize = grads[0].element_size() if grads else 4
        plan = plan_buckets([p.numel() for p in grads], itemsize,
                            "ddp", int(cfg.bucket_mb * (1 << 20)))
        from torch.nn.parallel import DistributedDataParallel as DDP
        # No buffer sync in the forward pass (BatchNorm's running statistics stay each rank's):
        # no_sync then leaves no communication at all in the compute step, and the digest
        # covers the parameters, which DDP keeps equal. Newer torch names the switch
        # forward_sync_buffers and deprecates broadcast_buffers.
        import inspect
        no_buffer_sync = {"forward_sync_buffers": False} \
            if "forward_sync_buffers" in inspect.signature(DDP).parameters else {"broadcast_buffers": False}
        ids = [torch.device(device)] if device.startswith("cuda") else None
        return (DDP(net, device_ids=ids, bucket_cap_mb=cfg.bucket_mb,
                    gradient_as_bucket_view=cfg.grad_as_bucket_view, static_graph=cfg.static_graph,
                    **no_buffer_sync),
                [("all_reduce", b.numel * itemsize) for b in plan.buckets])
    why = fsdp_missing()
    if why:
        raise UsageError(f"--parallel fsdp: {why}")
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    opts = {"reshard_after_forward": cfg.reshard_after_forward}
    if cfg.reduce_dtype == "bf16":
        opts["mp_policy"] = MixedPrecisionPolicy(reduce_dtype=torch.bfloat16)
    blocks = list(blocks_of(net, cfg.spec))
    for blk in blocks:
        fully_shard(blk, **opts)
    fully_shard(net, **opts)
    if cfg.prefetch:   # each block gathers the next (forward) or previous (backward) ones early
        for i, blk in enumerate(blocks):
            ahead = blocks[i + 1:i + 1 + cfg.prefetch]
            behind = blocks[max(0, i - cfg.prefetch):i][::-1]
            if ahead:
                blk.set_modules_to_forward_prefetch(ahead)
            if behind:
                blk.set_modules_to_backward_prefetch(behind)
    return net, []


def full_params(model) -> list[torch.Tensor]:
    """A copy of every parameter whole, in order, on the CPU (FSDP's shards gathered: a collective,
    so every rank calls it)."""
    out = []
    for p in model.parameters():
        t = p.detach()
        if hasattr(t, "full_tensor"):
            t = t.full_tensor()
        # A copy: the compute steps that follow change the live parameters in place.
        out.append(t.float().cpu().reshape(-1).clone())
    return out


def state_digest(params: list[torch.Tensor]) -> str:
    h = hashlib.sha256()
    for t in params:
        h.update(t.contiguous().numpy().tobytes())
    return h.hexdigest()


def check_digests(digests: list[float], steps: int) -> None:
    """Every rank's state digest (48 bits of it) must be rank 0's: else a RanksDisagree (exit 5)
    naming the ranks that differ, raised on every rank alike."""
    differ = [r for r, d in enumerate(digests) if d != digests[0]]
    if differ:
        raise RanksDisagree(f"the model state after {steps} timed steps differs from rank 0's on "
                            f"rank{'s' if len(differ) > 1 else ''} {', '.join(map(str, differ))}")


def _timed(run_step, sync) -> float:
    t0 = time.perf_counter()
    run_step()
    sync()
    return time.perf_counter() - t0


def steps_rate(per_rank_times_s: list[list[float]], batch_size: int) -> float:
    """The job's samples/s over the steps given (per rank, each step's seconds), by the statistic
    the record's samples_per_s uses: the median over steps of the slowest rank's time."""
    step_s = summarize(per_rank_times_s)["time_us"] * 1e-6
    return batch_size * len(per_rank_times_s) / step_s if step_s > 0 else float("inf")


def _slower_than_asked(cfg: TrainConfig, times: list[float], backend, counter) -> dict | None:
    """After cfg.prune_after timed steps: the job's samples/s over them (a collective, so every rank
    calls it and every rank decides alike), and when it is below cfg.prune_below, what the record's
    `pruned` says; None to go on."""
    with counter.paused():   # the gather is not the step's traffic
        rate = steps_rate(backend.allgather_floats(times), cfg.spec.batch_size)
    if rate >= cfg.prune_below:
        return None
    return {"after_steps": len(times), "samples_per_s": rate, "below": cfg.prune_below}


def _compute_twin(cfg: TrainConfig, spec: NetSpec, device: str, inputs, targets):
    """The compute step: the same step on a twin of the network that never communicates, so it
    can run between the timed steps without touching the model they train.
    - DDP: a second DDP over a copy, stepped under `no_sync()` (its hooks run, its all_reduces
      do not; building it broadcasts once, before any timing);
    - FSDP: an unsharded copy, no process group: the step at world size 1."""
    twin = build(spec, device)
    if cfg.parallel == "ddp":
        # static_graph's reducer expects every step to sync (no_sync trips its assertion): the
        # twin never syncs, so it has no use for it.
        from dataclasses import replace
        twin, _ = wrap(replace(cfg, static_graph=False), twin, device)
        ctx = twin.no_sync
    else:
        ctx = nullcontext
    twin_opt = _optimizer(cfg, twin.parameters())

    def compute_step():
        twin_opt.zero_grad(set_to_none=True)
        with ctx():
            loss_of(twin, spec, inputs, targets).backward()
        twin_opt.step()
    return compute_step


def run_rank(cfg: TrainConfig, info, backend, device: str, watchdog) -> dict:
    """Train on this rank; returns the job's figures (the same on every rank) and, on rank 0, the
    full parameters after the first steps and the last (`params`) for the comparison across
    backends."""
    spec = cfg.spec
    rank = info.rank
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    watchdog.step("building the network")
    net = build(spec, device)
    inputs, targets = batch(spec, rank, device)
    counter = CallCounter()
    with counter.installed():
        watchdog.step(f"wrapping the network in {cfg.parallel}")
        model, ddp_calls = wrap(cfg, net, device)
        hook = make_hook(cfg.comm_hook) if cfg.parallel == "ddp" else None
        if hook is not None:
            # The hook's own all_reduces go through torch.distributed's Python functions, which
            # the counter sees: its bytes are counted as they go, not from DDP's plan.
            ddp_calls = []
        opt = _optimizer(cfg, model.parameters())
        timeline = None
        if cfg.timeline or cfg.trace:   # FSDP2 (--trace): the step's marks and its collectives
            from .timeline import CommTimeline
            timeline = CommTimeline(info.world_size, inner=hook)
            if cfg.parallel == "ddp":
                timeline.register(model)
            else:
                counter.timeline = timeline
        elif hook is not None:
            model.register_comm_hook(*hook)
        losses: list[torch.Tensor] = []

        def step():
            opt.zero_grad(set_to_none=True)
            loss = loss_of(model, spec, inputs, targets)
            if timeline is not None:
                timeline.forward_done()
            loss.backward()
            if timeline is not None:
                timeline.backward_done()
            opt.step()
            if timeline is not None:
                timeline.optimizer_done()
            losses.append(loss.detach())

        early: list[torch.Tensor] = []
        steps_done = [0]

        def snapshot():
            """Rank 0's copy of the parameters after each of the first EARLY_STEPS steps (FSDP
            gathers them: every rank takes part, so every rank counts the steps), for the
            comparison across backends."""
            steps_done[0] += 1
            if steps_done[0] <= EARLY_STEPS:
                with counter.paused():
                    p = full_params(model)
                if rank == 0:
                    early.append(torch.cat(p))

        compute_step = _compute_twin(cfg, spec, device, inputs, targets)
        for i in range(cfg.warmup_iters):
            watchdog.step(f"warm-up step {i + 1} of {cfg.warmup_iters}")
            step()
            snapshot()
            compute_step()
        backend.synchronize()
        backend.barrier()
        counter.bytes = counter.calls = 0
        # A timed step, then its compute step, in turn: drift of a busy machine reaches both alike.
        times, compute = [], []
        pruned = None
        for i in range(cfg.iters):
            watchdog.step(f"timed step {i + 1} of {cfg.iters}")
            counter.log = [] if i == 0 else None   # the calls of one step, for the bounds
            if timeline is not None:
                timeline.begin()
            times.append(_timed(step, backend.synchronize))
            if timeline is not None:
                timeline.end()
            if i == 0:
                calls = ddp_calls + counter.log
            snapshot()
            watchdog.step(f"compute step {i + 1} of {cfg.iters}")
            compute.append(_timed(compute_step, backend.synchronize))
            if cfg.prune_below and i + 1 == cfg.prune_after < cfg.iters:
                watchdog.step(f"judging the first {i + 1} timed steps' speed")
                pruned = _slower_than_asked(cfg, times, backend, counter)
                if pruned:
                    break
        n = len(times)   # cfg.iters, or fewer when pruned
        bytes_per_step = sum(b for _, b in ddp_calls) + counter.bytes / n
        calls_per_step = len(ddp_calls) + counter.calls / n
        watchdog.step("gathering the model state")
        params = full_params(model)
    digest = state_digest(params)
    trace = None
    if cfg.trace:
        from .tracing import gather
        watchdog.step("gathering the trace")
        trace = gather(timeline, backend, rank)

    watchdog.step("gathering the figures")
    h = float(int(digest[:12], 16))   # 48 bits: exact in a float64
    marks = timeline.median_step() if cfg.timeline else []
    # Each step's loss (warm-up steps included), this rank's batch: the job's is the ranks' mean.
    mine = [float(x) for x in losses]
    rows = backend.allgather_floats([h, bytes_per_step, *times, *compute, *marks, *mine])
    check_digests([row[0] for row in rows], n)
    step_s = summarize([row[2:2 + n] for row in rows])
    compute_s = summarize([row[2 + n:2 + 2 * n] for row in rows])
    out = {"step": step_s, "compute": compute_s, "state_digest": digest,
           # each timed step's slowest rank, in order (--tune judges a run's first steps by them)
           "steps_us": [max(col) * 1e6 for col in zip(*(row[2:2 + n] for row in rows))],
           "bytes_per_step": max(row[1] for row in rows), "calls_per_step": calls_per_step,
           "parameters": sum(t.numel() for t in params), "calls": calls,
           "hosts": backend.host_names(),
           "losses": [sum(col) / len(col) for col in zip(*(row[len(row) - len(mine):] for row in rows))]
           if mine else [], "iters": n}
    if pruned:
        out["pruned"] = pruned
    if trace is not None:
        out["trace"] = trace
    if cfg.timeline:   # the rank whose communication ended last (it sets the step)
        from .timeline import FIELDS
        late = max(rows, key=lambda row: row[2 + 2 * n + FIELDS.index("comm_end_ms")])
        out["timeline"] = dict(zip(FIELDS, late[2 + 2 * n:]))
    if rank == 0:
        out["params"] = {"early": early, "final": torch.cat(params) if params else torch.empty(0)}
    if cfg.whatif_iters and len(set(out["hosts"])) > 1:   # it prices the links between hosts
        out["comm_records"] = bench_calls(cfg, info, backend, device, calls, out["hosts"], watchdog)
    backend.barrier()
    return out


def bench_calls(cfg: TrainConfig, info, backend, device: str, calls, hosts: list[str],
                watchdog) -> list[dict]:
    """The step's own collectives at the step's sizes (and a small anchor, train/whatif.py), timed
    and checked by bench's harness in these processes: the records the what-if fits. Every rank
    returns them."""
    from ..bench.config import BenchConfig
    from ..bench.harness import run_rank as bench_rank
    from ..launch.environment import link_fields
    from .whatif import bench_sizes
    out, wrong = [], 0
    link = link_fields()
    for coll, sizes in bench_sizes(calls).items():
        watchdog.step(f"benching the step's {coll} calls")
        bcfg = BenchConfig(collectives=[coll], sizes=sizes, iters=cfg.whatif_iters, warmup_iters=1,
                           backend=cfg.backend, device=device, per_op=False,
                           timeout_s=cfg.timeout_s)
        wrong += bench_rank(bcfg, info, backend, device, lambda m: out.append(record("bench", {
            "backend": cfg.backend, "device": device, "world_size": info.world_size, **m, **link,
            "env": {"hosts": hosts}})))
    if wrong:
        raise RanksDisagree(f"the step's collectives, benched for the what-if, returned {wrong} "
                            "wrong elements: the backend returned wrong data")
    return out


# The shell's half of a rank's job (cli/train.py parses the flags and starts the ranks): the memory
# check, then run_rank with the header before it and the record, table, what-if and files after.


@dataclass
class RankOutputs:
    """Where a rank 0 writes: --json, --plot (a job of its own only), and --state-out (the full
    parameters, for a several-backend shell)."""
    json_path: str | None = None
    plot_path: str | None = None
    state_out: str | None = None


def check_memory(cfg, ranks_here: int) -> None:
    """Refuse, in one line, a run whose ranks on this host cannot fit its memory (train.rank_bytes:
    a floor; GPUs: one rank's share of its own GPU)."""
    from ..launch.memory import buffer_budget
    if cfg.device == "cuda":
        import torch
        if not torch.cuda.is_available():
            return   # the backend's own check says so in its words
    sharers, budget = buffer_budget(cfg.device, ranks_here)
    # The exact floor builds the network on the meta device, layer by layer: a floor of gpt's
    # first, from its flags alone, so a million layers is refused at once, not after minutes.
    quick = gpt_blocks_bytes(cfg.spec) * sharers
    need = quick if quick > budget else rank_bytes(cfg) * sharers
    if need > budget:
        raise UsageError(f"{cfg.spec.describe()} under {cfg.parallel} needs at least "
                         f"{need / (1 << 30):.1f} GiB for {sharers} rank{'s' if sharers > 1 else ''} "
                         f"but {max(budget, 0) / (1 << 30):.1f} GiB is available: use fewer ranks "
                         "(-N), a smaller --batch-size or --image-size, or a smaller network")


def before_start(cfg, info) -> None:
    from ..launch.environment import spawned_here
    if not spawned_here():   # under an outer launcher: nobody checked
        check_memory(cfg, info.local_world_size)


def predictions(rec: dict, out: dict, whatif: WhatIf) -> list[dict]:
    """The what-if's predicted records (none when it was not asked for)."""
    if not out.get("comm_records"):
        return []
    from .whatif import StepModel
    model = StepModel(rec, out["calls"], out["comm_records"], whatif.measured_bps)
    return model.predicted(whatif.hosts or [model.layout.hosts], whatif.rates or [None])


def run_as_rank(cfg, whatif: WhatIf, outputs: RankOutputs, info, backend, device) -> int:
    from ..bench.watchdog import guarded_rank
    from ..envinfo import record_env
    json_path, state_out = outputs.json_path, outputs.state_out
    lead = info.rank == 0
    if lead:
        _print_header(cfg, info)
    with guarded_rank(info.rank, cfg.timeout_s) as watchdog:
        out = run_rank(cfg, info, backend, device, watchdog)
    if lead:
        from .shell import table
        rec = train_record(cfg, info.world_size, out, record_env(), whatif.measured_bps)
        print(table([rec]))
        preds = predictions(rec, out, whatif)
        if cfg.whatif_iters and not preds:
            print("# no what-if: every rank ran on one host, and the what-if prices the links "
                  "between hosts")
        if preds:
            from .whatif import whatif_table
            print(f"# what-if for {cfg.backend}, fitted on this run and its collectives benched "
                  f"alone ({WHATIF_ITERS} checked calls per size):")
            print(whatif_table(preds))
        if json_path:
            from ..report.records import write_jsonl
            write_jsonl(json_path, [rec, *preds])
        if outputs.plot_path and not state_out:   # a job of its own (under a launcher): it plots itself
            from ..report.plot import plot_records
            plot_records([rec, *preds], outputs.plot_path)
        if state_out:
            import torch
            torch.save(out["params"], state_out)
        if out.get("trace"):
            from ..report.trace import write
            write(cfg.trace, out["trace"])
            print(f"# trace: {cfg.trace} (each rank's forward, backward, optimizer and DDP buckets; "
                  "open it in ui.perfetto.dev or chrome://tracing)")
        sys.stdout.flush()
    if cfg.backend == "nccl":
        from ..bench.fastnet import fast_net_unproven   # --fast-net: NCCL's logs must show the plugin
        if fast_net_unproven(backend, info):
            return 1
    return 0


def _print_header(cfg, info) -> None:
    print(f"# wirespeed train: {cfg.spec.describe()}, {cfg.parallel}"
          f"{f' (buckets of {cfg.bucket_mb:g} MiB)' if cfg.parallel == 'ddp' else ''}, "
          f"{cfg.optimizer}; backend {cfg.backend}, device {cfg.device}, {info.world_size} "
          f"rank{'s' if info.world_size > 1 else ''}; "
          f"{cfg.iters} timed steps after {cfg.warmup_iters} warm-up")
    sys.stdout.flush()


def train_record(cfg, world: int, out: dict, env: dict, measured_bps: int | None = None) -> dict:
    """The wirespeed.train/1 record of one backend's run (docs/records.md)."""
    from ..launch.environment import link_fields
    from .whatif import bounds
    step, compute = out["step"], out["compute"]
    step_us, compute_us = step["time_us"], compute["time_us"]
    per_rank = cfg.spec.batch_size / (step_us * 1e-6) if step_us > 0 else 0.0
    spec = cfg.spec
    shape = {"layers": spec.layers, "hidden": spec.hidden, "heads": spec.heads,
             "seq_len": spec.seq_len, "vocab": spec.vocab} if spec.model == "gpt" \
        else {"image_size": spec.image_size}
    return record("train", {
        "run_id": time.strftime("%Y%m%d-%H%M%S"), "backend": cfg.backend, "device": cfg.device,
        "world_size": world, "model": spec.model, "parallel": cfg.parallel,
        "batch_size": spec.batch_size, **shape, "unit": spec.unit, "optimizer": cfg.optimizer,
        "bucket_mb": cfg.bucket_mb if cfg.parallel == "ddp" else None,
        "parameters": out["parameters"],
        "samples_per_s": per_rank * world, "samples_per_s_per_rank": per_rank,
        **({"tokens_per_s": per_rank * world * spec.seq_len} if spec.model == "gpt" else {}),
        "step_us": step_us, "step_min_us": step["time_min_us"], "step_max_us": step["time_max_us"],
        "step_p99_us": step["time_p99_us"], "step_times_us": out.get("steps_us", []),
        "compute_us": compute_us, "compute_min_us": compute["time_min_us"],
        "compute_max_us": compute["time_max_us"],
        # Exposed: what the step takes beyond its own compute; 0 when noise puts it below.
        "exposed_pct": max(0.0, 100.0 * (step_us - compute_us) / step_us) if step_us > 0 else 0.0,
        "bytes_per_step": out["bytes_per_step"], "calls_per_step": out["calls_per_step"],
        "state_digest": out["state_digest"], "iters": out.get("iters", cfg.iters), "warmup_iters": cfg.warmup_iters,
        # Stopped early as a --tune candidate slower than the search asked (train/search.py).
        **({"pruned": out["pruned"]} if out.get("pruned") else {}),
        # The options every run states (so a --tune candidate's record says what it ran).
        "comm_hook": cfg.comm_hook, "threads": cfg.threads or torch.get_num_threads(),
        **({"grad_as_bucket_view": cfg.grad_as_bucket_view, "static_graph": cfg.static_graph}
           if cfg.parallel == "ddp" else {"reshard_after_forward": cfg.reshard_after_forward,
                                          "prefetch": cfg.prefetch, "reduce_dtype": cfg.reduce_dtype}),
        # The job's loss at each step, warm-up steps first (the mean over the ranks' batches).
        "losses": out.get("losses", []),
        **({"timeline": out["timeline"]} if "timeline" in out else {}),
        # The wire time and the lower limit max(compute, wire) (train/whatif.py).
        **bounds(step_us, compute_us, out["calls"], len(set(out["hosts"])),
                 measured_bps or (link_fields().get("link_rate_gbps", 0) * 1e9) or None),
        "env": {**env, "hosts": out["hosts"]}})
