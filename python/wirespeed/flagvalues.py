"""Flag values: telling a flag the user set from one left at its built-in default, so that
combinations whose one flag would be silently ignored can be refused (`--sizes` with `-b`, `-f`
with `-i`); and the readers of number and list-valued flags that several commands share (and
`train --tune --candidates`, whose entries stand for flags)."""
from __future__ import annotations

from .errors import UsageError


class Default(str):
    """A flag's built-in default: neither typed on the command line nor set by its WIRESPEED_*
    environment twin. Behaves as the plain string everywhere else."""


def given(value) -> bool:
    """True when a flag's value came from the command line or its environment twin."""
    return value is not None and not isinstance(value, Default)


def pick(text: str, table: dict, what: str, example: str, key=lambda name: name) -> list:
    """`all` or a comma list of `table`'s names, as the table's values in the order given; a
    one-line UsageError naming the choices for an unknown name or an empty list."""
    names = list(table) if text.strip() == "all" else [t.strip() for t in text.split(",") if t.strip()]
    out = []
    for name in names:
        if key(name) not in table:
            raise UsageError(f"unknown {what} {name!r}: choose from {', '.join(table)} or all")
        out.append(table[key(name)])
    if not out:
        raise UsageError(f"no {what} given: use e.g. {example}")
    return out


def whole_numbers(text, flag: str, noun: str, example: str) -> list[int]:
    """A comma list of whole numbers of 1 or more (-N 2,4 world sizes; --chunks 1,10,100 call
    counts)."""
    try:
        out = [int(n) for n in str(text).split(",") if n.strip()]
    except ValueError:
        raise UsageError(f"{flag} must be a comma list of {noun}, got {text!r}") from None
    if not out or min(out) < 1:
        raise UsageError(f"{flag} needs {noun} of at least 1, e.g. {flag} {example}")
    return out


def parse_num(text, name: str, conv=int):
    """A non-negative, finite number from a flag, or a UsageError naming the flag (float() takes
    "inf" and "nan": a DDP bucket of inf MiB failed 49 s into the run)."""
    try:
        v = conv(text)
    except (TypeError, ValueError, OverflowError):
        raise UsageError(f"{name} must be a number, got {text!r}") from None
    if v != v or v in (float("inf"), float("-inf")):
        raise UsageError(f"{name} must be a finite number, got {text!r}")
    if v < 0:
        raise UsageError(f"{name} must not be negative, got {text!r}")
    return v
