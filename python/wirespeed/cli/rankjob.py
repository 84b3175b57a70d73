"""What every rank-running subcommand shares (bench, model, batching, objects, links): the job's
skeleton (`run_job`: a rank, or the shell that starts ranks), number flags, the default rank count,
starting the backend with a one-line error, and the first line of an error."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

from ..errors import TransportError, UsageError, WirespeedError
from ..faults import first_line, kind_of, rank_error
from ..flagvalues import parse_num   # the cli modules take it from here too


def parse_port(text, name: str = "--master-port") -> int | None:
    """A TCP port from a flag (1..65535), or None when not given. 0 is refused rather than passed
    on: every rank would look for the rendezvous at port 0 and none would find it (a hang)."""
    if text is None:
        return None
    port = parse_num(text, name)
    if not 0 < port < 65536:
        raise UsageError(f"{name} must be a port from 1 to 65535, got {text!r} (leave it out to "
                         "pick a free one)")
    return port


def check_rank_flags(args) -> None:
    """Flags of rank-running commands that make no sense alone or together, refused in one line
    before anything starts: a port out of range, --ranks-per-host without --cluster."""
    parse_port(getattr(args, "master_port", None))
    if getattr(args, "ranks_per_host", None) is not None and not getattr(args, "cluster", None):
        raise UsageError("--ranks-per-host places ranks on the emulated cluster's hosts: add "
                         "--cluster, or leave --ranks-per-host out")


def parse_iters_timeout(args) -> tuple[int, float]:
    """-n/--iters (at least 1) and -T/--timeout (positive), shared by every rank-running command."""
    iters = parse_num(args.iters, "--iters")
    if iters < 1:
        raise UsageError("--iters must be at least 1")
    timeout = parse_num(args.timeout, "--timeout", float)
    if timeout <= 0:
        raise UsageError("--timeout must be positive")
    return iters, timeout


def default_nproc(text, device: str) -> int:
    """-N as given, else one rank per GPU, else 2 to 4 CPU ranks."""
    if text is not None:
        n = parse_num(text, "--nproc")
        if n < 1:
            raise UsageError("--nproc must be at least 1")
        return n
    if device == "cuda":
        import torch
        return max(torch.cuda.device_count(), 1)
    return max(2, min(os.cpu_count() or 2, 4))


@dataclass
class Job:
    """What one rank-running command says about its job; run_job does the rest. The hooks keep
    each command's checks in the order it has always made them: which error a bad command line
    meets first is part of its behaviour."""

    backend: str
    device: str
    timeout_s: float
    # In the user's shell: the command's checks, then start(nproc, extra_argv) once per set of
    # ranks (objects starts one per world size); returns the exit status.
    launch: Callable[..., int]
    # In a rank whose backend has started: work(info, backend, device, *handed_on) measures and,
    # on rank 0, reports; returns the exit status.
    work: Callable[..., int]
    # In a rank, before its backend starts: the checks that need the world size, settings that
    # libraries read at init; a tuple it returns is handed on to work.
    before_start: Callable[..., tuple | None] = lambda info: None


def run_job(make_job: Callable[..., Job], args, argv: list[str]) -> int:
    """The skeleton of every rank-running command. A rank cannot tell who started it
    (docs/architecture.md), so the same command line is either one rank under a launcher
    (torchrun, srun, mpirun, or our own spawn) or the user's shell, which starts ranks that re-run
    it with `extra_argv` added."""
    from ..launch.environment import rank_info
    check_rank_flags(args)
    job = make_job(args)
    info = rank_info(need_master=job.backend != "mpi")  # MPI ranks meet through mpirun instead
    if info is None:
        def start(nproc: int, extra_argv=()) -> int:
            # batching and objects have no --cluster: their ranks always run on this host.
            return launch_ranks([*argv, *extra_argv], nproc, job.backend, args.master_port,
                                getattr(args, "cluster", None), getattr(args, "ranks_per_host", None))
        return job.launch(start)
    handed_on = job.before_start(info) or ()
    backend = start_backend(job.backend, job.device, info, job.timeout_s)
    try:
        code = job.work(info, backend, backend.device_for(info, job.device), *handed_on)
    except Exception as e:   # a library's (the transport's too) error out of the work names its rank
        raise rank_error(info.rank, e) from None
    backend.shutdown()
    return code


def start_backend(name: str, device: str, info, timeout_s: float):
    """Create and init the backend for this rank; a library failure becomes one WirespeedError line."""
    from ..backends import create
    backend = create(name, device)
    try:
        backend.init(info, device, timeout_s)
    except Exception as e:
        if isinstance(e, WirespeedError) and not isinstance(e, TransportError):
            raise
        raise kind_of(e)(f"rank {info.rank}: {name} could not start the job at "
                         f"{info.master_addr}:{info.master_port}: {first_line(e)}") from None
    return backend


def check_local_gpus(nproc: int, backend: str, ranks_on_one_host: int | None = None) -> None:
    """NCCL needs a GPU per rank of a host; ranks on hosts of their own, and other backends (gloo
    on CUDA tensors), may share one (launch/gpus.py)."""
    if backend == "nccl":
        import torch
        from ..launch.gpus import gpu_problem
        why = gpu_problem(backend, nproc, torch.cuda.device_count(),
                          nproc if ranks_on_one_host is None else ranks_on_one_host)
        if why:
            raise UsageError(f"-N {nproc}: {why}")


def check_local_start(nproc: int, backend: str, device: str):
    """Before ranks start on this host: room for them (launch/memory.check_local_ranks), the
    backend able to run here (created once: it fails here, once, not in every rank) and NCCL's
    GPU per rank. Returns the created backend."""
    from ..backends import create
    from ..launch.memory import check_local_ranks
    check_local_ranks(nproc)
    adapter = create(backend, device)
    check_local_gpus(nproc, backend)
    return adapter


def pick_backend(device: str | None, nccl_usable: bool) -> tuple[str, str]:
    """(backend, device) when no --backend is given: a device asked for picks a backend that runs
    on it (--device cpu is gloo even on a GPU box, --device cuda is NCCL); with no device, NCCL on
    GPUs where it can run, else gloo on CPU."""
    if device == "cpu":
        return "gloo", "cpu"
    if device == "cuda" or nccl_usable:
        return "nccl", "cuda"
    return "gloo", "cpu"


def resolve_backend(backend: str | None, device: str | None) -> tuple[str, str]:
    """--backend/--device as given; without --backend, pick_backend's choice."""
    from ..backends.registry import BACKENDS, availability
    if backend is None:
        nccl_usable = device is None and availability("nccl") is None  # asked only when it decides
        backend, default_device = pick_backend(device, nccl_usable)
        device = device or default_device
    if backend not in BACKENDS:
        raise UsageError(f"unknown backend {backend!r}: choose from {', '.join(BACKENDS)}")
    return backend, device or BACKENDS[backend].devices[0]


def launch_ranks(argv: list[str], nproc: int, backend: str, master_port_text,
                 cluster: str | None = None, ranks_per_host: int | None = None) -> int:
    """Start nproc ranks of `wirespeed <argv>`: on the emulated cluster's hosts with --cluster,
    else under mpirun for the MPI backend (its ranks rendezvous through MPI), else wirespeed's own
    spawner with torchrun's environment."""
    from ..launch.memory import check_local_ranks
    port = parse_port(master_port_text)
    check_local_ranks(nproc)  # the emulated cluster's and mpirun's ranks run here too
    if cluster:
        from ..launch.cluster import spawn_on_cluster
        return spawn_on_cluster(argv, nproc, ranks_per_host, cluster, port, backend=backend)
    if backend == "mpi":
        from ..launch.mpirun import launch_mpirun
        return launch_mpirun(argv, nproc)
    from ..launch.local import spawn
    return spawn(argv, nproc, port)


def uses_torch_distributed(adapter) -> bool:
    """True for adapters that run on a torch.distributed process group (async ops, objects, p2p)."""
    from ..backends.torch_dist import TorchDistBackend
    return isinstance(adapter, TorchDistBackend)
