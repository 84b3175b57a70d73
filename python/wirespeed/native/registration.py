"""Registration with torch.distributed and the store rendezvous.

One registration, as torch registers its own backends: a named backend for the cpu device whose
creator takes torch's extended options (store, rank, size, timeout, group name). The creator,
`create`, returns the group's ProcessGroup (process_group.py) with the wirespeed Backend
registered in it. Where torch's backend autoloading registered the name first (at `import torch`,
wirespeed/autoload.py), that registration stands: its creator imports this module and calls
`create`.

The rendezvous through the store torch hands the creator is rendezvous.py's. Every method torch
calls into (group, backend, works) is kept out of torch.compile's frame compiler (dynamo.py).
"""
from __future__ import annotations

import torch.distributed as dist

from .anysource import AnySourceWork
from .backend import WirespeedBackend
from .dynamo import hide_from_dynamo
from .process_group import WirespeedProcessGroup
from .rendezvous import rendezvous
from .work import Work

BACKEND_NAME = "wirespeed"

hide_from_dynamo(WirespeedProcessGroup, WirespeedBackend, Work, AnySourceWork)


def create(opts, backend_options=None):
    store, rank, size, timeout = opts.store, opts.group_rank, opts.group_size, opts.timeout
    pg = WirespeedProcessGroup(store, WirespeedBackend(rendezvous(store, rank, size, timeout), store, rank,
                                                       size, timeout))
    parent = opts.process_group      # the group torch built for this call: keep its device binding
    if parent is not None and parent.bound_device_id is not None:
        pg.bound_device_id = parent.bound_device_id
    return pg


def register() -> None:
    """Make "wirespeed" a torch.distributed backend for CPU tensors (idempotent)."""
    if BACKEND_NAME.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(BACKEND_NAME, create, extended_api=True, devices=["cpu"])
