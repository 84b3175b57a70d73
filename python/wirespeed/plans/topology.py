"""The machine `plan simulate` times a plan on: hosts of ranks and the links between them.

Per channel type a bandwidth and a latency, as docs/plans-simulate.md describes:
- memory: a memory channel between two ranks of one host (NVLink-class), per ordered pair; with
  `fabric` also each rank's own port into the fabric (an NVSwitch port), per direction, shared by
  all of the rank's memory-channel traffic;
- port: a NIC, shared by the port-channel traffic of the ranks that use it, each direction apart;
  `nics-per-host` NICs per host, a rank using NIC (its index on the host) mod nics-per-host;
- switch: each rank's port to the multimem switch, per direction;
- copy: local copies and reductions (a rank's memory bandwidth, shared by its thread blocks);
- op: what issuing one operation costs a thread block, whatever it moves;
- cores: the cores of the one machine every rank runs on (an emulated cluster); with more ranks
  than cores each rank gets cores/ranks of one, and its CPU work (op, copy) slows by as much;
- port-fanin: a NIC's inbound rate while port traffic from another host queues behind the
  transfer it carries (several hosts sending into one link at once: TCP incast loses goodput
  to the shared queue); unset, the `port` rate;
- proxy-copy: a port proxy that copies a put's source before sending it, in pieces of this many
  bytes (wirespeed's executor); the first piece's copy delays the wire, the rest overlap it.

Written inline (`ranks-per-host=4,memory=150GB/s:0.8us,port=12.5GB/s:5us,op=0.2us`), optionally
after a preset's name that the keys then override (`nvlink-ib,ranks-per-host=4`), or as a JSON
file with the same keys (`{"preset": "nvlink-ib", "port": "25GB/s:3us"}`).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace

from ..errors import UsageError
from ..sizes import scaled

GB = 1e9   # rates are decimal (GB/s = 1e9 bytes/s), as nccl-tests and docs/metrics.md write them


@dataclass(frozen=True)
class Link:
    bandwidth: float          # bytes per second
    latency: float = 0.0      # seconds

    def text(self) -> str:
        lat = f" {self.latency * 1e6:.3g} us" if self.latency else ""
        return f"{self.bandwidth / GB:.4g} GB/s{lat}"


@dataclass(frozen=True)
class Topology:
    name: str
    ranks_per_host: int
    memory: Link
    port: Link
    switch: Link
    copy: float               # bytes copied per second (a copy reads and writes each byte once)
    op: float                 # seconds a thread block spends issuing one op
    fabric: float | None = None   # bytes/s of each rank's memory-channel port, per direction
    nics_per_host: int = 1
    cores: int | None = None      # cores shared by all ranks (one machine); None: a core per rank
    proxy_copy: int = 0           # bytes per piece a port proxy copies before sending; 0: none
    port_fanin: float | None = None   # bytes/s into a NIC while several hosts send to it; None: port's

    def cpu_slowdown(self, nranks: int) -> float:
        """How much longer a rank's CPU work takes when nranks share the machine's cores."""
        return max(1.0, nranks / self.cores) if self.cores else 1.0

    def host(self, rank: int) -> int:
        return rank // self.ranks_per_host

    def nic(self, rank: int) -> tuple[int, int]:
        return self.host(rank), (rank % self.ranks_per_host) % self.nics_per_host

    def describe(self) -> str:
        n = min(self.nics_per_host, self.ranks_per_host)    # a NIC no rank uses is not there
        nics = f"{n} NICs" if n > 1 else "one NIC"
        fabric = f", fabric port {self.fabric / GB:.4g} GB/s per rank and direction" if self.fabric else ""
        ranks = f"{self.ranks_per_host} rank{'s' if self.ranks_per_host > 1 else ''}"
        cpu = f"; {self.cores} cores shared by all ranks" if self.cores else ""
        proxy = f"; port proxies copy in pieces of {self.proxy_copy} B" if self.proxy_copy else ""
        if self.port_fanin:
            proxy += f"; a NIC {self.port_fanin / GB:.4g} GB/s in while several hosts send to it"
        return (f"topology {self.name}: {ranks} per host, {nics} per host; memory "
                f"channels {self.memory.text()} per pair and direction{fabric}; port channels "
                f"{self.port.text()} per NIC and direction; switch {self.switch.text()} per rank and "
                f"direction; local copy {self.copy / GB:.4g} GB/s; {self.op * 1e6:.3g} us per op{cpu}{proxy}")

    def as_dict(self) -> dict:
        return {"name": self.name, "ranks_per_host": self.ranks_per_host, "nics_per_host": self.nics_per_host,
                "memory": {"bandwidth": self.memory.bandwidth, "latency": self.memory.latency},
                "fabric": self.fabric,
                "port": {"bandwidth": self.port.bandwidth, "latency": self.port.latency},
                "switch": {"bandwidth": self.switch.bandwidth, "latency": self.switch.latency},
                "copy": self.copy, "op": self.op, "cores": self.cores, "proxy_copy": self.proxy_copy,
                "port_fanin": self.port_fanin}


# ---- presets: every number says where it comes from ----

# A DGX-H100-class box with InfiniBand, from datasheets (to be calibrated against a measurement):
# - NVLink 4: 900 GB/s per GPU both ways together, so 450 GB/s each way, through NVSwitch to any
#   peer: a pair may use it all (memory 450 GB/s) but a rank's peers share it (fabric 450 GB/s).
#   0.7 us: an NVLink store made visible to a peer's polling load plus the fence, the order of
#   the small-message latencies NVIDIA and MSCCL++ report (a few us for a whole collective).
# - IB: one ConnectX-7 NDR NIC per GPU (8 per host), 400 Gbit/s = 50 GB/s; 5 us: RDMA write
#   latency (~2 us) plus MSCCL++'s CPU proxy picking the request up.
# - NVLS (multimem): the same NVSwitch port, 450 GB/s each way; 1 us for a multimem load-reduce.
# - copy: HBM3 3.35 TB/s read+write together, so about 1.5 TB/s of bytes copied (a copy moves each
#   byte twice).
# - op: 0.2 us, the executor decoding an op and syncing the block's threads between ops.
NVLINK_IB = Topology("nvlink-ib", ranks_per_host=8, memory=Link(450 * GB, 0.7e-6), port=Link(50 * GB, 5e-6),
                     switch=Link(450 * GB, 1e-6), copy=1500 * GB, op=0.2e-6, fabric=450 * GB, nics_per_host=8)

# wirespeed's own CPU execution of a plan over the emulated cluster (docs/cluster.md), one rank
# per emulated host as `bench --cluster` places them by default:
# - port: `cluster up --rate 1gbit` carries 951-955 Mbit/s of TCP (docs/cluster.md: 1448/1514 of
#   the cap), so 0.119 GB/s; 50 us: a veth hop and a TCP round of small messages between Python
#   processes, TO BE CALIBRATED (with --delay, add it here).
# - memory: ranks on one host exchange through shared memory: a copy of data another core just
#   wrote runs at 10-13 GB/s (docs/small-messages.md, 1 MiB: 10 GB/s); 2 us: a sync point between
#   two processes is 0.25-0.8 us in Rust, more from Python, TO BE CALIBRATED.
# - switch: a CPU has no multimem; the emulation loads each member's copy, so memory's figures.
# - copy: 30 GB/s, the local copy rate the native cost model carries (docs/small-messages.md).
# - op: 20 us of Python per op. Measured lower bound: the in-process interpreter (interpret.py,
#   data mode) runs 2.4-17 us per op on this 2-core machine (8-rank plans, 2026-11-26); a
#   multi-process executor adds polling shared counters and sockets, TO BE CALIBRATED.
# - proxy-copy: 1 MiB, the executor's piece (plans/execute.py PIECE_WORDS): its proxy copies a
#   put's source piece by piece into the message it sends.
# - cores: not set here (the machine the plan will run on is not known); give `cores=N` when the
#   whole emulated cluster runs on N cores.
CPU_EMULATED = Topology("cpu-emulated", ranks_per_host=1, memory=Link(10 * GB, 2e-6), port=Link(0.119 * GB, 50e-6),
                        switch=Link(10 * GB, 2e-6), copy=30 * GB, op=20e-6, proxy_copy=1 << 20)

PRESETS = {t.name: t for t in (NVLINK_IB, CPU_EMULATED)}

# ---- parsing ----

_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?(?:e[+-]?\d+)?)\s*([a-zA-Z/]+)\s*$")
_RATE_UNITS = {"b/s": 1, "kb/s": 1e3, "mb/s": 1e6, "gb/s": 1e9, "tb/s": 1e12,
               # tc's bit rates (netem/units.py), decimal
               "bit": 1 / 8, "kbit": 1e3 / 8, "mbit": 1e6 / 8, "gbit": 1e9 / 8, "tbit": 1e12 / 8}
_TIME_UNITS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}
_KEYS = ("ranks-per-host", "nics-per-host", "memory", "fabric", "port", "switch", "copy", "op", "cores",
         "proxy-copy", "port-fanin")


def parse_rate(text: str, key: str) -> float:
    """'150GB/s' -> 1.5e11 bytes/s; tc's '100gbit' is taken too."""
    v = scaled(text, _RATE, _RATE_UNITS, str.lower, f"--topology {key}={text!r}: a rate is a number with GB/s, "
               "MB/s or gbit, mbit (decimal), e.g. 150GB/s or 100gbit")
    if v <= 0:
        raise UsageError(f"--topology {key}={text!r}: a rate must be above zero")
    return v


