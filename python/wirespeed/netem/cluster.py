"""An emulated cluster: hosts as network namespaces, one capped link each to a switch namespace.

    host h0 (netns wsnet-NAME-h0)      switch (netns wsnet-NAME-sw)
      ws0 10.77.0.1/24  <== veth ==>  h0 --+
      ws0 10.77.0.2/24  <== veth ==>  h1 --+-- br0 (bridge)
      ...

Every host's interface is called `ws0`, so one GLOO_SOCKET_IFNAME (etc.) fits every rank. The
addresses exist only inside these namespaces: the root namespace gains no interface, route or
address, and clusters of different names can use the same subnet without meeting.

Each namespace also gets /etc/netns/NS/hosts (which `ip netns exec` mounts over /etc/hosts) naming
every host, so peers resolve each other's addresses as on a real cluster.

A process on an emulated host should look as if it were on its own machine, not only on its own
network: `exec_prefix` (and `wirespeed cluster exec`) starts it inside the host's network
namespace, in its own UTS namespace with the host's name as hostname (libraries that decide "same
machine, use shared memory" by hostname then keep to the links, and torchrun's MASTER_ADDR, the
first node's hostname, resolves to that node), with the host's hosts file over /etc/hosts, and
with /dev/shm bound to a per-host directory of the cluster's own tmpfs, so hosts do not share
memory files and `down` removes whatever ranks left. The machine's /sys and file systems stay
visible, so daemons such as slurmd find their cgroups.

State lives in /run/wirespeed/cluster-NAME.json; a state file whose namespaces are gone (a reboot
where /run is not a tmpfs) counts as no cluster. Every
namespace carries the `wsnet-NAME-` prefix, so a cluster left by a killed run is found by name alone,
with or without its state file, and `up`/`down` remove it.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import time
from dataclasses import asdict, dataclass, field

from ..errors import UsageError
from . import shaping
from .measure import tcp_throughput, tcp_throughput_many
from .ns import NETNS_DIR, NetemError, kill_netns_processes, list_netns, require_admin, run, tc_batch

PREFIX = "wsnet-"
STATE_DIR = "/run/wirespeed"
ETC_NETNS = "/etc/netns"
IFNAME = "ws0"
SUBNET = "10.77.0"
DEFAULT_NAME = "ws"
MAX_HOSTS = 64
_NAME_RE = re.compile(r"^[a-z0-9]{1,16}$")


@dataclass
class Host:
    index: int
    netns: str
    ifname: str
    addr: str


def shm_root(name: str) -> str:
    """The cluster's own tmpfs, holding one /dev/shm directory per host. Not a directory of the
    real /dev/shm: a host's ranks see their own directory bound over /dev/shm, and a host process
    that starts a process on another host (mpirun's agent) must still reach that host's."""
    return os.path.join(STATE_DIR, f"shm-{name}")


def shm_dir(netns: str) -> str:
    name = netns[len(PREFIX):].rsplit("-", 1)[0]
    return os.path.join(shm_root(name), netns)


def _mounted(path: str) -> bool:
    try:
        with open("/proc/self/mountinfo") as f:
            return any(line.split()[4] == path for line in f)
    except OSError:
        return False


def _mount_shm(name: str) -> None:
    root = shm_root(name)
    os.makedirs(root, exist_ok=True)
    if not _mounted(root):
        run(["mount", "-t", "tmpfs", "-o", "mode=1777,size=50%", f"wirespeed-shm-{name}", root])


def _shm_mounts() -> set[str]:
    """Names of the clusters whose tmpfs is mounted (up, or left by a killed run)."""
    pre = shm_root("")
    try:
        with open("/proc/self/mountinfo") as f:
            return {line.split()[4][len(pre):] for line in f if line.split()[4].startswith(pre)}
    except OSError:
        return set()


def _unmount_shm(name: str) -> None:
    root = shm_root(name)
    while _mounted(root):
        run(["umount", "-l", root])
    if os.path.isdir(root):
        shutil.rmtree(root, ignore_errors=True)


# Run as `sh -c SCRIPT sh HOSTNAME HOSTS_FILE SHM_DIR SYSFS_SCRATCH CMD...` in a fresh UTS and mount
# namespace, already inside the host's network namespace. The machine's /sys stays (slurmd and
# other daemons need its cgroup file systems, which `ip netns exec` hides by remounting /sys);
# only the two directories that list network interfaces are taken from a sysfs mounted here,
# which shows this host's interfaces (ws0) as `ip netns exec` would. The scratch mount is gone
# before CMD starts; its directory is made here too, for a cluster an older `up` built.
_ENTER = """set -e
hostname "$1"
mkdir -p "$4"
mount -t sysfs sysfs "$4"
mount --bind "$4/class/net" /sys/class/net
mount --bind "$4/devices/virtual/net" /sys/devices/virtual/net
umount "$4"
mount --bind "$2" /etc/hosts
mount --bind "$3" /dev/shm
shift 4
command -v "$1" >/dev/null || { echo "wirespeed cluster exec: $1: command not found" >&2; exit 127; }
exec "$@"
"""


def sysfs_scratch(name: str) -> str:
    """An empty directory on which each process entering a host mounts that host's sysfs for a
    moment, in its own mount namespace (so nobody else ever sees it there)."""
    return os.path.join(shm_root(name), ".sysfs")


def exec_prefix(netns: str) -> list[str]:
    """argv prefix that runs a command as a process of the emulated host `netns` (see above).

    nsenter, not `ip netns exec`: the latter also remounts /sys for the namespace, which hides the
    machine's cgroup hierarchy. Each process gets namespaces of its own (a UTS namespace carrying
    the host's name, a mount namespace with the host's /etc/hosts and /dev/shm) rather than
    joining ones held open per host: nothing has to be kept alive, found or removed afterwards,
    and the hostname is the same string in all of them. The working directory is kept (nsenter
    changes it only when it enters a mount namespace, which it does not here)."""
    name = netns[len(PREFIX):].rsplit("-", 1)[0]
    return ["nsenter", f"--net={os.path.join(NETNS_DIR, netns)}", "unshare", "--uts", "--mount",
            "--propagation", "slave", "--", "sh", "-c", _ENTER, "sh", netns,
            os.path.join(ETC_NETNS, netns, "hosts"), shm_dir(netns), sysfs_scratch(name)]


@dataclass
class Cluster:
    name: str
    hosts: list[Host]
    rate_bps: int
    flow_rate_bps: int | None = None
    delay_s: float | None = None
    shaper: str = "htb"
    created: float = 0.0
    measured: dict = field(default_factory=dict)
    host_rates: dict = field(default_factory=dict)   # "index" -> bit/s, hosts slower than rate_bps

    def rate_of(self, index: int) -> int:
        """Host `index`'s link rate: its own (--host-rate) or the cluster's."""
        return int(self.host_rates.get(str(index), self.rate_bps))

    @property
    def switch_ns(self) -> str:
        return switch_ns(self.name)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def from_json(cls, text: str) -> "Cluster":
        d = json.loads(text)
        d["hosts"] = [Host(**h) for h in d["hosts"]]
        return cls(**d)


def check_name(name: str) -> str:
    if not _NAME_RE.match(name or ""):
        raise UsageError(f"cluster name {name!r} is not valid: use 1-16 lowercase letters or digits")
    return name


def ns_prefix(name: str) -> str:
    return f"{PREFIX}{name}-"


def host_ns(name: str, i: int) -> str:
    return f"{ns_prefix(name)}h{i}"


def switch_ns(name: str) -> str:
    return f"{ns_prefix(name)}sw"


def state_path(name: str) -> str:
    return os.path.join(STATE_DIR, f"cluster-{name}.json")


def agent_path(name: str) -> str:
    """Open MPI's rsh agent for this cluster (write_rsh_agent): `up` writes it, `down` removes it."""
    return os.path.join(STATE_DIR, f"rsh-agent-{name}")


