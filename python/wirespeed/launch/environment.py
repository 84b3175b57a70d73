"""Rank, world size and rendezvous address from the launcher that started this process.

One reader for every launcher, so the same command line serves one machine or many:
- torchrun (and wirespeed's own local spawn): RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
  MASTER_ADDR, MASTER_PORT;
- SLURM srun: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, this node's (SLURM_NODEID) entry of
  SLURM_STEP_TASKS_PER_NODE, master = first host of SLURM_STEP_NODELIST (else SLURM_JOB_NODELIST),
  port derived from the job id;
- Open MPI mpirun: OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK/LOCAL_SIZE;
- MPICH / Intel MPI (PMI): PMI_RANK, PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS.
MASTER_ADDR / MASTER_PORT, when set, win over anything derived. Open MPI tells a rank nothing
about where rank 0 runs: across hosts without MASTER_ADDR, the ranks ask MPI itself (mpi4py),
once, as DeepSpeed does under mpirun (launch/mpirun.py: master_from_mpi).
"""
from __future__ import annotations

import os
import re
import socket
from dataclasses import dataclass

from ..errors import UsageError
from ..knobs import internal

DEFAULT_PORT = 29500


@dataclass(frozen=True)
class RankInfo:
    """Where this process sits in the job, from the launcher's environment."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str
    master_port: int


def _int(env, *names, default=None):
    for n in names:
        if env.get(n, "").strip():
            try:
                return int(env[n].split("(")[0].split(",")[0])
            except ValueError:
                raise UsageError(f"environment variable {n}={env[n]!r} is not an integer") from None
    return default


def expand_slurm_hostlist(nodelist: str) -> list[str]:
    """'gpu[03-05,07],cpu1' -> ['gpu03', 'gpu04', 'gpu05', 'gpu07', 'cpu1']: a SLURM node list
    expanded as `scontrol show hostnames` does (without needing scontrol on the node), including
    several bracket groups in one name (`rack[1-2]-n[1-2]`) and zero-padded ranges."""
    text = nodelist.strip()
    names, depth, start = [], 0, 0
    for i, ch in enumerate(text + ","):   # split on the commas outside brackets
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        elif ch == "," and depth == 0:
            if i > start:
                names.append(text[start:i])
            start = i + 1
        if depth not in (0, 1):
            break
    if depth != 0 or not names:
        raise UsageError(f"cannot read the SLURM node list {nodelist!r}: set MASTER_ADDR")
    hosts = []
    for name in names:
        parts = re.split(r"\[([^\]]*)\]", name)   # text, ranges, text, ranges, ..., text
        expanded = [""]
        for k, part in enumerate(parts):
            if k % 2 == 0:
                expanded = [e + part for e in expanded]
                continue
            choices = []
            for item in part.split(","):
                lo, _, hi = item.partition("-")
                if not lo.isdigit() or (hi and not hi.isdigit()) or (hi and int(hi) < int(lo)):
                    raise UsageError(f"cannot read {item!r} in the SLURM node list {nodelist!r}: "
                                     "set MASTER_ADDR")
                width = len(lo)
                choices += [str(n).zfill(width) for n in range(int(lo), int(hi or lo) + 1)]
            expanded = [e + c for e in expanded for c in choices]
        hosts += expanded
    return hosts


def first_slurm_host(nodelist: str) -> str:
    """'gpu[03-05,07],cpu1' -> 'gpu03': the first host of a SLURM node list."""
    return expand_slurm_hostlist(nodelist)[0]


def slurm_tasks_per_node(spec: str) -> list[int]:
    """'2(x3),1' -> [2, 2, 2, 1]: SLURM_STEP_TASKS_PER_NODE / SLURM_TASKS_PER_NODE, one count per
    node of the step in node order (srun spreads 4 tasks over 2 nodes of 4 CPUs as '3,1')."""
    counts = []
    for item in spec.strip().split(","):
        m = re.fullmatch(r"\s*(\d+)\s*(?:\(x(\d+)\))?\s*", item)
        if not m:
            raise UsageError(f"cannot read the SLURM tasks per node {spec!r}")
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    return counts


def _slurm_local_world(env, world: int) -> int:
    """This node's task count in the step. SLURM_NTASKS_PER_NODE is what the user asked for
    (and is missing without --ntasks-per-node); the step's per-node list is what srun did, which
    differs from node to node when the tasks do not divide evenly."""
    for name in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"):
        if env.get(name, "").strip():
            counts = slurm_tasks_per_node(env[name])
            node = _int(env, "SLURM_NODEID", default=0)
            if 0 <= node < len(counts):
                return counts[node]
            return counts[0]
    return _int(env, "SLURM_NTASKS_PER_NODE", default=world)


def launcher_name(env=None) -> str | None:
    """Which launcher started this process, or None when run by hand (then wirespeed spawns ranks)."""
    env = os.environ if env is None else env
    if "RANK" in env and "WORLD_SIZE" in env:
        return "torchrun"
    if "OMPI_COMM_WORLD_RANK" in env:
        return "mpirun"
    if "PMI_RANK" in env and "PMI_SIZE" in env:
        return "pmi"
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env and "SLURM_STEP_ID" in env:
        return "srun"
    return None


def rank_info(env=None, need_master: bool = True) -> RankInfo | None:
    """This process's place in the job, or None when no launcher set one. need_master=False for
    backends that rendezvous through their launcher (MPI), which need no MASTER_ADDR. Only when
    reading this process's own environment (env None) may it ask MPI for rank 0's host."""
    own = env is None
    env = os.environ if env is None else env
    kind = launcher_name(env)
    if kind is None:
        return None
    if kind == "torchrun":
        rank, world = _int(env, "RANK"), _int(env, "WORLD_SIZE")
        local, local_world = _int(env, "LOCAL_RANK", default=rank), _int(env, "LOCAL_WORLD_SIZE", default=world)
    elif kind == "mpirun":
        rank, world = _int(env, "OMPI_COMM_WORLD_RANK"), _int(env, "OMPI_COMM_WORLD_SIZE")
        local = _int(env, "OMPI_COMM_WORLD_LOCAL_RANK", default=rank)
        local_world = _int(env, "OMPI_COMM_WORLD_LOCAL_SIZE", default=world)
    elif kind == "pmi":
        rank, world = _int(env, "PMI_RANK"), _int(env, "PMI_SIZE")
        local = _int(env, "MPI_LOCALRANKID", "PALS_LOCAL_RANKID", default=rank)
        local_world = _int(env, "MPI_LOCALNRANKS", "PALS_LOCAL_SIZE", default=world)
    else:
        rank, world = _int(env, "SLURM_PROCID"), _int(env, "SLURM_NTASKS")
        local = _int(env, "SLURM_LOCALID", default=0)
        local_world = _slurm_local_world(env, world)
    if world < 1 or not 0 <= rank < world:
        raise UsageError(f"launcher environment ({kind}) gives rank {rank} of world {world}: "
                         "check the launch command")
    addr = env.get("MASTER_ADDR")
    port = _int(env, "MASTER_PORT")
    if addr is None:
        if local_world == world:
            addr = "127.0.0.1"  # every rank is on this host
        elif kind == "srun" and (env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST")):
            # The step's first node holds task 0 (a step may use only part of the allocation).
            addr = first_slurm_host(env.get("SLURM_STEP_NODELIST") or env["SLURM_JOB_NODELIST"])
        elif not need_master:
            addr = ""
        elif kind == "mpirun" and own:
            from .mpirun import master_from_mpi
            addr, found_port = master_from_mpi(rank, world)
            if _int(env, "MASTER_PORT") is None:
                port = found_port
        else:
            raise UsageError(f"ranks span several hosts under {kind} but MASTER_ADDR is not set: "
                             "export MASTER_ADDR=<rank 0's host> (and MASTER_PORT) for every rank")
    if port is None:
        job = _int(env, "SLURM_JOB_ID", default=None)
        port = DEFAULT_PORT + (job % 10000 if job is not None else 0)
    elif not 0 < port < 65536:  # 0 would leave every rank looking for a rendezvous at port 0
        raise UsageError(f"MASTER_PORT={env['MASTER_PORT']!r} is not a port: set it to one from 1 "
                         "to 65535 (the same on every rank)")
    return RankInfo(rank, world, local, local_world, addr, port)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def check_port_free(port: int, host: str = "127.0.0.1") -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            raise UsageError(f"--master-port {port} is already in use on {host}: choose another "
                             "port or leave --master-port out to pick a free one") from None


JOB_SECRET = "WIRESPEED_JOB_SECRET"


def with_job_secret(env: dict) -> dict:
    """`env` with the job's secret: the user's WIRESPEED_JOB_SECRET where set (several launches
    that must meet share it), else a fresh random one. Every rank of one job gets the same; the
    transport's handshake makes each connection prove it (docs/transport.md), so reading the
    store is not enough to join. Call once per job and hand the result to every rank."""
    import secrets
    out = dict(env)
    if not out.get(JOB_SECRET):
        out[JOB_SECRET] = secrets.token_hex(32)
    return out


# --- Launcher back-channels (knobs.BACK_CHANNELS): what a launcher tells the ranks it starts.
# This module is the one that reads them; launchers write them through the helpers below.

LOCAL_SPAWN = internal("LOCAL_SPAWN")
CLUSTER = internal("CLUSTER")
CLUSTER_HOST = internal("CLUSTER_HOST")
LINK_RATE = internal("LINK_RATE_BPS")
FLOW_RATE = internal("FLOW_RATE_BPS")
HOST_RATES = internal("HOST_RATES_BPS")
NCCL_LOG_DIR = internal("NCCL_LOG_DIR")
# What `wirespeed cluster exec` tells a process about the emulated links (link_env); launchers
# that start a fresh environment (ssh) hand them on.
LINK_VARS = (CLUSTER, LINK_RATE, FLOW_RATE, HOST_RATES)
# The interface every library should use, set alike by the launchers that know it.
IFNAME_VARS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "OMPI_MCA_btl_tcp_if_include",
               "OMPI_MCA_oob_tcp_if_include", "WIRESPEED_IFNAME")


def spawned_here(environ=None) -> bool:
    """True in a rank that wirespeed's own launcher started (local spawn, mpirun, the emulated
    cluster): the shell that started it checked memory and outputs already. False under an outer
    launcher (torchrun, srun, mpirun by hand), whose ranks must check for themselves."""
    return (os.environ if environ is None else environ).get(LOCAL_SPAWN) == "1"


def torch_log_env(env) -> dict:
    """torch's C++ log level for a rank a wirespeed launcher starts: errors only, unless the user
    set TORCH_CPP_LOG_LEVEL. When a peer dies, torch's store client logs a warning with a C++
    stack from every thread that touches the job's store (the watchdog's signs of life, the
    admission watch), ahead of the one line wirespeed reports for it; the soak found them on the
    survivors' stderr."""
    return {"TORCH_CPP_LOG_LEVEL": env.get("TORCH_CPP_LOG_LEVEL", "ERROR")}


