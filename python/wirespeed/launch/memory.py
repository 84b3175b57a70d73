"""How much memory this host has for ranks, and refusing more ranks than it holds. (Whether a
bench sweep's buffers fit is bench/memory.py's.)"""
from __future__ import annotations

from ..errors import UsageError

# What a rank holds besides its buffers: the torch runtime.
RANK_OVERHEAD_BYTES = 400 << 20


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


def buffer_budget(device: str, ranks_here: int, available: int | None = None) -> tuple[int, float]:
    """(ranks that share this memory, the bytes all of them may use for their buffers): GPU ranks
    each have their own device; CPU ranks of this host share its memory, less their torch
    runtimes; a tenth stays free. `available` stands in for the measured figure (tests)."""
    avail = available_bytes(device) if available is None else available
    if device == "cuda":
        return 1, avail * 0.9
    return ranks_here, avail * 0.9 - RANK_OVERHEAD_BYTES * ranks_here


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