def parse_time(text: str, key: str) -> float:
    """'0.8us' -> 8e-7 seconds."""
    return scaled(text, _RATE, _TIME_UNITS, str.lower,
                  f"--topology {key}={text!r}: a time is a number with ns, us, ms or s, e.g. 0.8us")


def parse_link(text: str, key: str, base: Link) -> Link:
    """'150GB/s:0.8us' (or just a rate, keeping the base's latency)."""
    rate, sep, lat = str(text).partition(":")
    return Link(parse_rate(rate, key), parse_time(lat, key) if sep else base.latency)


def _positive_int(text, key: str) -> int:
    try:
        v = int(str(text))
    except ValueError:
        v = 0
    if v < 1:
        raise UsageError(f"--topology {key}={text!r}: must be a whole number >= 1")
    return v


def _apply(topo: Topology, key: str, value) -> Topology:
    k = key.strip().lower().replace("_", "-")
    if k == "ranks-per-host":
        return replace(topo, ranks_per_host=_positive_int(value, k))
    if k == "nics-per-host":
        return replace(topo, nics_per_host=_positive_int(value, k))
    if k in ("memory", "port", "switch"):
        return replace(topo, **{k: parse_link(value, k, getattr(topo, k))})
    if k == "fabric":
        return replace(topo, fabric=None if str(value).lower() in ("none", "off", "0") else parse_rate(value, k))
    if k == "copy":
        return replace(topo, copy=parse_rate(value, k))
    if k == "op":
        return replace(topo, op=parse_time(value, k))
    if k == "cores":
        return replace(topo, cores=None if str(value).lower() in ("none", "off") else _positive_int(value, k))
    if k == "port-fanin":
        return replace(topo, port_fanin=None if str(value).lower() in ("none", "off") else parse_rate(value, k))
    if k == "proxy-copy":
        return replace(topo, proxy_copy=_size(value, k))
    raise UsageError(f"--topology: unknown key {key!r} (known: {', '.join(_KEYS)}, or a preset: "
                     f"{', '.join(PRESETS)})")


