"""What a library's exception means, so every rank reports a fault as the same kind of error with
the same exit status (errors.py), whichever library raised it and whichever rank saw it first.

- wirespeed's own transport raises one typed exception per failure (errors.py: each a subclass of
  the kind it is); a peer that aborted the group passes its reason on ("peer rank 2 failed: timed
  out ..."), so a rank that only heard of a timeout reports a timeout, as the rank that timed out
  does.
- gloo, NCCL and the TCP store raise RuntimeError-like errors whose text says what happened.
"""
from __future__ import annotations

import re

from . import errors
from .errors import (BrokenGroupError, PeerAbortedError, PeerLost, PeerTimeout, RanksDisagree, TransportError,
                     UsageError, WirespeedError)

# Lower-case fragments of library messages, most specific first.
_TIMEOUT_TEXT = ("timed out", "timeout", "deadline exceeded")
_LOST_TEXT = ("connection closed", "connection reset", "broken pipe", "connection refused",
              "econnreset", "epipe", "socket closed", "end of file", "peer closed", "no route to host",
              "network is unreachable", "connection aborted", "ecconnaborted", "read error",
              "write error", "remote process exited", "died",
              # torch's TCPStore client when the rank serving the store has gone (the soak: rank
              # 0 killed in setup ended its peers with status 1)
              "connection was likely closed", "failed to recv")
_MISMATCH_TEXT = ("ranks disagree", "mismatch", "do not match", "don't match")

# gloo prefixes its messages with its source position: "[/path/to/unbound_buffer.cc:78] Timed out".
_SOURCE_PREFIX = re.compile(r"^\[[^\]]*\.(?:cc|cpp|h|hpp):\d+\]\s*")


# torch's text for an exception raised in a future's `then` callback (native/work.py hands DDP such
# futures); a chain of hooks nests it, each level naming the class it wrapped.
_CALLBACK_PREFIX = "Got the following error when running the callback: "
_NAMED = re.compile(r"^(\w+): (.*)$", re.S)


def unwrapped(e: BaseException) -> BaseException:
    """A transport error that came back through torch futures as a RuntimeError, as the typed
    error it was (same class, same text); any other exception as it is."""
    text = str(e)
    inner = None
    while text.startswith(_CALLBACK_PREFIX):
        m = _NAMED.match(text[len(_CALLBACK_PREFIX):])
        if m is None:
            break
        name, text = m.groups()
        cls = getattr(errors, name, None)
        if isinstance(cls, type) and issubclass(cls, TransportError):
            inner = cls(text.splitlines()[0] if text else name)
            break
    return inner if inner is not None else e


def first_line(e: BaseException) -> str:
    text = str(e).strip() or type(e).__name__
    return _SOURCE_PREFIX.sub("", text.splitlines()[0])[:300]


_KINDS = (PeerTimeout, PeerLost, RanksDisagree, UsageError)


def kind_of(e: BaseException) -> type[WirespeedError]:
    """The wirespeed error class a library exception amounts to."""
    e = unwrapped(e)
    text = str(e).lower()
    if isinstance(e, (PeerAbortedError, BrokenGroupError)):
        # The first rank's reason travels with the abort, as text: report what that rank saw.
        if "timed out" in text:
            return PeerTimeout
        if "ranks disagree" in text:
            return RanksDisagree
        if "failed: refused: " in text:   # a stranger refused (StrangerError's text): not a loss
            return WirespeedError
        return PeerLost
    if isinstance(e, WirespeedError) and not isinstance(e, TransportError):
        return type(e)               # wirespeed's own errors are typed
    if isinstance(e, TransportError):
        kind = next((k for k in _KINDS if isinstance(e, k)), None)   # the transport's: by type
        if kind is not None:
            return kind
        # an OS error or a stranger: what its text says, as for any library
    # gloo, NCCL, the TCP store, and transport errors that came back through torch's C++ layer
    # (as a plain RuntimeError): by what their text says.
    if any(t in text for t in _TIMEOUT_TEXT):
        return PeerTimeout
    if any(t in text for t in _LOST_TEXT):
        return PeerLost
    if any(t in text for t in _MISMATCH_TEXT):
        return RanksDisagree
    return WirespeedError


def rank_error(rank: int, e: BaseException) -> WirespeedError:
    """A library exception raised on `rank` as the one-line, typed error the CLI prints. wirespeed's
    own errors are reported as they are; the transport's, like any library's, name the rank."""
    e = unwrapped(e)
    if isinstance(e, WirespeedError) and not isinstance(e, TransportError):
        return e
    return kind_of(e)(f"rank {rank}: {first_line(e)}")
