"""--fast-net (bench, train): NCCL's inter-host traffic through the wirespeed network plugin, and
the proof from NCCL's own logs that the plugin carried it (docs/plugin.md)."""
from __future__ import annotations

import os
import sys

from ..errors import UsageError


def enable_fast_net(backend: str) -> None:
    """Point NCCL at the wirespeed network plugin for this process and the ranks it starts (they
    inherit the environment); a rank started by another launcher only needs the absolute path."""
    if backend != "nccl":
        raise UsageError(f"--fast-net makes NCCL use the wirespeed network plugin; this run uses "
                         f"{backend}: add --backend nccl (GPU tensors)")
    from ..netplugin import fast_net_env
    env = fast_net_env()
    if os.environ.get("NCCL_NET_PLUGIN") == env["NCCL_NET_PLUGIN"]:
        env.pop("LD_LIBRARY_PATH")  # set already by the launching process
    os.environ.update(env)
    # NCCL falls back to its sockets without a word when a plugin does not load: have it log
    # which network it took, to a file per process, which each rank reads after the run.
    from ..launch.environment import nccl_log_dir
    from ..nccl_log import debug_env
    os.environ.update(debug_env(os.environ))
    if nccl_log_dir():
        # NCCL writes to stdout instead where the folder is missing; ranks on other machines make
        # it again before their backend starts (bench/run.py: before_start).
        os.makedirs(nccl_log_dir(), exist_ok=True)


def fast_net_unproven(backend, info) -> bool:
    """With --fast-net, whether NCCL's own logs fail to show that the plugin carried the traffic
    (docs/plugin.md): every rank's NCCL must have taken network wirespeed, and the job's
    connections between hosts gone through it. Every rank must call it (one allgather); each
    rank names its own problem, rank 0 the job's."""
    from ..launch.environment import nccl_log_dir
    from ..nccl_log import NET_NAME, own_log_findings
    log_dir = nccl_log_dir()
    if not log_dir or os.environ.get("NCCL_NET") != NET_NAME or info.world_size < 2:
        return False   # not --fast-net, or one rank alone (train's scaling run): nothing to carry
    problem, conns = own_log_findings(log_dir)
    rows = backend.allgather_floats([1.0 if problem else 0.0, float(conns)])
    bad = [r for r, row in enumerate(rows) if row[0]]
    total = int(sum(row[1] for row in rows))
    if problem:
        sys.stderr.write(f"wirespeed: error: --fast-net: rank {info.rank}: {problem}\n")
    if info.rank == 0:
        if bad:
            sys.stderr.write(f"wirespeed: error: --fast-net: NCCL did not use the wirespeed plugin "
                             f"in rank{'s' if len(bad) > 1 else ''} {','.join(map(str, bad))}: "
                             "the numbers above are not the plugin's\n")
        elif total == 0:
            sys.stderr.write("wirespeed: error: --fast-net: NCCL loaded the wirespeed plugin but no "
                             f"connection went through it (no 'via NET/{NET_NAME}' in its logs, "
                             f"{log_dir}): the ranks shared a host, so NCCL used shared memory or "
                             "P2P; put them on different hosts (--cluster, --host-per-rank)\n")
        else:
            print(f"# NCCL's logs ({log_dir}): every rank took network {NET_NAME}; {total} "
                  f"connection setups via NET/{NET_NAME}")
    return bool(bad) or total == 0


