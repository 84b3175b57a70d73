"""Start the ranks of a wirespeed command on the hosts of the emulated cluster (wirespeed.netem).

Rank r runs as a process of its host (netem.cluster.exec_prefix, what `wirespeed cluster exec`
runs: the host's network namespace, hostname, hosts file and /dev/shm), with torchrun's variables
set and MASTER_ADDR = host 0's address, so it cannot tell the emulated cluster from a real one. Every
library is pointed at the emulated interface, so gloo, NCCL, Open MPI and wirespeed's own transport
all cross the capped links rather than loopback. Ranks on one host still talk over that host's
loopback path, as on a real machine.
"""
from __future__ import annotations

import os
import random
import socket
import subprocess
import sys

from ..errors import UsageError
from ..netem import cluster as C
from ..netem.ns import run_in_netns
from . import environment as E
from .environment import IFNAME_VARS, with_job_secret
from .local import die_with_parent, supervise

# Each library's knob for "use this interface", all pointed at the host's emulated link.


def placement(nproc: int, hosts: int, ranks_per_host: int | None) -> list[int]:
    """Host index of each rank: round robin, or blocks of ranks_per_host (rank 0..K-1 on h0, ...)."""
    if nproc < 1:
        raise UsageError("-N must be at least 1")
    if ranks_per_host is None:
        return [r % hosts for r in range(nproc)]
    if ranks_per_host < 1:
        raise UsageError("--ranks-per-host must be at least 1")
    if nproc > ranks_per_host * hosts:
        raise UsageError(f"-N {nproc} ranks do not fit {hosts} hosts x --ranks-per-host {ranks_per_host}: "
                         f"use -N {ranks_per_host * hosts} or less, or a cluster with more hosts")
    return [r // ranks_per_host for r in range(nproc)]


def cluster_nproc(name: str, ranks_per_host: int | None, nproc_flag, fallback: int) -> int:
    """-N when given, else every slot of the cluster: hosts x ranks_per_host (1 per host)."""
    if nproc_flag is not None:
        return fallback
    return len(C.require(C.check_name(name)).hosts) * (ranks_per_host or 1)


def free_port_in(netns: str, addr: str) -> int:
    """A port free on `addr`, found from inside namespace `netns` (the rendezvous port)."""
    def pick():
        for _ in range(50):
            port = random.randint(20000, 32000)
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind((addr, port))
                    return port
                except OSError:
                    continue
        raise UsageError(f"no free port found on {addr} in {netns}")
    t, box = run_in_netns(netns, pick)
    t.join(10)
    if "error" in box:
        raise box["error"]
    return box["value"]


def cluster_env(cluster: C.Cluster, base=None) -> dict:
    """What every rank on the cluster gets, whoever starts it: the links' interface for every
    library, and the link rates for the records."""
    env = dict(os.environ if base is None else base)
    env.update(E.local_spawn_env(), OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "1"),
               **E.torch_log_env(env), **link_env(cluster))
    for var in IFNAME_VARS:
        env[var] = cluster.hosts[0].ifname  # every host's interface has this one name
    return env


def link_env(cluster: C.Cluster) -> dict:
    """What tells a process that it runs on the emulated cluster, and at which link rates, so
    that bench's records carry them (link_fields) whoever started it: this launcher, or torchrun
    and mpirun started with `wirespeed cluster exec`."""
    return E.link_env(cluster.name, cluster.rate_bps, cluster.flow_rate_bps, cluster.host_rates)


def rank_envs(cluster: C.Cluster, hosts_of: list[int], master_port: int, base=None) -> list[dict]:
    common = with_job_secret(cluster_env(cluster, base))
    world = len(hosts_of)
    master = cluster.hosts[hosts_of[0]]
    envs = []
    for r, h in enumerate(hosts_of):
        peers = [q for q, hq in enumerate(hosts_of) if hq == h]
        env = dict(common)
        env.update(RANK=str(r), WORLD_SIZE=str(world), LOCAL_RANK=str(peers.index(r)),
                   LOCAL_WORLD_SIZE=str(len(peers)), MASTER_ADDR=master.addr,
                   MASTER_PORT=str(master_port), **E.cluster_host_env(h))
        envs.append(env)
    return envs


def rank_commands(cluster: C.Cluster, hosts_of: list[int], argv: list[str]) -> list[list[str]]:
    py = [sys.executable, "-m", "wirespeed.cli.main", *argv]
    return [[*C.exec_prefix(cluster.hosts[h].netns), *py] for h in hosts_of]


