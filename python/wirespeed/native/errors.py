"""The native transport's exceptions (defined in Rust, one per failure), re-exported by name."""
from .._native import (BrokenGroupError, CollectiveTimeout, MismatchError, PeerAbortedError,
                       PeerDiedError, StrangerError, UnsupportedError, WirespeedError)

__all__ = ["WirespeedError", "PeerDiedError", "PeerAbortedError", "CollectiveTimeout",
           "MismatchError", "UnsupportedError", "StrangerError", "BrokenGroupError"]
