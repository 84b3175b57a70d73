"""Every rank must run the same sweep. Under an outside launcher each rank parses its own command
line and environment, and a rank with another size list or dtype would meet its peers in the
wrong collective: a hang, a wrong result or a library crash far from the cause. One exchange of a
fingerprint of the settings before the first collective turns that into a clear mismatch error."""
from __future__ import annotations

import hashlib

from ..errors import RanksDisagree

# What decides which collectives run, in which order and with which buffers (and, tracing, what
# each case's gather holds). Outputs, progress and the timeout may differ between ranks without harm.
AGREED = ("collectives", "dtypes", "ops", "sizes", "warmup_iters", "iters", "backend", "device",
          "root", "check", "plan", "tracing")


def fingerprint(cfg) -> list[float]:
    """The settings' hash as two 48-bit integers, each exact in the float64 the exchange uses."""
    text = repr([(name, getattr(cfg, name, None)) for name in AGREED])
    digest = hashlib.sha256(text.encode()).digest()
    return [float(int.from_bytes(digest[i:i + 6], "big")) for i in (0, 6)]


def check_same_settings(backend, cfg, rank: int) -> None:
    rows = backend.allgather_floats(fingerprint(cfg))
    odd = [r for r, row in enumerate(rows) if row != rows[0]]
    if odd:
        who = ("rank " if len(odd) == 1 else "ranks ") + ", ".join(map(str, odd))
        raise RanksDisagree(f"rank {rank}: {who} run{'s' if len(odd) == 1 else ''} other bench "
                            "settings than rank 0 (collectives, dtypes, ops, sizes, iterations, "
                            "root or checking): give every rank the same command line and "
                            "WIRESPEED_* environment")
