"""Hosts files as mpirun and MXNet's launcher read them, plus the emulated cluster's hosts.

    # comment
    node01 slots=8        Open MPI's form
    node02:8              MPICH's form
    node03                one host per line (MXNet): slots from -N, else 1
    netns:wsnet-ws-h0     a network namespace on this machine (`wirespeed cluster up`): started
                          by entering it (as `wirespeed cluster exec`) instead of ssh, so
                          tests and demos need no sshd

Each host appears once; its ranks are numbered in file order, all of a host's ranks before the next
host's (the placement mpirun calls --map-by slot and torchrun uses).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import UsageError

_SLOTS = re.compile(r"^slots\s*=\s*(\d+)$")
_HOST = re.compile(r"^[A-Za-z0-9_.\-\[\]:@%]+$")


@dataclass(frozen=True)
class HostEntry:
    name: str               # what ssh connects to, or the namespace's name
    slots: int | None       # from the file; None when the file did not say
    netns: bool = False

    @property
    def label(self) -> str:
        return f"netns:{self.name}" if self.netns else self.name


def parse_hosts(text: str, source: str = "hosts file") -> list[HostEntry]:
    hosts: list[HostEntry] = []
    seen = set()
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        where = f"{source} line {lineno}"
        words = line.split()
        name, slots = words[0], None
        for w in words[1:]:
            m = _SLOTS.match(w.replace(" ", ""))
            if m:
                slots = int(m.group(1))
            elif w.startswith("max_slots=") or w.startswith("max-slots="):
                continue  # Open MPI's oversubscription limit: nothing to do with placement here
            else:
                raise UsageError(f"{where}: cannot read {w!r}: write `host`, `host slots=N`, "
                                 "`host:N` or `netns:NAME`")
        netns = name.startswith("netns:")
        if netns:
            name = name[len("netns:"):]
        elif name.count(":") == 1 and name.rsplit(":", 1)[1].isdigit():  # MPICH's host:N
            if slots is not None:
                raise UsageError(f"{where}: {words[0]!r} gives slots twice")
            name, slots = name.rsplit(":", 1)[0], int(name.rsplit(":", 1)[1])
        if not name or not _HOST.match(name):
            raise UsageError(f"{where}: {name!r} is not a host name")
        if slots is not None and slots < 1:
            raise UsageError(f"{where}: slots must be at least 1")
        key = (name, netns)
        if key in seen:
            raise UsageError(f"{where}: host {name!r} is listed twice: give it slots=N once instead")
        seen.add(key)
        hosts.append(HostEntry(name, slots, netns))
    if not hosts:
        raise UsageError(f"{source} lists no hosts: write one host per line (`node01 slots=4`)")
    return hosts


def read_hosts(path: str) -> list[HostEntry]:
    try:
        with open(path) as f:
            text = f.read()
    except OSError as e:
        raise UsageError(f"cannot read hosts file {path!r}: {e.strerror}") from None
    return parse_hosts(text, path)


def ranks_per_host(hosts: list[HostEntry], per_host: int | None) -> list[int]:
    """-N wins for every host; else each host's slots; else 1."""
    if per_host is not None:
        if per_host < 1:
            raise UsageError("-N must be at least 1")
        return [per_host] * len(hosts)
    return [h.slots or 1 for h in hosts]