def load(name: str = DEFAULT_NAME) -> Cluster | None:
    """The cluster of this name if it is up (state file and every namespace present), else None."""
    try:
        with open(state_path(name)) as f:
            c = Cluster.from_json(f.read())
    except (FileNotFoundError, ValueError, TypeError, KeyError):
        return None
    present = set(list_netns())
    if c.switch_ns not in present or any(h.netns not in present for h in c.hosts):
        return None
    return c


def require(name: str = DEFAULT_NAME) -> Cluster:
    c = load(name)
    if c is None:
        flag = "" if name == DEFAULT_NAME else f" --name {name}"
        raise UsageError(f"no emulated cluster {name!r} is up: start one with "
                         f"`wirespeed cluster up{flag} --hosts 4 --rate 1gbit` (needs root)")
    return c


def leftovers(name: str | None = None) -> list[str]:
    """Namespaces of this cluster (or of every wirespeed cluster when name is None)."""
    pre = ns_prefix(name) if name else PREFIX
    return [n for n in list_netns() if n.startswith(pre)]


def down(name: str = DEFAULT_NAME, *, all_clusters: bool = False) -> list[str]:
    """Remove the cluster: processes inside its namespaces, the namespaces (which takes the veths,
    bridge and qdiscs with them) and its state file. Returns the namespaces removed."""
    require_admin()
    names = leftovers(None if all_clusters else name)
    # Hosts first: a rank still running there would otherwise see its link vanish under it.
    for ns in sorted(names, key=lambda n: n.endswith("-sw")):
        kill_netns_processes(ns)
        run(["ip", "netns", "delete", ns], check=False)
        if os.path.exists(os.path.join(NETNS_DIR, ns)):
            raise NetemError(f"could not delete network namespace {ns}: remove it with "
                             f"`ip netns delete {ns}`")
    for ns in names:
        shutil.rmtree(os.path.join(ETC_NETNS, ns), ignore_errors=True)
    for n in (_shm_mounts() | {name} if all_clusters else {name}):
        _unmount_shm(n)
    gone = [name] if not all_clusters else cluster_names() + [name]
    for p in [state_path(n) for n in gone] + [agent_path(n) for n in gone]:
        try:
            os.unlink(p)
        except FileNotFoundError:
            pass
    return names


