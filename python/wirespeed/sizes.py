"""Byte sizes as nccl-tests writes them: 8, 32K, 128M, 1G (binary units: K = 1024)."""
from __future__ import annotations

import re

from .errors import UsageError
from .flagvalues import given

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "KIB": 1 << 10, "M": 1 << 20, "MB": 1 << 20,
          "MIB": 1 << 20, "G": 1 << 30, "GB": 1 << 30, "GIB": 1 << 30, "T": 1 << 40, "TB": 1 << 40,
          "TIB": 1 << 40}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")


def scaled(text, pattern: re.Pattern, units: dict, fold, error: str) -> float:
    """`text`'s number times its unit's factor, read with `pattern` (a number, then a unit that
    `fold` normalises: str.upper, str.lower); a UsageError saying `error` when it does not parse
    or the unit is not one of `units`. Sizes here, rates and times in plans/topology.py."""
    m = pattern.match(str(text))
    unit = fold(m.group(2)) if m else None
    if not m or unit not in units:
        raise UsageError(error)
    return float(m.group(1)) * units[unit]


def parse_size(text: str) -> int:
    """'32K' -> 32768. Raises UsageError with the accepted forms on anything else."""
    value = scaled(text, _SIZE_RE, _UNITS, str.upper,
                   f"size {text!r} does not parse: use a number of bytes with an optional K, M, G or T "
                   "suffix (binary units), e.g. 8, 32K, 128M, 1G")
    if value != int(value):
        raise UsageError(f"size {text!r} is not a whole number of bytes")
    return int(value)


def format_size(nbytes: int) -> str:
    """32768 -> '32K': the shortest exact binary-unit form, as the sweep flags accept it back."""
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale}{unit}"
    return str(nbytes)


def human_bytes(n: int) -> str:
    """32768 -> '32 KiB', 1.5 MiB -> '1.5 MiB': a size for people (tables, plots, messages), where
    format_size gives the form the flags read back."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            v = n / scale
            return f"{v:.0f} {unit}" if v == int(v) else f"{v:.1f} {unit}"
    return f"{n} B"


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
    """The sizes a command's flags ask for: --sizes as a list, else the -b/-e/-f (or -i) sweep.
    Flags that would be silently ignored are refused: -b/-e/-f/-i next to --sizes (which lists every
    size itself), and -f next to -i (both say how to step)."""
    if sizes is not None:
        out = [parse_size(s) for s in str(sizes).split(",") if s.strip()]
        if not out:
            raise UsageError("--sizes is empty: give a comma list such as 4K,1M,64M, or leave it out "
                             "to sweep -b/-e")
        clash = [flag for flag, v in (("-b/--minbytes", minbytes), ("-e/--maxbytes", maxbytes),
                                      ("-f/--stepfactor", stepfactor), ("-i/--stepbytes", stepbytes))
                 if given(v)]
        if clash:
            raise UsageError(f"--sizes lists every size itself, so {' and '.join(clash)} would be "
                             "ignored: give --sizes or the sweep flags, not both")
        return out
    if stepbytes is not None and given(stepfactor):
        raise UsageError("-f/--stepfactor and -i/--stepbytes both set the step (multiply or add): "
                         "give one of them")
    try:
        factor = float(stepfactor)
    except (TypeError, ValueError):
        raise UsageError(f"--stepfactor must be a number, got {stepfactor!r}") from None
    return sweep(parse_size(minbytes), parse_size(maxbytes), factor,
                 parse_size(stepbytes) if stepbytes is not None else None)
