"""Telling a flag the user set from one left at its built-in default, so that combinations whose
one flag would be silently ignored can be refused (`--sizes` with `-b`, `-f` with `-i`)."""
from __future__ import annotations


class Default(str):
    """A flag's built-in default: neither typed on the command line nor set by its WIRESPEED_*
    environment twin. Behaves as the plain string everywhere else."""


def given(value) -> bool:
    """True when a flag's value came from the command line or its environment twin."""
    return value is not None and not isinstance(value, Default)