def cluster_names() -> list[str]:
    """Names of the clusters with a state file (up or not: see load)."""
    return [f[len("cluster-"):-len(".json")] for f in _state_files()]


def _state_files() -> list[str]:
    try:
        return [f for f in os.listdir(STATE_DIR) if f.startswith("cluster-") and f.endswith(".json")]
    except FileNotFoundError:
        return []


def netem_available(name: str) -> bool:
    """Whether this kernel has the netem qdisc: try it on a scratch namespace's loopback."""
    probe = f"{ns_prefix(name)}probe"
    run(["ip", "netns", "add", probe])
    try:
        run(["ip", "-n", probe, "link", "set", "lo", "up"])
        run(["tc", "-n", probe, "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"],
            check=False)
        return "netem" in run(["tc", "-n", probe, "qdisc", "show", "dev", "lo"], check=False)
    finally:
        run(["ip", "netns", "delete", probe], check=False)


def up(hosts: int, rate_bps: int, flow_rate_bps: int | None = None, delay_s: float | None = None,
       name: str = DEFAULT_NAME, measure: bool = True,
       host_rates: dict[int, int] | None = None) -> tuple[Cluster, list[str]]:
    """Build the cluster (removing any of the same name first); returns it and what was removed.
    `host_rates` gives some hosts a link of their own rate (a slow NIC or cable to find)."""
    require_admin()
    check_name(name)
    if not 1 <= hosts <= MAX_HOSTS:
        raise UsageError(f"--hosts must be 1..{MAX_HOSTS}, got {hosts}")
    for i in (host_rates or {}):
        if not 0 <= i < hosts:
            raise UsageError(f"--host-rate h{i}: the cluster has hosts h0..h{hosts - 1}")
    if flow_rate_bps and flow_rate_bps > rate_bps:
        raise UsageError("--flow-rate is above --rate: a flow cannot exceed its link; "
                         "give a flow rate below the link rate, or leave --flow-rate out")
    if delay_s and not netem_available(name):  # before touching a cluster that may be up
        raise UsageError("--delay needs the netem qdisc, which this kernel lacks (sch_netem): "
                         "leave --delay out, or run on a kernel with netem")
    removed = down(name)
    c = Cluster(name=name, rate_bps=rate_bps, flow_rate_bps=flow_rate_bps or None,
                delay_s=delay_s or None, created=time.time(),
                hosts=[Host(i, host_ns(name, i), IFNAME, f"{SUBNET}.{i + 1}") for i in range(hosts)],
                shaper="htb+u32 per-flow" if flow_rate_bps else "htb",
                host_rates={str(i): int(r) for i, r in sorted((host_rates or {}).items())})
    try:
        _build(c)
        os.makedirs(STATE_DIR, exist_ok=True)
        _save(c)
        write_rsh_agent(c)
        if measure and hosts >= 2:
            c.measured = measure_cluster(c)
            _save(c)
    except BaseException:
        down(name)
        raise
    return c, removed


