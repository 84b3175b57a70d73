"""The native transport's exceptions, by the names wirespeed.native has always exported. They are
defined in wirespeed/errors.py, as typed members of the one hierarchy (a timeout is a PeerTimeout,
exit status 3), and raised by the binding (wirespeed._native imports them)."""
from ..errors import (BrokenGroupError, CollectiveTimeout, MismatchError, PeerAbortedError, PeerDiedError,
                      StrangerError, UnsupportedError)
from ..errors import TransportError as WirespeedError

__all__ = ["WirespeedError", "PeerDiedError", "PeerAbortedError", "CollectiveTimeout",
           "MismatchError", "UnsupportedError", "StrangerError", "BrokenGroupError"]
