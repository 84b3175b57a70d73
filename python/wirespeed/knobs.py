"""The WIRESPEED_* environment: three kinds of variable, named so that they cannot collide.

- **Core knobs** (`CORE`): read by the native core, the NCCL plugin or the transport's Python
  side; they change how wirespeed moves data, so a command that starts other commands (compare,
  tune) passes the user's values on to them.
- **Flag twins**: every other `WIRESPEED_*` name is the environment twin of a command-line flag
  (`--max-bytes` <- WIRESPEED_MAX_BYTES; cli/common.py). A twin belongs to the command that was
  run, so commands drop them before starting others. A flag whose twin would be a core knob gets
  another twin (`predict --algo` <- WIRESPEED_PREDICT_ALGO) unless it means the same thing.
- **Launcher back-channels** (`_WIRESPEED_*`, note the underscore): what a launcher tells the rank
  processes it starts (`internal("CLUSTER")`, each named in BACK_CHANNELS; launch/environment.py
  reads and writes them). Never a user's setting; dropped like twins.
- **Diagnostics** (`DIAGNOSTIC`): read to say more, never to change what moves.

Python code names these variables here and touches them in the process environment in a few
files only (tests/unit/test_knobs.py holds the list).
"""
from __future__ import annotations

# name -> what it sets (docs/transport.md and README list defaults and ranges)
CORE = {
    "WIRESPEED_ALGO": "the collective algorithm (one host: oneshot, rsag; across hosts: hier, ring, doubling)",
    "WIRESPEED_NSTREAMS": "TCP streams per connection",
    "WIRESPEED_GROW_BYTES": "message size from which a pair of ranks on different hosts opens all its streams (one before; 0: all at once)",
    "WIRESPEED_CHUNK_BYTES": "bytes per TCP chunk",
    "WIRESPEED_IO_THREADS": "TCP reactor threads",
    "WIRESPEED_SOCKBUF": "socket buffer bytes per stream",
    "WIRESPEED_NOTSENT_LOWAT": "unsent bytes the kernel holds per stream",
    "WIRESPEED_NET_SPIN_US": "how long a TCP wait spins",
    "WIRESPEED_SPIN_US": "how long a shared-memory wait spins",
    "WIRESPEED_WORKER": "0: no background worker thread",
    "WIRESPEED_IFNAME": "the interface to listen on",
    "WIRESPEED_HOSTID": "this host's id (ranks with other ids use TCP)",
    "WIRESPEED_STAGE_MAX": "largest exchange staged through shared memory",
    "WIRESPEED_PAIR_STAGE_MAX": "the same for 2-rank exchanges",
    "WIRESPEED_SLOT_BYTES": "shared-memory slot size",
    "WIRESPEED_BLOCK_BYTES": "reduce-scatter block size",
    "WIRESPEED_GATHER_RING_MIN": "per-rank chunk from which all_gather/reduce_scatter across 3+ hosts take the ring",
    "WIRESPEED_A2A_LEADERS_MAX": "largest piece with which all_to_all across hosts goes through the host leaders",
    "WIRESPEED_NET_ALLOW_LOOPBACK": "the NCCL plugin may offer loopback",
    "WIRESPEED_SOCKET_FAMILY": "the NCCL plugin's address family",
    "WIRESPEED_NCCL_PLUGIN": "where the NCCL plugin library is",
    "WIRESPEED_CONNECT": "when ranks on different hosts connect: lazy (on first use, the default) or eager (all at setup)",
    "WIRESPEED_JOB_SECRET": "the secret every TCP connection of a job proves (wirespeed's launchers make one per job)",
    "WIRESPEED_JOB_ID": "the job's identity every rank proves (default: the launcher's: torchrun run id, SLURM job and step, MPI namespace)",
}

# Read by wirespeed's Python to say more about what happened; they change nothing that moves.
# Not core knobs (the crates never read them), so commands drop them for their children as twins.
DIAGNOSTIC = {
    "WIRESPEED_SETUP_STATS": "1: every group setup prints its figures on stderr (native/rendezvous.py)",
}

TWIN_PREFIX = "WIRESPEED_"
INTERNAL_PREFIX = "_WIRESPEED_"

# Launcher back-channels, by internal name; launch/environment.py reads and writes them.
BACK_CHANNELS = {
    "LOCAL_SPAWN": "1: started by wirespeed's own spawn, mpirun or cluster launch, whose shell "
                   "checked memory and outputs already",
    "CLUSTER": "the emulated cluster this process runs on",
    "CLUSTER_HOST": "its host there (h0, h1, ...)",
    "LINK_RATE_BPS": "the emulated links' rate, bit/s",
    "FLOW_RATE_BPS": "the emulated per-flow cap, bit/s",
    "HOST_RATES_BPS": "hosts whose link has a rate of its own: i=bps,...",
    "NCCL_LOG_DIR": "--fast-net: where each rank's NCCL writes the log the rank then checks",
}


def internal(name: str) -> str:
    """A launcher back-channel's variable: internal("CLUSTER") -> _WIRESPEED_CLUSTER."""
    if name not in BACK_CHANNELS:
        raise KeyError(f"{name}: not a back-channel named in knobs.BACK_CHANNELS")
    return INTERNAL_PREFIX + name


def twin(flag: str) -> str:
    """A flag's environment twin: --max-bytes -> WIRESPEED_MAX_BYTES."""
    return TWIN_PREFIX + flag.lstrip("-").replace("-", "_").upper()


def is_twin(name: str) -> bool:
    return name.startswith(TWIN_PREFIX) and name not in CORE


def for_children(env: dict, drop=()) -> dict:
    """`env` for a command started by another: without flag twins, back-channels and `drop`;
    with the user's core knobs."""
    return {k: v for k, v in env.items()
            if not (is_twin(k) or k.startswith(INTERNAL_PREFIX) or k in drop)}
