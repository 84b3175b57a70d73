"""Refuse a sweep whose buffers cannot fit before anything is allocated, naming the size that fits."""
from __future__ import annotations

from ..bench.collectives import COLLECTIVES
from ..bench.dtypes import DTYPES
from ..bench.verifiable import CHUNK_ELEMS
from ..errors import UsageError
from ..sizes import format_size

# What a rank holds besides its buffers: the torch runtime and the checker's int64 temporaries.
RANK_OVERHEAD_BYTES = 400 << 20
CHECK_TEMP_BYTES = 5 * 8 * CHUNK_ELEMS


def available_bytes(device: str) -> int:
    if device == "cuda":
        import torch
        free, _total = torch.cuda.mem_get_info()
        return free
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("cannot read MemAvailable from /proc/meminfo")


def check_local_ranks(nproc: int, available: int | None = None) -> None:
    """Every command that starts ranks on this host refuses, with this one message, more ranks
    than the host's memory holds for their torch runtimes alone (each rank is a process that
    imports torch), before any buffer is counted: `-N 1000` on a small machine would start a
    thousand processes only to have them swap or be killed."""
    avail = available_bytes("cpu") if available is None else available
    fit = int(avail * 0.9 // RANK_OVERHEAD_BYTES)
    if nproc <= fit:
        return
    need = nproc * RANK_OVERHEAD_BYTES / (1 << 30)
    hint = f"use -N {fit} or fewer" if fit >= 1 else "free some memory first"
    raise UsageError(f"-N {nproc}: {nproc} ranks on this host need {need:.1f} GiB of memory for "
                     f"their torch runtimes alone ({RANK_OVERHEAD_BYTES >> 20} MiB each) but "
                     f"{avail / (1 << 30):.1f} GiB is available; {hint}")


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
    avail = available_bytes(device) if available is None else available
    # GPU ranks each have their own device; CPU ranks on this host share its memory.
    sharers = 1 if device == "cuda" else ranks_here
    overhead = 0 if device == "cuda" else RANK_OVERHEAD_BYTES * ranks_here
    budget = avail * 0.9 - overhead

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
