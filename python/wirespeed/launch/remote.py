"""`wirespeed launch`'s ranks over the hosts of a hosts file (cli/launch.py parses the flags):
each rank's full command line (`plan`), and starting and supervising them.

Every rank gets torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
MASTER_PORT), so the command it runs behaves as under torchrun. Real hosts are reached with ssh
(one session per rank, as MXNet's launcher does); `netns:NAME` hosts of the emulated cluster are
entered as `wirespeed cluster exec` enters them, other namespaces with `ip netns exec`.
"""
from __future__ import annotations

import os
import shlex
import subprocess
import sys
from dataclasses import dataclass

from ..errors import UsageError
from .environment import DEFAULT_PORT, IFNAME_VARS, JOB_SECRET, LINK_VARS, link_env, torch_log_env




@dataclass
class RankLaunch:
    rank: int
    host: str
    argv: list[str]

    def shell(self) -> str:
        return " ".join(shlex.quote(a) for a in self.argv)


def netns_address(ns: str) -> tuple[str, str, list[str]]:
    """(address, interface, argv prefix) of a namespace host: from the emulated cluster's state
    (its ranks then look like processes of their own machine), else from `ip`."""
    from ..netem import cluster as C
    from ..netem.ns import list_netns, run
    if ns not in list_netns():
        raise UsageError(f"network namespace {ns!r} does not exist: start the emulated cluster "
                         "(`wirespeed cluster up`) or fix the hosts file")
    for name in C.cluster_names():
        c = C.load(name)
        for h in (c.hosts if c else []):
            if h.netns == ns:
                return h.addr, h.ifname, C.exec_prefix(ns)
    for line in run(["ip", "-n", ns, "-o", "-4", "addr", "show", "scope", "global"]).splitlines():
        words = line.split()
        return words[3].split("/")[0], words[1], ["ip", "netns", "exec", ns]
    raise UsageError(f"network namespace {ns!r} has no IPv4 address to reach its ranks at")


def _link_env(ns_hosts) -> dict:
    """The emulated link's rate, so `bench` records it, when every host is one cluster's."""
    from ..netem import cluster as C
    for name in C.cluster_names():
        c = C.load(name)
        if c and set(ns_hosts) <= {h.netns for h in c.hosts}:
            return link_env(c.name, c.rate_bps, c.flow_rate_bps)
    return {}


def plan(hosts, counts, cmd, *, master_addr=None, master_port=None, ifname=None, workdir=None,
         ssh="ssh", exports=(), environ=None, resolve=netns_address, free_port=None,
         fast_net=None) -> list[RankLaunch]:
    """Each rank's full command line, in rank order. Pure but for `resolve` and `free_port`.
    `fast_net`: the plugin's variables (wirespeed.netplugin.fast_net_env) for every rank."""
    environ = os.environ if environ is None else environ
    ns_info = {h.name: resolve(h.name) for h in hosts if h.netns}
    first = hosts[0]
    if master_addr is None:
        master_addr = ns_info[first.name][0] if first.netns else first.name
    if master_port is None:
        master_port = free_port(first.name, master_addr) if (first.netns and free_port) else DEFAULT_PORT
    world = sum(counts)
    link = _link_env([h.name for h in hosts if h.netns]) if ns_info and len(ns_info) == len(hosts) else {}
    out, rank = [], 0
    for h, n in zip(hosts, counts):
        for local in range(n):
            # OMP_NUM_THREADS=1 unless set, as torchrun does: ranks sharing a host's cores
            # otherwise each start a thread per core and fight (20x slower small all_reduces).
            env = {"RANK": rank, "WORLD_SIZE": world, "LOCAL_RANK": local, "LOCAL_WORLD_SIZE": n,
                   "MASTER_ADDR": master_addr, "MASTER_PORT": master_port,
                   "OMP_NUM_THREADS": environ.get("OMP_NUM_THREADS", "1"), **torch_log_env(environ)}
            if environ.get(JOB_SECRET):  # main() makes one per job unless the user gave one
                env[JOB_SECRET] = environ[JOB_SECRET]
            dev = ns_info[h.name][1] if h.netns else ifname
            if dev:
                env.update({v: dev for v in IFNAME_VARS})
            pairs = [f"{k}={v}" for k, v in env.items()]
            if h.netns:
                pairs += [f"{k}={v}" for k, v in link.items()]
                pairs += [f"{k}={v}" for k, v in (fast_net or {}).items()]
                run = cmd
                if run[0] == "wirespeed":  # the same install as this launcher, PATH or not
                    run = [sys.executable, "-m", "wirespeed.cli.main", *run[1:]]
                argv = [*ns_info[h.name][2], "env", *pairs, *run]
            else:
                pairs += [f"{k}={environ[k]}" for k in exports if k in environ]
                # A launcher on a host of the emulated cluster (`cluster exec`) knows the links'
                # rates; sshd starts each session with a fresh environment, so hand them on for
                # the records. Elsewhere these are unset and nothing is added.
                pairs += [f"{k}={environ[k]}" for k in LINK_VARS if k in environ and k not in exports]
                raw = []
                if fast_net:
                    pairs += [f"{k}={fast_net[k]}" for k in ("NCCL_NET_PLUGIN", "NCCL_NET")]
                    # The plugin's folder before the remote host's own library path, expanded there.
                    libdir = os.path.dirname(fast_net["NCCL_NET_PLUGIN"])
                    raw = [f"LD_LIBRARY_PATH={shlex.quote(libdir)}\"${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}\""]
                remote = (f"cd {shlex.quote(workdir or os.getcwd())} && exec env "
                          + " ".join([*(shlex.quote(p) for p in pairs), *raw]) + " "
                          + " ".join(shlex.quote(a) for a in cmd))
                argv = [*shlex.split(ssh), h.name, remote]
            out.append(RankLaunch(rank, h.label, argv))
            rank += 1
    return out


def free_port(ns: str, addr: str) -> int:
    """A free port in namespace `ns` at `addr` (plan's `free_port` for netns hosts)."""
    from .cluster import free_port_in
    return free_port_in(ns, addr)


def start(ranks: list[RankLaunch]) -> int:
    """Start every rank's command and supervise them (launch/local.py: supervise): if one fails,
    the rest are stopped. Returns the job's exit status."""
    from .local import die_with_parent, supervise
    procs = []
    try:
        for r in ranks:
            procs.append(subprocess.Popen(r.argv, preexec_fn=die_with_parent,
                                          stdin=subprocess.DEVNULL))
    except OSError as e:
        for p in procs:
            p.kill()
        raise UsageError(f"could not start rank {len(procs)}: {e}") from None
    return supervise(procs)
