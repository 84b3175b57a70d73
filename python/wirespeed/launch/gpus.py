"""Which ranks may share a GPU, and what a run on shared GPUs should say about itself.

NCCL refuses two ranks of one host on one GPU ("Duplicate GPU detected"), but ranks it sees as
different hosts may share one: NCCL tells hosts apart by a hash of the hostname (each emulated
host of `wirespeed cluster` has its own) or of NCCL_HOSTID, and ranks on different hosts talk over
its network transport, as nodes of a cluster do. That is how a multi-node NCCL job is rehearsed on
one GPU box. gloo on CUDA tensors does not care how many ranks share a GPU.

Several processes on one GPU time-slice its kernels unless the MPS daemon runs (issue 15 measured
two ranks on one H100 without it: every all_reduce cost at least 4.5 ms), so a run on shared GPUs
says whether MPS runs and how to start it.
"""
from __future__ import annotations

import os
import socket

MPS_START = "nvidia-cuda-mps-control -d"
MPS_STOP = "echo quit | nvidia-cuda-mps-control"


def most_ranks_on_one_host(nproc: int, hosts: int | None = None, ranks_per_host: int | None = None,
                           host_per_rank: bool = False) -> int:
    """The largest number of ranks that share a host: every rank on one host when spawned locally,
    one with --host-per-rank, and as `launch.cluster.placement` places them on an emulated cluster
    (blocks of ranks_per_host, else round robin over `hosts`)."""
    if host_per_rank:
        return 1
    if hosts:
        return min(nproc, ranks_per_host) if ranks_per_host else -(-nproc // hosts)
    return nproc


def gpu_problem(backend: str, nproc: int, gpus: int, ranks_on_one_host: int) -> str | None:
    """None when `nproc` ranks of `backend` can run on `gpus` GPUs so placed, else why not and what
    to do instead."""
    if backend != "nccl" or ranks_on_one_host <= gpus:
        return None
    return (f"{ranks_on_one_host} NCCL ranks on one host need {ranks_on_one_host} GPUs but {gpus} "
            f"{'is' if gpus == 1 else 'are'} visible (NCCL needs one GPU per rank of a host): give "
            "each rank its own host (--host-per-rank, or --cluster with one rank per emulated host) "
            "to run them on shared GPUs, as nodes of a cluster")


def host_id_for_rank(rank: int) -> str:
    """The host id a rank takes with --host-per-rank (NCCL_HOSTID and WIRESPEED_HOSTID)."""
    return f"{socket.gethostname()}-rank{rank}"


def set_host_per_rank(rank: int, environ=os.environ) -> None:
    """Make this rank a host of its own for NCCL and wirespeed's transport; both read the variables
    when the backend starts, so this must run before init."""
    environ["NCCL_HOSTID"] = host_id_for_rank(rank)
    environ["WIRESPEED_HOSTID"] = host_id_for_rank(rank)


def host_id(environ=os.environ) -> str:
    """What NCCL tells hosts apart by: NCCL_HOSTID when set, else the hostname."""
    return environ.get("NCCL_HOSTID") or socket.gethostname()


def gpu_id(device: str) -> str:
    """An identity of the physical GPU behind a torch device, the same in every process and
    network namespace (its UUID, else its PCI bus id, else the index)."""
    import torch
    props = torch.cuda.get_device_properties(torch.device(device))
    for attr in ("uuid", "pci_bus_id"):
        value = getattr(props, attr, None)
        if value is not None:
            return str(value)
    return device


def mps_running(environ=os.environ) -> bool:
    """Whether an MPS control daemon listens (its pipe in CUDA_MPS_PIPE_DIRECTORY, /tmp/nvidia-mps
    by default)."""
    pipe_dir = environ.get("CUDA_MPS_PIPE_DIRECTORY") or "/tmp/nvidia-mps"
    return os.path.exists(os.path.join(pipe_dir, "control"))


def sharing_lines(hosts: list[str], gpus: list[str], backend: str, mps: bool) -> list[str]:
    """Header lines for ranks that share a GPU (none when every rank has its own): which ranks
    share which GPU, that NCCL treats them as separate hosts, and whether MPS runs."""
    by_gpu: dict[str, list[int]] = {}
    for rank, g in enumerate(gpus):
        by_gpu.setdefault(g, []).append(rank)
    shared = {g: ranks for g, ranks in by_gpu.items() if len(ranks) > 1}
    if not shared:
        return []
    lines = []
    for g, ranks in shared.items():
        on = sorted({hosts[r] for r in ranks})
        lines.append(f"# ranks {','.join(map(str, ranks))} share GPU {g[:20]} "
                     f"({len(on)} host id{'s' if len(on) != 1 else ''}: {', '.join(on)})")
    if backend == "nccl":
        lines.append("# NCCL sees ranks with different host ids as different nodes: they talk over "
                     "its network transport (sockets or IB), not over the GPU's memory")
    if mps:
        lines.append("# MPS is running: the ranks' kernels run on the shared GPU at the same time")
    else:
        lines.append(f"# MPS is not running: the ranks' kernels time-slice the GPU, so every "
                     f"collective costs milliseconds; start it with `{MPS_START}` (stop: "
                     f"`{MPS_STOP}`) and run again")
    return lines
