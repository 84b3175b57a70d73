"""`wirespeed train`: real training steps of a real network on random data under DDP or FSDP2, on
each backend given, in fresh processes; what the network costs the step (docs/train.md).

Run by hand with several backends, the shell runs one single-backend `wirespeed train` after the
other (train/shell.py), each starting its own ranks as every rank-running command does
(`run_job`), then compares them. Under torchrun, srun or mpirun (with gloo, wirespeed or nccl) it is one rank of one backend.
"""
from __future__ import annotations

import argparse
from functools import partial

from ..errors import UsageError
from . import flags, trainopts
from .common import add
from .rankjob import (Job, check_local_gpus, check_local_start, default_nproc,
                      parse_iters_timeout, parse_num, resolve_backend, run_job)


def register(sub) -> None:
    p = sub.add_parser("train", help="time real training steps (DDP or FSDP2) on each backend",
                       description="Train a real network on random data under DDP or FSDP2 on each "
                       "backend: samples/s, step time, the step without communication, the exposed "
                       "communication's share, bytes per step, and model state checked across ranks "
                       "and backends.")
    add(p, "--model", default=None, help="gpt, or a torchvision network: resnet18, resnet50, "
        "resnet152, vgg16, alexnet, inception_v3")
    add(p, "--parallel", default="ddp", help="ddp (DistributedDataParallel) or fsdp (FSDP2, fully_shard)")
    add(p, "--batch-size", default="8", help="samples per rank per step")
    add(p, "--image-size", default="64", help="vision models: image side in pixels (224 is ImageNet's)")
    add(p, "--layers", default="2", help="gpt: transformer blocks")
    add(p, "--hidden", default="128", help="gpt: hidden width")
    add(p, "--heads", default="4", help="gpt: attention heads")
    add(p, "--seq-len", default="128", help="gpt: tokens per sample")
    add(p, "--vocab", default="1024", help="gpt: vocabulary size")
    add(p, "--bucket-mb", default="25", help="ddp: bucket size in MiB (DDP's bucket_cap_mb)")
    add(p, "--optimizer", default="sgd", help="sgd or adamw")
    add(p, "--timeline", action="store_true", help="ddp: also time when each step's buckets go out "
        "and come back (through a comm hook doing what DDP's own all_reduce does, on every backend "
        "alike) and print where in the step the communication ran and at what rate")
    trainopts.register(p)
    flags.ranks(p, holds="the model's parameters", backends="comma list of gloo, wirespeed, nccl",
                default_backend="nccl with GPUs, else gloo")
    flags.iterations(p, warmup="2", iters="10", unit="training steps")
    add(p, "--repeat", default="1", help="run the list of backends this many times, interleaved "
        "(A B A B); each backend's figures are its median run's")
    add(p, "--measured-link-rate", default=None, help="the rate of the links between the hosts "
        "(1gbit, 10gbit) for the wire-time bound and the what-if (the emulated cluster's is known)")
    add(p, "--what-if-hosts", default=None, help="comma list of host counts to predict the step at "
        "(same ranks per host; benches the step's collectives after the timed steps)")
    add(p, "--what-if-rate", default=None, help="comma list of link rates to predict the step at "
        "(1gbit,10gbit; default: the measured link's)")
    add(p, "--no-scaling", action="store_true", help="skip the one-rank run that scaling "
        "efficiency is measured against")
    flags.output(p, "--json", default=None, help="write one JSON-lines record per backend here")
    flags.output(p, "--plot", default=None, help="write a PNG of samples/s and exposed share per "
                 "backend (and the what-if, dashed) here")
    flags.output(p, "--save-dir", what="dir", unused_with=("no_save",), default="runs",
                 help="records and summary go to SAVE_DIR/train-<time>/")
    add(p, "--no-save", action="store_true", help="do not save under --save-dir")
    flags.placement(p, host_per_rank=False)
    add(p, "--fast-net", action="store_true", help="NCCL's inter-host traffic through the wirespeed "
        "network plugin (`make plugin` builds it); other backends in the list are unaffected")
    # A single-backend run started by a several-backend one: rank 0 writes the full parameters here.
    p.add_argument("--state-out", default=None, help=argparse.SUPPRESS)
    p.set_defaults(func=main)


