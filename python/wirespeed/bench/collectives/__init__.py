"""One module per collective; this registry maps CLI names to them in nccl-tests' order."""
from __future__ import annotations

from ...flagvalues import pick
from . import (all_gather, all_reduce, all_to_all, barrier, broadcast, reduce, reduce_scatter,
               send_recv)
from .base import Buffers, Case, Collective

COLLECTIVES: dict[str, Collective] = {m.COLLECTIVE.name: m.COLLECTIVE for m in (
    all_reduce, all_gather, reduce_scatter, broadcast, reduce, all_to_all, send_recv, barrier)}


def parse_collectives(text: str) -> list[Collective]:
    return pick(text, COLLECTIVES, "collective", "-c all_reduce or -c all", key=lambda n: n.replace("-", "_"))
