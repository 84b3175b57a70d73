"""Backends by name. Each entry says whether it can run here, and if not, why and how to get it."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..errors import BackendUnavailable, UsageError


@dataclass(frozen=True)
class BackendEntry:
    name: str
    devices: tuple[str, ...]
    check: Callable[[], str | None]      # None when usable here, else why not and what to do
    factory: Callable[[], object]


def _torch_dist_missing() -> str | None:
    try:
        import torch.distributed as dist
    except ImportError:
        return "torch is not installed: run `make bench` or `pip install torch`"
    if not dist.is_available():
        return "this torch build has no torch.distributed"
    return None


def _gloo_missing() -> str | None:
    missing = _torch_dist_missing()
    if missing:
        return missing
    import torch.distributed as dist
    return None if dist.is_gloo_available() else "this torch build has no gloo"


def _nccl_missing() -> str | None:
    missing = _torch_dist_missing()
    if missing:
        return missing
    import torch
    import torch.distributed as dist
    if not dist.is_nccl_available():
        return "this torch build has no NCCL (install a CUDA build of torch)"
    if not torch.cuda.is_available():
        return "no CUDA GPU is visible here (NCCL needs NVIDIA GPUs); use --backend gloo for CPU"
    return None


def _mpi_missing() -> str | None:
    from .mpi import missing
    return missing()


def _mpi_factory():
    from .mpi import MpiBackend
    return MpiBackend()


def _torch_factory(name):
    def make():
        from .torch_dist import TorchDistBackend
        return TorchDistBackend(name)
    return make


BACKENDS: dict[str, BackendEntry] = {e.name: e for e in (
    BackendEntry("gloo", ("cpu", "cuda"), _gloo_missing, _torch_factory("gloo")),
    BackendEntry("nccl", ("cuda",), _nccl_missing, _torch_factory("nccl")),
    BackendEntry("mpi", ("cpu",), _mpi_missing, _mpi_factory),
)}


def _native_factory():
    from .native import NativeBackend
    return NativeBackend()


def _native_missing() -> str | None:
    from .native import missing
    return _torch_dist_missing() or missing()


# wirespeed's own CPU backend (shared memory between ranks of one host).
BACKENDS["wirespeed"] = BackendEntry("wirespeed", ("cpu",), _native_missing, _native_factory)


def names() -> list[str]:
    return list(BACKENDS)


def availability(name: str) -> str | None:
    """None when `name` can run here, else the reason."""
    return BACKENDS[name].check()


def create(name: str, device: str = "cpu"):
    """A ready-to-init adapter, or a UsageError saying what is wrong and what to do."""
    if name not in BACKENDS:
        raise UsageError(f"unknown backend {name!r}: choose from {', '.join(BACKENDS)}")
    entry = BACKENDS[name]
    why = entry.check()
    if why:
        raise BackendUnavailable(f"backend {name!r} is not available here: {why}")
    if device not in entry.devices:
        raise UsageError(f"backend {name!r} does not run on {device} tensors "
                         f"(it supports: {', '.join(entry.devices)})")
    return entry.factory()