def _int(args, name: str, least: int = 1) -> int:
    v = parse_num(getattr(args, name.lstrip("-").replace("-", "_")), name)
    if v < least:
        raise UsageError(f"{name} must be at least {least}")
    return v


def split_backends(text) -> list[str]:
    names = [t.strip() for t in str(text).split(",") if t.strip()]
    if not names:
        raise UsageError("--backend: give at least one backend, e.g. --backend gloo,wirespeed")
    if len(set(names)) != len(names):
        raise UsageError(f"--backend {text}: a backend is named twice")
    return names


def spec_from_args(args):
    """The network the flags describe (train/nets.NetSpec), checked."""
    from ..train.nets import NetSpec, check_spec
    if not args.model:
        raise UsageError("which network? give --model gpt or a torchvision name such as resnet18")
    spec = NetSpec(model=str(args.model), batch_size=_int(args, "--batch-size"),
                   image_size=_int(args, "--image-size"), layers=_int(args, "--layers"),
                   hidden=_int(args, "--hidden"), heads=_int(args, "--heads"),
                   seq_len=_int(args, "--seq-len"), vocab=_int(args, "--vocab"))
    check_spec(spec)
    return spec


def config_from_args(args) -> tuple[list[str], "object"]:
    """(backends, the TrainConfig of the first), every flag checked: one line, exit 2, on the first
    that is wrong, before any rank starts."""
    from ..train.rank import OPTIMIZERS, PARALLEL, TrainConfig, fsdp_missing
    from ..train.whatif import WHATIF_ITERS
    if args.parallel not in PARALLEL:
        raise UsageError(f"--parallel {args.parallel}: choose ddp or fsdp")
    if args.optimizer not in OPTIMIZERS:
        raise UsageError(f"--optimizer {args.optimizer}: choose sgd or adamw")
    spec = spec_from_args(args)
    bucket_mb = parse_num(args.bucket_mb, "--bucket-mb", float)
    if bucket_mb <= 0:
        raise UsageError("--bucket-mb must be positive (DDP's bucket_cap_mb)")
    if args.parallel == "fsdp" and fsdp_missing():
        raise UsageError(f"--parallel fsdp: {fsdp_missing()}")
    if args.timeline and args.parallel != "ddp":
        raise UsageError("--timeline times DDP's buckets; FSDP2 has none: drop --timeline or use "
                         "--parallel ddp")
    options = trainopts.options_from_args(args)
    backends = split_backends(args.backend) if args.backend is not None else [None]
    resolved = [resolve_backend(b, args.device) for b in backends]
    devices = {d for _, d in resolved}
    if len(devices) > 1:
        raise UsageError(f"--backend {args.backend}: the backends run on different devices "
                         f"({', '.join(sorted(devices))}); give --device or backends of one device")
    iters, timeout = parse_iters_timeout(args)
    backend, device = resolved[0]
    nproc = default_nproc(args.nproc, device)
    from ..launch.environment import rank_info
    if any(b == "nccl" for b, _ in resolved) and not (args.cluster or rank_info(need_master=False)):
        check_local_gpus(nproc, "nccl")   # before any run starts
    if "mpi" in backends:
        # DDP and FSDP run over a torch.distributed process group; wirespeed's mpi backend is
        # mpi4py's, which they cannot use, and torch's own is only in torch built from source.
        import torch.distributed as dist
        why = ("starting torch's MPI process group under mpirun is not done yet"
               if dist.is_mpi_available() else "this torch was built without MPI")
        raise UsageError(f"--backend mpi: train needs a torch.distributed MPI process group for "
                         f"DDP/FSDP and {why}; wirespeed's mpi backend (mpi4py) serves bench: use "
                         "gloo or wirespeed")
    whatif = whatif_from_args(args, nproc)
    cfg = TrainConfig(spec=spec, parallel=args.parallel, bucket_mb=bucket_mb, optimizer=args.optimizer,
                      backend=backend, device=device, nproc=nproc,
                      warmup_iters=parse_num(args.warmup_iters, "--warmup-iters"), iters=iters,
                      timeout_s=timeout, whatif_iters=WHATIF_ITERS if whatif.hosts or whatif.rates else 0,
                      timeline=bool(args.timeline), trace=args.trace, **options)
    from ..train.hooks import check_options
    check_options(cfg)
    return [b for b, _ in resolved], cfg


