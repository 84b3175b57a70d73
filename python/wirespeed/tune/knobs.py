"""The knobs `wirespeed tune` can sweep: one row per knob, so adding one is a line.

Every knob is an environment variable a library reads when it starts (which is why each setting
runs in processes of its own). `group` names knobs swept together (every combination of their
values, as NCCL's socket threads x sockets per thread); other knobs are swept one at a time with
the rest at their defaults. `where` says where a knob acts: "any", "one-host" (shared memory
between ranks of one host) or "across-hosts" (the network between hosts); the default subset of a
run takes the `default` rows that act where its ranks are. The values are the ones worth trying,
not every legal one; `--values NAME=a,b` replaces them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..errors import UsageError


@dataclass(frozen=True)
class Knob:
    backend: str
    name: str
    values: tuple[str, ...]
    where: str = "any"
    default: bool = False     # in the subset swept when no --knobs is given
    group: str = ""           # knobs of one group are swept jointly; "" = on its own
    meaning: str = ""


KNOBS: tuple[Knob, ...] = (
    # NCCL (docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html)
    Knob("nccl", "NCCL_ALGO", ("Ring", "Tree"), default=True, meaning="collective algorithm"),
    Knob("nccl", "NCCL_PROTO", ("LL", "LL128", "Simple"), default=True, meaning="protocol"),
    Knob("nccl", "NCCL_MIN_NCHANNELS", ("2", "4", "8", "16"), meaning="fewest channels (rings)"),
    Knob("nccl", "NCCL_MAX_NCHANNELS", ("1", "2", "4", "8"), meaning="most channels (rings)"),
    Knob("nccl", "NCCL_SOCKET_NTHREADS", ("1", "2", "4"), "across-hosts", True, "sockets",
         "helper threads per socket connection"),
    Knob("nccl", "NCCL_NSOCKS_PERTHREAD", ("1", "2", "4", "8"), "across-hosts", True, "sockets",
         "sockets per helper thread"),
    Knob("nccl", "NCCL_BUFFSIZE", ("1048576", "16777216"), meaning="buffer per channel (default 4 MiB)"),
    # wirespeed's own transport (docs/transport.md)
    Knob("wirespeed", "WIRESPEED_ALGO", ("oneshot", "rsag"), "one-host", True,
         meaning="all_reduce algorithm among ranks of one host"),
    Knob("wirespeed", "WIRESPEED_ALGO", ("hier", "ring", "doubling"), "across-hosts", True,
         meaning="all_reduce algorithm across hosts"),
    Knob("wirespeed", "WIRESPEED_NSTREAMS", ("1", "4", "8", "16"), "across-hosts", True,
         meaning="TCP streams per pair of ranks"),
    Knob("wirespeed", "WIRESPEED_CHUNK_BYTES", ("65536", "2097152"), "across-hosts", True,
         meaning="chunk of a message given to one stream (default 512 KiB)"),
    Knob("wirespeed", "WIRESPEED_IO_THREADS", ("1", "2", "4"), "across-hosts",
         meaning="TCP reactor threads per process"),
)

# Combinations of a group that the library refuses or clamps, so they are not run.
GROUP_RULES: dict[str, Callable[[dict[str, str]], bool]] = {
    # NCCL caps threads x sockets at 64 per connection.
    "sockets": lambda s: int(s.get("NCCL_SOCKET_NTHREADS", 1)) * int(s.get("NCCL_NSOCKS_PERTHREAD", 1)) <= 64,
}


def backends() -> list[str]:
    return list(dict.fromkeys(k.backend for k in KNOBS))


def knob_names(backend: str) -> list[str]:
    return list(dict.fromkeys(k.name for k in KNOBS if k.backend == backend))


def acts_here(knob: Knob, across_hosts: bool, one_host: bool) -> bool:
    return knob.where == "any" or (knob.where == "across-hosts" and across_hosts) or \
        (knob.where == "one-host" and one_host)


def select(backend: str, names: list[str] | None, every: bool, across_hosts: bool, one_host: bool,
           values: dict[str, list[str]] | None = None) -> tuple[list[Knob], list[str]]:
    """The knobs to sweep and notes for the header. names: --knobs (None: the default subset, or
    every knob of the backend with every=True); a knob named but acting elsewhere is swept with a
    note; values: --values overrides."""
    if backend not in backends():
        raise UsageError(f"tune knows no knobs of backend {backend!r}: choose from "
                         f"{', '.join(backends())} (or add rows to wirespeed/tune/knobs.py)")
    rows = [k for k in KNOBS if k.backend == backend]
    notes = []
    if names is None:
        chosen = [k for k in rows if (every or k.default) and acts_here(k, across_hosts, one_host)]
    else:
        chosen = []
        for name in names:
            mine = [k for k in rows if k.name == name]
            if not mine:
                raise UsageError(f"unknown {backend} knob {name!r}: choose from {', '.join(knob_names(backend))}")
            here = [k for k in mine if acts_here(k, across_hosts, one_host)]
            if not here:
                notes.append(f"{name} acts {mine[0].where.replace('-', ' ')} only; these ranks are "
                             f"{'on one host' if one_host and not across_hosts else 'on hosts of their own'}")
            chosen += here or mine[:1]
    for name, vals in (values or {}).items():
        if name not in knob_names(backend):
            raise UsageError(f"--values {name}: not a {backend} knob ({', '.join(knob_names(backend))})")
        if not any(k.name == name for k in chosen):
            raise UsageError(f"--values {name}: {name} is not swept here; add it to --knobs")
        chosen = [Knob(k.backend, k.name, tuple(vals), k.where, k.default, k.group, k.meaning)
                  if k.name == name else k for k in chosen]
    if not chosen:
        raise UsageError(f"no {backend} knob acts where these ranks run: name some with --knobs "
                         f"({', '.join(knob_names(backend))})")
    return chosen, notes


def parse_values(items: list[str] | None) -> dict[str, list[str]]:
    """--values NAME=a,b (repeatable)."""
    out: dict[str, list[str]] = {}
    for item in items or []:
        name, sep, rest = item.partition("=")
        vals = [v.strip() for v in rest.split(",") if v.strip()]
        if not sep or not name.strip() or not vals:
            raise UsageError(f"--values takes NAME=v1,v2, got {item!r}")
        out[name.strip()] = vals
    return out
