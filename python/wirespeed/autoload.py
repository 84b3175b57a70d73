"""The "wirespeed" torch.distributed backend, registered when torch is imported.

torch loads out-of-tree backends by entry point: at the end of `import torch` it calls every
`torch.backends` entry point installed (pyproject.toml names `torch_hook` here), unless
TORCH_DEVICE_BACKEND_AUTOLOAD=0. So an installed wirespeed makes `init_process_group("wirespeed")`
work in a script that never imports it.

The hook runs in every process that imports torch in this environment, most of which never use
wirespeed, and while torch itself is still finishing its import. So it only names the backend:
torch.distributed is already loaded by then, and registering a name is a few attribute writes.
The backend itself (wirespeed.native: the engine, the process group, the rendezvous) is imported
by the first group that asks for it. And the hook never raises: torch turns an error there into a
failed `import torch` for everyone.
"""
from __future__ import annotations

NAME = "wirespeed"


def _create(opts, backend_options=None):
    from .native.registration import create
    return create(opts, backend_options)


def register_backend() -> None:
    """Make "wirespeed" a torch.distributed backend for CPU tensors (idempotent; raises what torch
    raises), as `wirespeed.native` does on import but without importing it."""
    import torch.distributed as dist
    if NAME.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(NAME, _create, extended_api=True, devices=["cpu"])


def torch_hook() -> None:
    """torch's autoloading entry point: register_backend, every failure swallowed (the backend
    is then simply not there, as without the hook; `import wirespeed.native` says why)."""
    try:
        register_backend()
    except Exception:  # noqa: BLE001 - an error here would break `import torch` everywhere
        pass