def local_spawn_env() -> dict:
    """What a wirespeed launcher adds to its ranks' environment so that they know (spawned_here)."""
    return {LOCAL_SPAWN: "1"}


def cluster_host_env(host: int) -> dict:
    """Which host of the emulated cluster a rank was placed on."""
    return {CLUSTER_HOST: f"h{host}"}


def link_env(name: str, rate_bps: int, flow_rate_bps: int | None = None,
             host_rates: dict | None = None) -> dict:
    """What tells a process that it runs on the emulated cluster `name`, and at which link rates,
    so that the records carry them (link_fields) whoever started it."""
    env = {CLUSTER: name, LINK_RATE: str(rate_bps)}
    if flow_rate_bps:
        env[FLOW_RATE] = str(flow_rate_bps)
    if host_rates:  # hosts with a link of their own rate (cluster up --host-rate)
        env[HOST_RATES] = ",".join(f"{i}={r}" for i, r in host_rates.items())
    return env


def on_cluster(environ=None) -> bool:
    """True in a process on a host of the emulated cluster (link_env was set)."""
    return bool((os.environ if environ is None else environ).get(CLUSTER))


def link_fields(environ=None) -> dict:
    """What a rank started on the emulated cluster adds to each record (empty elsewhere)."""
    environ = os.environ if environ is None else environ
    raw = environ.get(LINK_RATE)
    if not raw or not raw.isdigit():
        return {}
    out = {"link_rate_gbps": int(raw) / 1e9, "cluster": environ.get(CLUSTER)}
    flow = environ.get(FLOW_RATE)
    if flow and flow.isdigit():
        out["flow_rate_gbps"] = int(flow) / 1e9
    own = environ.get(HOST_RATES)
    if own:
        pairs = [p.split("=", 1) for p in own.split(",") if "=" in p]
        out["host_rates_gbps"] = {f"h{i}": int(r) / 1e9 for i, r in pairs if i.isdigit() and r.isdigit()}
    return out


def nccl_log_dir(environ=None) -> str | None:
    """--fast-net: the folder this job's NCCL logs go to (set by the launching process), if any."""
    return (os.environ if environ is None else environ).get(NCCL_LOG_DIR) or None
