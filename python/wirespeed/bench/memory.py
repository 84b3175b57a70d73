"""Refuse a sweep whose buffers cannot fit before anything is allocated, naming the size that fits."""
from __future__ import annotations

from ..errors import UsageError
from ..launch.memory import buffer_budget, check_local_ranks
from ..sizes import format_size
from .collectives import COLLECTIVES
from .dtypes import DTYPES
from .verifiable import CHUNK_ELEMS

# What a rank holds besides its buffers and its runtime: the checker's int64 temporaries.
CHECK_TEMP_BYTES = 5 * 8 * CHUNK_ELEMS


def rank_bytes(collectives, dtypes, nbytes: int, world: int) -> int:
    """Peak bytes one rank allocates for the largest case at this size: send + receive + checking."""
    peak = 0
    for cname in collectives:
        coll = COLLECTIVES[cname]
        for dname in dtypes:
            dt = DTYPES[dname]
            _, send, recv = coll.counts(nbytes, dt.itemsize, world)
            peak = max(peak, (send + recv) * dt.itemsize)
    return peak + CHECK_TEMP_BYTES


def check_fits(collectives, dtypes, sizes, world: int, ranks_here: int, device: str,
               available: int | None = None) -> None:
    check_local_ranks(ranks_here, available if device != "cuda" else None)
    if not sizes:
        return
    sharers, budget = buffer_budget(device, ranks_here, available)

    def need(n):
        return rank_bytes(collectives, dtypes, n, world) * sharers

    top = max(sizes)
    if need(top) <= budget:
        return
    fitting = [s for s in sorted(sizes) if need(s) <= budget]
    where = "GPU memory" if device == "cuda" else f"memory for {ranks_here} local ranks"
    hint = (f"the largest size that fits is {format_size(fitting[-1])}: use -e {format_size(fitting[-1])}"
            if fitting else "no size of this sweep fits: use fewer ranks or smaller sizes")
    raise UsageError(f"a {format_size(top)} sweep needs {need(top) / (1 << 30):.1f} GiB of {where} "
                     f"but {max(budget, 0) / (1 << 30):.1f} GiB is available; {hint}")
