"""What the model reads from a `wirespeed.bench/1` record, each through one small function.

The harness's timing method and the record's optional fields may change (docs/records.md lets
later versions add fields); keeping every read here means such a change touches one file.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

# Element sizes by dtype name (the records' names), so the model needs no torch.
ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int8": 1, "uint8": 1,
            "int32": 4, "int64": 8}


def time_us(r: dict) -> float:
    """The time the record reports for one collective call (the harness's figure)."""
    return float(r["time_us"])


def size_bytes(r: dict) -> int:
    return int(r["bytes"])


def world_size(r: dict) -> int:
    return int(r["world_size"])


def is_predicted(r: dict) -> bool:
    return bool(r.get("predicted"))


def link_rate_bps(r: dict) -> float | None:
    """The link rate the record knows (runs on the emulated cluster carry it), in bit/s."""
    g = r.get("link_rate_gbps")
    return float(g) * 1e9 if g else None


def host_names(r: dict) -> list[str] | None:
    """rank -> host name, when the run recorded it (every bench run does, in env.hosts)."""
    env = r.get("env") or {}
    hosts = env.get("hosts")
    if isinstance(hosts, list) and len(hosts) == world_size(r):
        return [str(h) for h in hosts]
    return None


def series_key(r: dict) -> tuple:
    """What one fitted model covers: the same library call on the same kind of buffer."""
    return (r["backend"], r["device"], r["collective"], r["dtype"], r.get("op"), bool(r["inplace"]))


@dataclass(frozen=True)
class Layout:
    """Where the ranks of a job sit: host index of each rank (hosts numbered by first rank)."""

    host_of: tuple[int, ...]

    @property
    def world(self) -> int:
        return len(self.host_of)

    @property
    def hosts(self) -> int:
        return len(set(self.host_of))

    @property
    def per_host(self) -> int:
        """The most ranks any one host has."""
        return max(self.ranks_of_host().values())

    def ranks_of_host(self) -> Counter:
        """host -> its number of ranks (one pass: a count per host would be ranks x hosts, hours
        for a what-if of 80,000 ranks on as many hosts)."""
        return Counter(self.host_of)

    def describe(self) -> str:
        counts = sorted(set(self.ranks_of_host().values()))
        k = str(counts[0]) if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
        return f"{self.hosts}x{k}"

    @classmethod
    def blocks(cls, hosts: int, per_host: int) -> "Layout":
        """Ranks 0..K-1 on host 0, K..2K-1 on host 1, ... (torchrun's and srun's order)."""
        return cls(tuple(r // per_host for r in range(hosts * per_host)))


def layout_of(r: dict) -> Layout:
    """The record's layout: from env.hosts when present; else one host, or one rank per host
    for a record that carries a link rate (it ran on the emulated cluster, one rank per host)."""
    if isinstance(r.get("layout"), list) and len(r["layout"]) == world_size(r):  # predicted records
        return Layout(tuple(int(h) for h in r["layout"]))
    names = host_names(r)
    n = world_size(r)
    if names is None:
        return Layout(tuple(range(n))) if link_rate_bps(r) else Layout((0,) * n)
    index: dict[str, int] = {}
    return Layout(tuple(index.setdefault(h, len(index)) for h in names))


def short_host(name: str) -> str:
    """A host's name as a person says it: `wsnet-NAME-h2` (an emulated host) -> `h2`."""
    if name.startswith("wsnet-") and name.count("-") >= 2:
        return name.rsplit("-", 1)[1]
    return name
