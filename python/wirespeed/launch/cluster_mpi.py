"""mpirun on the emulated cluster: Open MPI starts its own ranks, so it must run inside the cluster.

mpirun runs as a process of host 0 (its namespaces, see netem.cluster.exec_prefix) and reaches the
other hosts the way it reaches real ones, through an rsh agent, except that this agent does not ssh:
it enters the named host's namespaces and runs Open MPI's daemon (orted) there. The daemons then
connect back to mpirun over the emulated links, and the ranks talk over them (btl tcp on `ws0`;
ranks on one host use shared memory in that host's own /dev/shm, as on a real machine).
"""
from __future__ import annotations

import os
import subprocess
import sys

from ..errors import UsageError
from ..netem import cluster as C
from . import environment as E
from .local import die_with_parent, supervise
from .mpirun import ROOT_ENV, mpirun_command

# Variables the ranks need besides Open MPI's own, forwarded with mpirun -x.
FORWARD = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "WIRESPEED_IFNAME", E.CLUSTER, E.LINK_RATE,
           E.FLOW_RATE, E.LOCAL_SPAWN, "OMP_NUM_THREADS")


def write_agent(cluster: C.Cluster) -> str:
    """The rsh agent (`cluster up` writes it too, for mpirun started by hand)."""
    return C.write_rsh_agent(cluster)


def mpirun_on_cluster(cluster: C.Cluster, argv: list[str], nproc: int, hosts_of: list[int],
                      round_robin: bool, env: dict) -> list[str]:
    """The full command line: host 0's prefix, then mpirun with the cluster's hosts and agent."""
    program = [sys.executable, "-m", "wirespeed.cli.main"]
    cmd = mpirun_command(argv, nproc, program=program)
    at = len(cmd) - len(argv) - len(program)
    if cmd[at:at + len(program)] != program:
        raise UsageError("cannot place mpirun's ranks on the emulated cluster: unexpected mpirun command")
    slots = [hosts_of.count(i) for i in range(len(cluster.hosts))]
    hosts = ",".join(f"{h.netns}:{n}" for h, n in zip(cluster.hosts, slots) if n)
    ifname = cluster.hosts[0].ifname
    extra = ["--host", hosts, "--map-by", "node" if round_robin else "slot",
             "--mca", "plm_rsh_agent", write_agent(cluster),
             "--mca", "oob_tcp_if_include", ifname, "--mca", "btl_tcp_if_include", ifname]
    for var in FORWARD:
        if var in env:
            extra += ["-x", var]
    first = cluster.hosts[hosts_of[0]].netns
    return [*C.exec_prefix(first), *cmd[:at], *extra, *cmd[at:]]


def spawn_mpi_on_cluster(cluster: C.Cluster, argv: list[str], hosts_of: list[int], round_robin: bool,
                         base_env: dict) -> int:
    env = dict(base_env)
    env.setdefault("OMPI_MCA_opal_warn_on_missing_libcuda", "0")
    if os.geteuid() == 0:
        env.update(ROOT_ENV)
    cmd = mpirun_on_cluster(cluster, argv, len(hosts_of), hosts_of, round_robin, env)
    try:
        proc = subprocess.Popen(cmd, env=env, preexec_fn=die_with_parent)
    except OSError as e:
        raise UsageError(f"could not start mpirun: {e}") from None
    return supervise([proc])