def whatif_from_args(args, ranks_per_host: int = 1):
    from ..explain.predict import MAX_RANKS
    from ..netem.units import parse_rate
    from ..train.whatif import WhatIf
    hosts = []
    for part in str(args.what_if_hosts or "").split(","):
        if part.strip():
            try:
                h = int(part) if part.strip().isdecimal() else 0
            except ValueError:   # thousands of digits
                h = 0
            if h < 2:
                raise UsageError(f"--what-if-hosts takes host counts of 2 or more, comma separated; "
                                 f"got {args.what_if_hosts!r}")
            if h * ranks_per_host > MAX_RANKS:   # each predicted record lists every rank's host
                raise UsageError(f"--what-if-hosts {h} x {ranks_per_host} rank(s) per host: predict "
                                 f"{MAX_RANKS} ranks or fewer")
            hosts.append(h)
    rates = [parse_rate(r.strip(), "--what-if-rate") for r in str(args.what_if_rate or "").split(",")
             if r.strip()]
    measured = parse_rate(args.measured_link_rate, "--measured-link-rate") \
        if args.measured_link_rate else None
    if (hosts or rates) and not (args.cluster or measured):
        raise UsageError("the what-if prices the network between hosts: run on the emulated cluster "
                         "(--cluster) or say the links' rate with --measured-link-rate")
    return WhatIf(hosts, rates, measured)


def main(args, argv) -> int:
    from ..launch.environment import rank_info
    if args.what_if_only:
        return trainopts.run_what_if_only(args, spec_from_args(args))
    backends, cfg = config_from_args(args)
    if args.fast_net:
        if "nccl" not in backends:
            raise UsageError(f"--fast-net moves NCCL's traffic through the wirespeed network plugin; "
                             f"--backend {args.backend} has no nccl: add it")
        from ..bench.fastnet import enable_fast_net
        enable_fast_net("nccl")   # every rank this process starts inherits it
    if args.state_out is None and rank_info(need_master=False) is None:
        # The user's shell: each backend in processes of its own, then the comparison.
        from .rankjob import check_rank_flags
        from ..train.shell import run_backends
        check_rank_flags(args)
        if args.tune:
            return trainopts.run_tune(args, argv, backends, cfg, shell_settings(args))
        from ..train.rank import check_memory
        check_memory(cfg, cfg.nproc)
        return run_backends(backends, cfg, shell_settings(args), repeat=_int(args, "--repeat"))
    if args.tune:
        raise UsageError("--tune starts runs of its own: run it from a shell, not under a launcher")
    if len(backends) > 1:
        raise UsageError(f"--backend {args.backend}: under a launcher a job runs one backend; give one")
    return run_job(_job, args, argv)


def _job(args) -> Job:
    from ..train.rank import RankOutputs, before_start, run_as_rank
    _, cfg = config_from_args(args)
    outputs = RankOutputs(json_path=args.json, plot_path=args.plot, state_out=args.state_out)
    return Job(cfg.backend, cfg.device, cfg.timeout_s, launch=partial(_launch_local, cfg),
               before_start=partial(before_start, cfg),
               work=partial(run_as_rank, cfg, whatif_from_args(args, cfg.nproc), outputs))


def _launch_local(cfg, start) -> int:
    check_local_start(cfg.nproc, cfg.backend, cfg.device)
    # Memory: local ranks are only ever started by a run the shell started (--state-out), after
    # the shell's check_memory for as many ranks; building the network again would cost seconds.
    return start(cfg.nproc)


def shell_settings(args):
    """What the several-backend shell does besides the runs (train/shell.py), from the flags."""
    from ..train.shell import ShellSettings
    return ShellSettings(cluster=args.cluster, ranks_per_host=args.ranks_per_host,
                         master_port=args.master_port, measured_link_rate=args.measured_link_rate,
                         what_if_hosts=args.what_if_hosts, what_if_rate=args.what_if_rate,
                         scaling=not args.no_scaling, json_path=args.json, plot_path=args.plot,
                         save_dir=None if args.no_save else args.save_dir,
                         gpu=trainopts.gpu_from_args(args))