def _size(text, key: str) -> int:
    """'1MiB', '256K' or a number of bytes; 0 (or none) is allowed."""
    from ..sizes import parse_size
    if str(text).strip().lower() in ("0", "none", "off"):
        return 0
    try:
        return parse_size(str(text))
    except UsageError:
        raise UsageError(f"--topology {key}={text!r}: a size in bytes, e.g. 1M or 262144, or 0") from None


def _preset(name: str) -> Topology:
    if name not in PRESETS:
        raise UsageError(f"--topology: unknown preset {name!r} (presets: {', '.join(PRESETS)}; or keys "
                         f"{', '.join(_KEYS)})")
    return PRESETS[name]


def parse_topology(text: str | None) -> Topology:
    """A preset name, `key=value,...` (after an optional preset name), or a JSON file's path.
    Keys left out keep the preset's values (nvlink-ib when none is named)."""
    if text is None or not str(text).strip():
        return NVLINK_IB
    text = str(text).strip()
    if text.endswith(".json") or (os.path.sep in text and "=" not in text):
        return _from_file(text)
    topo, custom = NVLINK_IB, False
    for i, item in enumerate(p.strip() for p in text.split(",")):
        if not item:
            continue
        if "=" not in item:
            if i:
                raise UsageError(f"--topology: {item!r} is not key=value (only the first item may name "
                                 f"a preset: {', '.join(PRESETS)})")
            topo = _preset(item)
            continue
        k, _, v = item.partition("=")
        topo = _apply(topo, k, v.strip())
        custom = True
    return replace(topo, name=f"{topo.name}+custom") if custom else topo


def _from_file(path: str) -> Topology:
    from .format import read_json
    obj = read_json(path, f"--topology {path}", error=UsageError)
    if not isinstance(obj, dict):
        raise UsageError(f"--topology {path}: expected a JSON object of keys ({', '.join(_KEYS)})")
    topo = _preset(str(obj.get("preset", NVLINK_IB.name)))
    name = str(obj.get("name", os.path.splitext(os.path.basename(path))[0]))
    for k, v in obj.items():
        if k in ("preset", "name"):
            continue
        try:
            topo = _apply(topo, k, v)
        except UsageError as e:
            raise UsageError(f"{path}: {e}") from None
    return replace(topo, name=name)

