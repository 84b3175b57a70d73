"""Byte sizes as nccl-tests writes them: 8, 32K, 128M, 1G (binary units: K = 1024)."""
from __future__ import annotations

import re

from .errors import UsageError

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "KIB": 1 << 10, "M": 1 << 20, "MB": 1 << 20,
          "MIB": 1 << 20, "G": 1 << 30, "GB": 1 << 30, "GIB": 1 << 30, "T": 1 << 40, "TB": 1 << 40,
          "TIB": 1 << 40}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")


def parse_size(text: str) -> int:
    """'32K' -> 32768. Raises UsageError with the accepted forms on anything else."""
    m = _SIZE_RE.match(str(text))
    unit = m.group(2).upper() if m else None
    if not m or unit not in _UNITS:
        raise UsageError(f"size {text!r} does not parse: use a number of bytes with an optional "
                         "K, M, G or T suffix (binary units), e.g. 8, 32K, 128M, 1G")
    value = float(m.group(1)) * _UNITS[unit]
    if value != int(value):
        raise UsageError(f"size {text!r} is not a whole number of bytes")
    return int(value)


def format_size(nbytes: int) -> str:
    """32768 -> '32K': the shortest exact binary-unit form, as the sweep flags accept it back."""
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale}{unit}"
    return str(nbytes)


def sweep(minbytes: int, maxbytes: int, stepfactor: float | None = 2.0,
          stepbytes: int | None = None) -> list[int]:
    """The sizes nccl-tests visits: multiply by stepfactor (or add stepbytes) from min up to max."""
    if minbytes < 0 or maxbytes < 0:
        raise UsageError("sizes must not be negative")
    if minbytes > maxbytes:
        raise UsageError(f"--minbytes ({format_size(minbytes)}) is larger than --maxbytes "
                         f"({format_size(maxbytes)}): swap them")
    sizes = []
    if stepbytes is not None:
        if stepbytes <= 0:
            raise UsageError("--stepbytes must be positive")
        size = minbytes
        while size <= maxbytes:
            sizes.append(size)
            size += stepbytes
        return sizes
    if stepfactor is None or stepfactor <= 1:
        raise UsageError("--stepfactor must be larger than 1 (or use --stepbytes)")
    size = minbytes
    while size <= maxbytes:
        sizes.append(size)
        if size == 0:
            size = 1
            continue
        nxt = int(size * stepfactor)
        size = nxt if nxt > size else size + 1
    return sizes


def sizes_from_flags(sizes: str | None, minbytes: str, maxbytes: str, stepfactor: str,
                     stepbytes: str | None = None) -> list[int]:
    """The sizes a command's flags ask for: --sizes as a list, else the -b/-e/-f (or -i) sweep."""
    if sizes:
        out = [parse_size(s) for s in sizes.split(",") if s.strip()]
        if not out:
            raise UsageError("--sizes is empty: give a comma list such as 4K,1M,64M")
        return out
    try:
        factor = float(stepfactor)
    except (TypeError, ValueError):
        raise UsageError(f"--stepfactor must be a number, got {stepfactor!r}") from None
    return sweep(parse_size(minbytes), parse_size(maxbytes), factor,
                 parse_size(stepbytes) if stepbytes else None)
