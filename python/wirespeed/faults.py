"""What a library's exception means, so every rank reports a fault as the same kind of error with
the same exit status (errors.py), whichever library raised it and whichever rank saw it first.

- wirespeed's own transport raises one exception class per failure; a peer that aborted the group
  passes its reason on ("peer rank 2 failed: timed out ..."), so a rank that only heard of a
  timeout reports a timeout, as the rank that timed out does.
- gloo, NCCL and the TCP store raise RuntimeError-like errors whose text says what happened.
"""
from __future__ import annotations

import re

from .errors import (PeerLost, PeerTimeout, RanksDisagree, UsageError, WirespeedError)

# Lower-case fragments of library messages, most specific first.
_TIMEOUT_TEXT = ("timed out", "timeout", "deadline exceeded")
_LOST_TEXT = ("connection closed", "connection reset", "broken pipe", "connection refused",
              "econnreset", "epipe", "socket closed", "end of file", "peer closed", "no route to host",
              "network is unreachable", "connection aborted", "ecconnaborted", "read error",
              "write error", "remote process exited", "died")
_MISMATCH_TEXT = ("ranks disagree", "mismatch", "do not match", "don't match")

# gloo prefixes its messages with its source position: "[/path/to/unbound_buffer.cc:78] Timed out".
_SOURCE_PREFIX = re.compile(r"^\[[^\]]*\.(?:cc|cpp|h|hpp):\d+\]\s*")


def first_line(e: BaseException) -> str:
    text = str(e).strip() or type(e).__name__
    return _SOURCE_PREFIX.sub("", text.splitlines()[0])[:300]


def kind_of(e: BaseException) -> type[WirespeedError]:
    """The wirespeed error class a library exception amounts to."""
    if isinstance(e, WirespeedError):
        return type(e)
    name = type(e).__name__
    text = str(e).lower()
    # wirespeed's own transport (wirespeed._native), by class: no import of the native module.
    if name in ("CollectiveTimeout",):
        return PeerTimeout
    if name in ("MismatchError",):
        return RanksDisagree
    if name in ("UnsupportedError",):
        return UsageError
    if name in ("PeerDiedError",):
        return PeerLost
    if name in ("PeerAbortedError", "BrokenGroupError"):
        # The first rank's reason travels with the abort: report what it saw.
        if "timed out" in text:
            return PeerTimeout
        if "ranks disagree" in text:
            return RanksDisagree
        return PeerLost
    if any(t in text for t in _TIMEOUT_TEXT):
        return PeerTimeout
    if any(t in text for t in _LOST_TEXT):
        return PeerLost
    if any(t in text for t in _MISMATCH_TEXT):
        return RanksDisagree
    return WirespeedError


def rank_error(rank: int, e: BaseException) -> WirespeedError:
    """A library exception raised on `rank` as the one-line, typed error the CLI prints."""
    if isinstance(e, WirespeedError):
        return e
    return kind_of(e)(f"rank {rank}: {first_line(e)}")
