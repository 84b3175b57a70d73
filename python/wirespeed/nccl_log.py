"""Did NCCL really move the traffic through the wirespeed plugin? Read NCCL's own log and say.

NCCL falls back to its socket transport without a word above INFO when a network plugin does not
load (a wrong path, a missing symbol, an API version it does not know), which is how earlier TCP
plugins stopped working without anyone noticing. With NCCL_DEBUG=INFO (the INIT subsystem, on by
default) every communicator logs which network it took, and every connection it sets up between
hosts logs the network it goes through (NCCL's init.cc and transport/net.cc):

    node1:4242:4250 [0] NCCL INFO Using network wirespeed
    node1:4242:4260 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/wirespeed/0
    node1:4242:4260 [0] NCCL INFO Channel 00/0 : 1[0] -> 0[0] [receive] via NET/wirespeed/0

The first line says the plugin loaded and won; only the second says that traffic between hosts
went through it (ranks NCCL sees on one host use shared memory or P2P instead, and print
`via SHM` or `via P2P`). A --fast-net run passes when every NCCL process in the log took network
wirespeed, none took another, and at least one connection went via NET/wirespeed.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from .netplugin import NET_NAME

# hostname:pid:tid [device] NCCL INFO ... (NCCL's prefix since 2.x; the hostname may hold ':' only
# in IPv6-looking names, which hostnames are not)
_PREFIX = r"^(?P<host>[^\s:]+):(?P<pid>\d+):\d+ \[[^\]]*\] NCCL INFO "
_USING = re.compile(_PREFIX + r"Using network (?P<net>\S+)\s*$", re.M)
# "Channel 00/0 : 0[0] -> 1[0] [send] via NET/x/0" (2.12+), "Ring 00 : 0 -> 1 [send] via NET/x/0"
# before; a PXN hop adds "(proxy rank)" after the device.
_VIA = re.compile(_PREFIX + r"[^\n]*?\[(?:send|receive)\] via NET/(?P<net>[^/\s]+)/", re.M)
_PLUGIN_WARN = re.compile(r"NCCL WARN .*(?:NET/Plugin|net plugin|wirespeed).*$", re.M | re.I)


@dataclass
class NetUse:
    """What the log says each NCCL process used."""
    networks: dict = field(default_factory=dict)     # (host, pid) -> set of "Using network" names
    connections: dict = field(default_factory=dict)  # network name -> "via NET/<name>/" lines
    warnings: list = field(default_factory=list)     # plugin-related WARN lines


def read_net_use(text: str) -> NetUse:
    use = NetUse()
    for m in _USING.finditer(text):
        use.networks.setdefault((m["host"], int(m["pid"])), set()).add(m["net"])
    for m in _VIA.finditer(text):
        use.connections[m["net"]] = use.connections.get(m["net"], 0) + 1
    use.warnings = [w.strip() for w in _PLUGIN_WARN.findall(text)]
    return use


def fast_net_problem(text: str, processes: int | None = None, net: str = NET_NAME) -> str | None:
    """None when the log proves NCCL carried traffic between hosts through the plugin `net`, else
    one line saying what the log shows instead and what to look at. `processes`: how many NCCL
    processes (ranks) the run had, when known; each must have said which network it took."""
    use = read_net_use(text)
    if not use.networks:
        return ("NCCL's log has no 'Using network' line: run the ranks with NCCL_DEBUG=INFO (and "
                "NCCL_DEBUG_SUBSYS, if set, including INIT) and give the check their output")
    others = sorted({n for nets in use.networks.values() for n in nets if n != net})
    if others:
        bad = sorted(f"{h}:{p}" for (h, p), nets in use.networks.items() if net not in nets)
        hint = f"; NCCL said: {use.warnings[0]}" if use.warnings else ""
        return (f"NCCL used network {', '.join(others)}, not {net}, in {len(bad)} of "
                f"{len(use.networks)} processes ({', '.join(bad[:4])}): the plugin did not load "
                f"there (check NCCL_NET_PLUGIN and NCCL_NET={net} reach every rank){hint}")
    if processes is not None and len(use.networks) < processes:
        return (f"only {len(use.networks)} of {processes} NCCL processes logged which network they "
                "took: give the check every rank's log (NCCL_DEBUG_FILE=dir/nccl.%h.%p.log)")
    if not use.connections.get(net):
        elsewhere = ", ".join(f"{n} ({c})" for n, c in sorted(use.connections.items()))
        return (f"NCCL loaded {net} but no connection went through it (no 'via NET/{net}/' line"
                + (f"; connections via {elsewhere}" if elsewhere else "")
                + "): the ranks shared a host, so NCCL used shared memory or P2P; put them on "
                "different hosts (the emulated cluster, or --host-per-rank)")
    others = sorted(n for n in use.connections if n != net)
    if others:
        return (f"some connections went via NET/{', '.join(others)} rather than NET/{net}: "
                "a rank ran without the plugin")
    return None


def fast_net_summary(text: str, net: str = NET_NAME) -> str:
    use = read_net_use(text)
    return (f"NCCL used network {net} in all {len(use.networks)} processes; "
            f"{use.connections.get(net, 0)} connection setups via NET/{net}")
