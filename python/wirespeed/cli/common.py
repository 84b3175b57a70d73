"""Helpers every subcommand shares: environment twins of flags, and one-line errors."""
from __future__ import annotations

import argparse
import os
import sys
from typing import NoReturn

from ..errors import UsageError
from ..flagvalues import Default
from ..knobs import CORE
from ..knobs import twin as env_twin   # --max-bytes -> WIRESPEED_MAX_BYTES: every flag has one


def add(parser: argparse.ArgumentParser, *names, default=None, help="", twin: str | None = None,
        same_as_core: bool = False, **kw):
    """add_argument whose default comes from the flag's WIRESPEED_* twin when that is set.

    A twin may not be a core knob (knobs.py), or the user's knob would silently become the flag's
    value (and compare/tune would drop it): give such a flag another `twin`, or say it means the
    same as the knob (`same_as_core`, as launch's --ifname and WIRESPEED_IFNAME)."""
    long = next(n for n in names if n.startswith("--"))
    twin = twin or env_twin(long)
    if twin in CORE and not same_as_core:
        raise AssertionError(f"{long}'s environment twin {twin} is a core knob: give the flag another twin")
    if twin in os.environ:
        raw = os.environ[twin]
        if kw.get("action") in ("store_true", "store_false"):
            default = raw.strip().lower() in ("1", "true", "yes", "on")
        else:
            default = raw
    elif isinstance(default, str):
        default = Default(default)  # so validation can tell it from a value the user gave
    return parser.add_argument(*names, default=default, help=f"{help} [env {twin}]".strip(), **kw)


class Parser(argparse.ArgumentParser):
    """argparse, but errors are one line and exit 2 (no usage dump)."""

    def error(self, message):
        fail(UsageError(f"{message} (see `{self.prog} --help`)"))


def fail(err: Exception) -> NoReturn:
    code = getattr(err, "exit_code", 1)
    sys.stderr.write(f"wirespeed: error: {err}\n")
    sys.exit(code)


def positive_int(name, minimum: int = 0):
    """argparse type: a whole number of at least `minimum`, or a one-line UsageError naming the flag."""
    def conv(text):
        try:
            v = int(text)
        except ValueError:
            raise UsageError(f"{name} must be a whole number, got {text!r}") from None
        if v < minimum:
            raise UsageError(f"{name} must not be negative, got {v}" if minimum == 0
                             else f"{name} must be at least {minimum}, got {v}")
        return v
    return conv