def spawn_on_cluster(argv: list[str], nproc: int, ranks_per_host: int | None = None,
                     name: str = C.DEFAULT_NAME, master_port: int | None = None,
                     backend: str = "gloo") -> int:
    """Run `wirespeed *argv` as ranks on the emulated cluster; return the job's exit code."""
    from ..netem.ns import require_admin
    require_admin("running ranks on the emulated cluster")
    cluster = C.require(C.check_name(name))
    hosts_of = placement(nproc, len(cluster.hosts), ranks_per_host)
    print(f"# emulated cluster {cluster.name!r}: "
          + ", ".join(f"rank {r} on h{h} {cluster.hosts[h].addr}" for r, h in enumerate(hosts_of)),
          flush=True)
    if backend == "mpi":  # Open MPI starts its own ranks: mpirun itself goes into the cluster
        from .cluster_mpi import spawn_mpi_on_cluster
        return spawn_mpi_on_cluster(cluster, argv, hosts_of, ranks_per_host is None,
                                    cluster_env(cluster))
    port = master_port or free_port_in(cluster.hosts[hosts_of[0]].netns, cluster.hosts[hosts_of[0]].addr)
    envs = rank_envs(cluster, hosts_of, port)
    procs = [subprocess.Popen(cmd, env=env, preexec_fn=die_with_parent)
             for cmd, env in zip(rank_commands(cluster, hosts_of, argv), envs)]
    return supervise(procs, explain=lambda: link_problems(cluster, hosts_of))


def job_link_ceiling(name: str, nproc: int, ranks_per_host: int | None) -> dict | None:
    """What TCP carries, both ways at once, between the hosts of a job's rank 0 and of the first
    rank on another host (netem.cluster.measure_both_ways); None for a job on one host. Taken
    before the job's ranks start, so nothing of the job shares the link with it."""
    from ..netem.ns import require_admin
    require_admin("measuring the emulated cluster's links")
    cluster = C.require(C.check_name(name))
    hosts_of = placement(nproc, len(cluster.hosts), ranks_per_host)
    other = next((h for h in hosts_of if h != hosts_of[0]), None)
    if other is None:
        return None
    return C.measure_both_ways(cluster, hosts_of[0], other)


def _link_is_up(netns: str, dev: str) -> bool:
    """Administratively up and with a carrier (`ip -o link` flags UP and LOWER_UP)."""
    from ..netem.ns import run
    out = run(["ip", "-n", netns, "-o", "link", "show", "dev", dev], check=False, timeout=5)
    flags = out[out.find("<") + 1:out.find(">")].split(",") if "<" in out else []
    return "UP" in flags and "LOWER_UP" in flags


def link_problems(cluster: C.Cluster, hosts_of: list[int]) -> list[str]:
    """After a failed job: every host whose link is down, with the ranks it cut off and how to
    bring it back (a pulled cable shows to the ranks only as silence, so they cannot say)."""
    lines = []
    for h in sorted(set(hosts_of)):
        host = cluster.hosts[h]
        if _link_is_up(host.netns, host.ifname) and _link_is_up(cluster.switch_ns, f"h{h}"):
            continue
        inside = [r for r, hr in enumerate(hosts_of) if hr == h]
        outside = [r for r, hr in enumerate(hosts_of) if hr != h]
        cut = f"rank{'s' if len(inside) > 1 else ''} {', '.join(map(str, inside))} on h{h}"
        if outside:
            cut += (f" could not reach rank{'s' if len(outside) > 1 else ''} "
                    f"{', '.join(map(str, outside))}")
        lines.append(f"host h{h}'s link is down: {cut} (`wirespeed cluster link --name "
                     f"{cluster.name} h{h} up` brings it back)")
    return lines


def host_link_sent_bytes():
    """On a host of the emulated cluster, a reader of the bytes the host has sent over its link
    (its interface's counter, headers included, in this process's network namespace); None
    elsewhere: on a real host other traffic shares the interface, so the count would not be
    the job's."""
    if not E.on_cluster():
        return None
    ifname = C.IFNAME

    def read() -> int:
        with open("/proc/net/dev") as f:  # per network namespace: this host's interfaces
            for line in f:
                name, _, counters = line.partition(":")
                if name.strip() == ifname:
                    return int(counters.split()[8])  # transmit bytes
        return 0
    try:
        read()
    except (OSError, ValueError, IndexError):
        return None
    return read
