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

import glob
import os
import re
import socket
from dataclasses import dataclass, field

from .launch.environment import NCCL_LOG_DIR
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


def fast_net_problem(text: str, processes: int | None = None, net: str = NET_NAME,
                     need_connection: bool = True) -> str | None:
    """None when the log proves NCCL carried traffic between hosts through the plugin `net`, else
    one line saying what the log shows instead and what to look at. `processes`: how many NCCL
    processes (ranks) the run had, when known; each must have said which network it took.
    need_connection=False for one rank's own log: on a host of several GPUs a rank may reach its
    ring neighbours only over P2P, so a job's connections through `net` are counted over all ranks."""
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
    if need_connection and not use.connections.get(net):
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


# --- bench --fast-net: each rank's NCCL writes its log to a file, which the rank reads afterwards ---

LOG_DIR_VAR = NCCL_LOG_DIR   # set: this job's ranks check their NCCL log


def debug_env(environ) -> dict:
    """The variables that make every rank's NCCL log which network it took, to a file of its own
    (NCCL_DEBUG_FILE expands %h and %p), so the rank can check it after the run. Empty when the
    user sends NCCL's log somewhere already (NCCL_DEBUG_FILE: check it with `wirespeed
    plugin-check`), or a launching process set them for this job."""
    if environ.get(LOG_DIR_VAR) or environ.get("NCCL_DEBUG_FILE"):
        return {}
    import tempfile
    import time
    d = os.path.join(tempfile.gettempdir(), f"wirespeed-nccl-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
    env = {LOG_DIR_VAR: d, "NCCL_DEBUG_FILE": os.path.join(d, "nccl.%h.%p.log")}
    if environ.get("NCCL_DEBUG", "").upper() not in ("INFO", "TRACE"):
        env["NCCL_DEBUG"] = "INFO"
    if not environ.get("NCCL_DEBUG_SUBSYS"):
        env["NCCL_DEBUG_SUBSYS"] = "INIT,NET"
    return env


def own_log_path(log_dir: str) -> str | None:
    """This process's NCCL log in `log_dir`: NCCL names it by the host name up to its first dot."""
    pid = os.getpid()
    exact = os.path.join(log_dir, f"nccl.{socket.gethostname().split('.')[0]}.{pid}.log")
    if os.path.exists(exact):
        return exact
    found = glob.glob(os.path.join(glob.escape(log_dir), f"nccl.*.{pid}.log"))
    return found[0] if found else None


def own_log_findings(log_dir: str, net: str = NET_NAME) -> tuple[str | None, int]:
    """(what is wrong with this rank's NCCL log, or None; its connection setups via `net`)."""
    path = own_log_path(log_dir)
    if path is None:
        return (f"NCCL wrote no log for this process in {log_dir} (NCCL_DEBUG_FILE): it never "
                "started, or the folder is not writable here", 0)
    with open(path, errors="replace") as f:
        text = f.read()
    problem = fast_net_problem(text, processes=1, net=net, need_connection=False)
    return (f"{problem} (log: {path})" if problem else None), read_net_use(text).connections.get(net, 0)