def _save(c: Cluster) -> None:
    tmp = state_path(c.name) + ".tmp"
    with open(tmp, "w") as f:
        f.write(c.to_json())
    os.replace(tmp, state_path(c.name))


def _build(c: Cluster) -> None:
    sw = c.switch_ns
    _mount_shm(c.name)
    os.makedirs(sysfs_scratch(c.name), exist_ok=True)
    run(["ip", "netns", "add", sw])
    run(["ip", "-n", sw, "link", "set", "lo", "up"])
    run(["ip", "-n", sw, "link", "add", "br0", "type", "bridge"])
    run(["ip", "-n", sw, "link", "set", "br0", "up"])
    # The v4-mapped lines answer reverse lookups from dual-stack listeners (torch's TCPStore),
    # which would otherwise ask an unreachable DNS server and warn.
    hosts_file = "127.0.0.1 localhost\n::1 localhost\n" + "".join(
        f"{h.addr} {h.netns} h{h.index}\n::ffff:{h.addr} {h.netns}\n" for h in c.hosts)
    # Every host sends the segments the slowest link can take: the switch forwards a packet as it
    # came, so a fast host's large segments would burst into a slow host's cap.
    total = sum(c.rate_of(h.index) for h in c.hosts)
    gso = str(min(shaping.segment_limit_bytes(c.rate_of(h.index), total) for h in c.hosts))
    for h in c.hosts:
        port = f"h{h.index}"
        run(["ip", "netns", "add", h.netns])
        run(["ip", "-n", h.netns, "link", "set", "lo", "up"])
        os.makedirs(os.path.join(ETC_NETNS, h.netns), exist_ok=True)
        with open(os.path.join(ETC_NETNS, h.netns, "hosts"), "w") as f:
            f.write(hosts_file)
        os.makedirs(shm_dir(h.netns), exist_ok=True)
        os.chmod(shm_dir(h.netns), 0o1777)  # like /dev/shm itself
        # Both ends are created directly inside their namespaces: the root namespace never sees them.
        run(["ip", "link", "add", h.ifname, "netns", h.netns, "type", "veth",
             "peer", "name", port, "netns", sw])
        run(["ip", "-n", sw, "link", "set", port, "master", "br0"])
        run(["ip", "-n", sw, "link", "set", port, "up"])
        run(["ip", "-n", h.netns, "addr", "add", f"{h.addr}/24", "dev", h.ifname])
        run(["ip", "-n", h.netns, "link", "set", h.ifname, "up"])
        rate = c.rate_of(h.index)
        flow = min(c.flow_rate_bps, rate) if c.flow_rate_bps else None
        run(["ip", "-n", h.netns, "link", "set", "dev", h.ifname, "gso_max_size", gso])
        tc_batch(h.netns, shaping.host_egress_program(h.ifname, rate, flow))
        # The switch port toward the host caps what the host receives (and carries the delay, so a
        # packet is delayed once per one-way trip: it leaves the switch exactly once).
        tc_batch(sw, shaping.link_program(port, rate, c.delay_s))


