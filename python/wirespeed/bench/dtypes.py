"""Data types and reduction ops by the names the CLI takes, with what checking needs to know of each."""
from __future__ import annotations

from dataclasses import dataclass

from ..flagvalues import pick


@dataclass(frozen=True)
class DType:
    name: str          # CLI / record name
    short: str         # nccl-tests' table name
    itemsize: int
    is_float: bool
    signed: bool
    # Largest magnitude every integer up to which is exactly representable: sums of verifiable data
    # stay below it, so any reduction order gives the same exact result.
    exact_limit: int

    @property
    def torch(self):
        import torch
        return getattr(torch, self.name)


DTYPES: dict[str, DType] = {d.name: d for d in (
    DType("float32", "float", 4, True, True, 1 << 24),
    DType("float16", "half", 2, True, True, 1 << 11),
    DType("bfloat16", "bfloat16", 2, True, True, 1 << 8),
    DType("float64", "double", 8, True, True, 1 << 53),
    DType("int8", "int8", 1, False, True, (1 << 7) - 1),
    DType("uint8", "uint8", 1, False, False, (1 << 8) - 1),
    DType("int32", "int32", 4, False, True, (1 << 31) - 1),
    DType("int64", "int64", 8, False, True, (1 << 63) - 1),
)}

OPS = ("sum", "prod", "min", "max", "avg")


def parse_dtypes(text: str) -> list[DType]:
    return pick(text, DTYPES, "dtype", "-d float32 or -d all")


def parse_ops(text: str) -> list[str]:
    return pick(text, {op: op for op in OPS}, "op", "-o sum or -o all")
