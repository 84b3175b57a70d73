"""`wirespeed train`'s wrapper options, --trace and --tune's flags (cli/train.py has the rest)."""
from __future__ import annotations

import argparse

from ..errors import UsageError
from . import flags
from .common import add
from .rankjob import parse_num


def register(p) -> None:
    add(p, "--comm-hook", default="none", help="ddp: none, fp16, bf16 (gradient compression: torch's "
        "fp16/bf16_compress_hook) or powersgd:RANK (torch's powerSGD_hook, low-rank compression)")
    add(p, "--threads", default="0", help="torch.set_num_threads in each rank (0: as started; "
        "launchers start ranks with OMP_NUM_THREADS=1 unless it is set)")
    add(p, "--grad-as-bucket-view", action="store_true", help="ddp: gradient_as_bucket_view=True")
    add(p, "--static-graph", action="store_true", help="ddp: static_graph=True")
    add(p, "--reshard-after-forward", action=argparse.BooleanOptionalAction, default=True,
        help="fsdp: free each block's gathered parameters after its forward (FSDP2's default)")
    add(p, "--prefetch", default="0", help="fsdp: blocks each block gathers ahead explicitly in "
        "forward and backward (0: FSDP2's own prefetching)")
    add(p, "--reduce-dtype", default="fp32", help="fsdp: fp32, or bf16 (MixedPrecisionPolicy("
        "reduce_dtype=bf16): gradients reduced in bf16, compression)")
    flags.output(p, "--trace", default=None, help="write each rank's forward, backward, optimizer and every "
        "bucket's communication as a Chrome/Perfetto trace (JSON) here")
    add(p, "--what-if-gpu", default=None, help="the step's compute on a GPU instead: V100, A100 or "
        "H100 (peak dense 16-bit TFLOPS from a table) at an assumed MFU, from the step's FLOPs")
    add(p, "--gpu-tflops", default=None, help="--what-if-gpu: the GPU's peak TFLOPS (the table's unless given)")
    add(p, "--gpu-mfu", default=None, help="--what-if-gpu: the share of the peak training reaches "
        "(model-FLOPs utilisation; 0.4 unless given)")
    add(p, "--what-if-only", action="store_true", help="train nothing: the FSDP2 (ZeRO-3) step of "
        "--model on --what-if-hosts (8) x --ranks-per-host (8) --what-if-gpu GPUs at each "
        "--what-if-rate (100-800gbit), from the network's shapes (docs/train.md)")
    add(p, "--tune", action="store_true", help="search the wrapper options, comm hooks, threads and "
        "the backend's knobs for a faster configuration that keeps the training (docs/train.md)")
    add(p, "--budget", default="1800", help="--tune: seconds the search may take; what does not fit "
        "is skipped and named")
    add(p, "--loss-tolerance", default="2%", help="--tune: the largest change of the loss and of the "
        "parameters (over the distance training moved them) a recommendation may make")
    add(p, "--candidates", default=None, help="--tune: the candidates to try instead of the built-in "
        "list, ';' between candidates, '+' inside one: 'comm-hook=fp16; bucket-mb=5+threads=2; "
        "WIRESPEED_NSTREAMS=4'")
    # A --tune candidate's run (train/search.py): stop after K timed steps when slower than SPS.
    p.add_argument("--prune-below", default=None, help=argparse.SUPPRESS)   # "SPS@K"


def options_from_args(args) -> dict:
    """The TrainConfig fields of the options, read; their bounds and combinations are checked with
    the whole config (train/hooks.check_options, as every --candidates entry is): one line, exit 2."""
    from ..train.hooks import parse_comm_hook
    hook = parse_comm_hook(args.comm_hook)
    threads = parse_num(args.threads, "--threads")
    prefetch = parse_num(args.prefetch, "--prefetch")
    below, after = 0.0, 0
    if args.prune_below is not None:
        text, _, k = str(args.prune_below).partition("@")
        below, after = parse_num(text, "--prune-below", float), parse_num(k, "--prune-below's steps")
    return {"comm_hook": hook, "threads": threads, "grad_as_bucket_view": bool(args.grad_as_bucket_view),
            "prune_below": below, "prune_after": after, "static_graph": bool(args.static_graph), "reshard_after_forward": bool(args.reshard_after_forward),
            "prefetch": prefetch, "reduce_dtype": args.reduce_dtype}