def measure_cluster(c: Cluster, seconds: float = 1.0) -> dict:
    """What the caps really give, h0 -> h1: one TCP flow, and several in parallel."""
    a, b = c.hosts[0], c.hosts[1]
    streams = 4
    out = {"from": a.netns, "to": b.netns, "seconds": seconds, "streams": streams,
           "one_flow_bps": tcp_throughput(a.netns, b.netns, b.addr, 1, seconds),
           "parallel_bps": tcp_throughput(a.netns, b.netns, b.addr, streams, seconds)}
    out["when"] = time.time()
    return out


def measure_both_ways(c: Cluster, a: int, b: int, streams: int = 16, seconds: float = 1.0) -> dict:
    """What TCP carries between hosts a and b while both send at once, `streams` flows each way:
    the rate a job's collectives can get between them, which on this machine can be well below
    the links' cap (every packet crosses two veths, a bridge and two htb queues on the same cores
    the ranks use). Bits per second each way, and the slower of the two. 16 flows by default: enough
    to fill a link whose flows are capped (8 of 250 Mbit/s fill 2 Gbit/s), with room for two flows
    landing in one cap's bucket."""
    ha, hb = c.hosts[a], c.hosts[b]
    ab, ba = tcp_throughput_many([(ha.netns, hb.netns, hb.addr), (hb.netns, ha.netns, ha.addr)],
                                 streams, seconds)
    return {"between": [f"h{a}", f"h{b}"], "streams": streams, "seconds": seconds,
            "bps": [ab, ba], "each_way_bps": min(ab, ba), "when": time.time()}


def remeasure(name: str = DEFAULT_NAME) -> Cluster:
    require_admin()
    c = require(name)
    if len(c.hosts) < 2:
        raise UsageError("a cluster of one host has no link to measure: use --hosts 2 or more")
    c.measured = measure_cluster(c)
    _save(c)
    return c


def write_rsh_agent(c: Cluster) -> str:
    """Open MPI's rsh agent for this cluster: `agent HOST COMMAND...` runs COMMAND (a shell
    command line, as ssh would take it) as a process of HOST, named as find_host takes it. mpirun
    started on a host (`cluster exec h0 -- mpirun --mca plm_rsh_agent AGENT ...`) reaches the
    others with it instead of ssh; the agent needs nothing but nsenter, unshare and sh."""
    cases = "\n".join(
        f"  {'|'.join(shlex.quote(n) for n in (h.netns, f'h{h.index}', h.addr))}) exec "
        f"{' '.join(shlex.quote(a) for a in exec_prefix(h.netns))} sh -c \"$*\" ;;" for h in c.hosts)
    text = ("#!/bin/sh\n# wirespeed: Open MPI's rsh agent on the emulated cluster "
            f"{c.name!r} (no ssh: enter the host)\n"
            'host="$1"; shift\ncase "$host" in\n' + cases + "\n"
            '  *) echo "wirespeed rsh agent: $host is not a host of this cluster" >&2; exit 1 ;;\nesac\n')
    path = agent_path(c.name)
    os.makedirs(STATE_DIR, exist_ok=True)
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.chmod(path + ".tmp", 0o755)
    os.replace(path + ".tmp", path)
    return path


def find_host(c: Cluster, text: str) -> Host:
    """A host of `c` by any name a person or a launcher uses for it: h1, 1, its host name
    (wsnet-NAME-h1) or its address."""
    for h in c.hosts:
        if text in (f"h{h.index}", str(h.index), h.netns, h.addr):
            return h
    raise UsageError(f"host {text!r} is not in cluster {c.name!r}: use h0..h{len(c.hosts) - 1}, "
                     f"a host name such as {c.hosts[0].netns}, or an address")


def set_link(name: str, host: int, up_: bool) -> None:
    """Take a host's link down (or up), as a pulled cable: used by the fault tests."""
    c = require(name)
    h = c.hosts[host]
    run(["ip", "-n", h.netns, "link", "set", h.ifname, "up" if up_ else "down"])
