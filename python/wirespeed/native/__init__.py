"""wirespeed's native CPU collective backend, usable from torch.distributed as "wirespeed".

    import wirespeed.native            # registers the backend with torch.distributed
    dist.init_process_group("wirespeed", ...)

Ranks on one host talk through shared memory (wirespeed-core, in Rust). Errors are typed: see
the exceptions exported here.
"""
from __future__ import annotations

from .errors import (BrokenGroupError, CollectiveTimeout, MismatchError, PeerAbortedError,
                     PeerDiedError, StrangerError, UnsupportedError, WirespeedError)
from .registration import BACKEND_NAME, register

__all__ = ["BACKEND_NAME", "register", "WirespeedError", "PeerDiedError", "PeerAbortedError",
           "CollectiveTimeout", "MismatchError", "UnsupportedError", "StrangerError",
           "BrokenGroupError"]

register()