def tune_from_args(args) -> tuple[float, float, str | None]:
    """(--budget seconds, --loss-tolerance as a fraction, --candidates), checked."""
    budget = parse_num(args.budget, "--budget", float)
    if budget <= 0:
        raise UsageError("--budget must be positive (seconds)")
    text = str(args.loss_tolerance).strip()
    tol = parse_num(text[:-1] if text.endswith("%") else text, "--loss-tolerance", float)
    tol = tol / 100 if text.endswith("%") else tol
    if not 0 < tol < 1:
        raise UsageError(f"--loss-tolerance {args.loss_tolerance}: give a share between 0 and 1, or "
                         "a percentage such as 2%")
    return budget, tol, args.candidates


def run_tune(args, argv, backends: list[str], cfg, shell) -> int:
    """`train --tune`: its flags checked, then the search (train/search.py)."""
    from ..flagvalues import given
    from ..train.search import builtin_plan, parse_candidates, run_search
    if len(backends) > 1:
        raise UsageError(f"--tune searches one backend's configurations; --backend {args.backend} "
                         "names several: give one")
    # each of these describes one configuration's run (and the search would ignore it silently)
    for flag, on in (("--trace", args.trace), ("--what-if-hosts", args.what_if_hosts),
                     ("--what-if-rate", args.what_if_rate), ("--timeline", args.timeline),
                     ("--what-if-gpu", args.what_if_gpu), ("--plot", args.plot),
                     ("--no-scaling", args.no_scaling)):
        if on:
            raise UsageError(f"--tune runs many configurations, {flag} describes one: drop {flag} "
                             "(and give it to the recommended configuration's own run)")
    budget, tol, text = tune_from_args(args)
    candidates = parse_candidates(text, cfg, backends[0]) if text else builtin_plan(cfg, backends[0], shell)
    repeat = parse_num(args.repeat, "--repeat") if given(args.repeat) else 2
    if repeat < 1:
        raise UsageError("--repeat must be at least 1")
    return run_search(cfg, backends[0], shell, budget, tol, candidates, repeat, list(argv or []))


def gpu_from_args(args):
    """(name, peak TFLOPS, MFU) of --what-if-gpu, or None; checked."""
    from ..train.gpuflops import gpu_rate
    if not args.what_if_gpu:
        for flag in ("gpu_tflops", "gpu_mfu"):
            if getattr(args, flag) is not None:
                raise UsageError(f"--{flag.replace('_', '-')} sets --what-if-gpu's GPU: add --what-if-gpu")
        return None
    tflops = parse_num(args.gpu_tflops, "--gpu-tflops", float) if args.gpu_tflops is not None else None
    mfu = parse_num(args.gpu_mfu, "--gpu-mfu", float) if args.gpu_mfu is not None else None
    return gpu_rate(args.what_if_gpu, tflops, mfu)


def run_what_if_only(args, spec) -> int:
    """`train --what-if-only`: the sharded step on the named GPUs and links (train/shardedwhatif)."""
    from ..netem.units import parse_rate
    from ..train.shardedwhatif import DEFAULT_RATES, run
    for flag, on in (("--tune", args.tune), ("--cluster", args.cluster), ("--json", args.json),
                     ("--plot", args.plot), ("--backend", args.backend), ("-N", args.nproc),
                     ("--measured-link-rate", args.measured_link_rate), ("--timeline", args.timeline),
                     ("--trace", args.trace), ("--prefetch", str(args.prefetch) != "0")):
        if on:
            raise UsageError(f"--what-if-only runs nothing and prints its table; it has no use for {flag}: drop it")
    gpu = gpu_from_args(args)
    if gpu is None:
        raise UsageError("--what-if-only prices the step on GPUs: add --what-if-gpu V100, A100 or H100")
    hosts = parse_num(args.what_if_hosts or "8", "--what-if-hosts (one host count here)")
    per_host = int(args.ranks_per_host or 8)   # argparse checked it
    if hosts < 1 or per_host < 1 or hosts * per_host < 2:
        raise UsageError("--what-if-only: give at least 2 GPUs (--what-if-hosts x --ranks-per-host)")
    rates = [parse_rate(r.strip(), "--what-if-rate", 10**13) for r in str(args.what_if_rate or DEFAULT_RATES).split(",")
             if r.strip()]
    from ..train.hooks import check_options
    from ..train.rank import TrainConfig
    cfg = TrainConfig(spec=spec, parallel=args.parallel, **options_from_args(args))
    check_options(cfg)   # the wrapper options' one check, as train's and every --candidates entry's
    print(run(cfg, gpu, hosts, per_host, rates))
    return 0
