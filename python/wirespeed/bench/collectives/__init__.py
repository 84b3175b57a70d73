"""One module per collective; this registry maps CLI names to them in nccl-tests' order."""
from __future__ import annotations

from ...errors import UsageError
from . import (all_gather, all_reduce, all_to_all, barrier, broadcast, reduce, reduce_scatter,
               send_recv)
from .base import Buffers, Case, Collective

COLLECTIVES: dict[str, Collective] = {m.COLLECTIVE.name: m.COLLECTIVE for m in (
    all_reduce, all_gather, reduce_scatter, broadcast, reduce, all_to_all, send_recv, barrier)}


def parse_collectives(text: str) -> list[Collective]:
    names = list(COLLECTIVES) if text.strip() == "all" else [t.strip() for t in text.split(",") if t.strip()]
    out = []
    for name in names:
        key = name.replace("-", "_")
        if key not in COLLECTIVES:
            raise UsageError(f"unknown collective {name!r}: choose from {', '.join(COLLECTIVES)} or all")
        out.append(COLLECTIVES[key])
    if not out:
        raise UsageError("no collective given: use e.g. -c all_reduce or -c all")
    return out


__all__ = ["COLLECTIVES", "Buffers", "Case", "Collective", "parse_collectives"]
