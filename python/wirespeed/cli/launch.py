"""`wirespeed launch --hosts FILE -N K -- wirespeed bench ...`: one job over many hosts
(launch/remote.py plans each rank's command and starts them). --dry-run prints the exact per-rank
commands instead of running them.
"""
from __future__ import annotations

import os
import shlex
import shutil
import sys

from ..errors import UsageError
from ..launch.environment import DEFAULT_PORT
from .common import add, positive_int

def register(sub) -> None:
    p = sub.add_parser("launch", help="run a command as the ranks of one job over the hosts of a "
                       "hosts file (ssh, or netns: for the emulated cluster)",
                       description="Start -N ranks per host of a hosts file (mpirun's `host slots=N`, "
                       "MPICH's `host:N`, one host per line, or `netns:NAME`), each with torchrun's "
                       "environment, and supervise them: if one fails, the rest are stopped.")
    add(p, "--hosts", dest="hostfile", default=None, help="hosts file")
    add(p, "-N", "--nproc-per-host", default=None, type=positive_int("-N"),
        help="ranks per host (default: the file's slots, else 1)")
    add(p, "--master-addr", default=None, help="rank 0's address as the others reach it "
        "(default: the first host)")
    add(p, "--master-port", default=None, type=positive_int("--master-port"),
        help=f"rendezvous port (default {DEFAULT_PORT}; a free one on netns hosts)")
    add(p, "--ifname", default=None, same_as_core=True, help="network interface every library should use on ssh hosts "
        "(sets GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME, OMPI_MCA_btl_tcp_if_include, WIRESPEED_IFNAME)")
    add(p, "--workdir", default=None, help="directory to run in on ssh hosts (default: this one)")
    add(p, "--ssh", default="ssh -o BatchMode=yes -o ConnectTimeout=10",
        help="the ssh command to reach hosts")
    p.add_argument("-x", "--export", action="append", default=None, metavar="VAR",
                   help="pass this environment variable on to ssh ranks (repeatable), as mpirun -x does")
    add(p, "--fast-net", action="store_true", help="run NCCL's inter-host traffic through the "
        "wirespeed network plugin (sets NCCL_NET_PLUGIN, NCCL_NET and LD_LIBRARY_PATH for every "
        "rank; `make plugin` builds it; on ssh hosts it must sit at the same path)")
    add(p, "--dry-run", action="store_true", help="print each rank's command and exit")
    p.add_argument("command", nargs="*", help="after --: the command each rank runs")
    p.set_defaults(func=main)


def _command(args, argv) -> list[str]:
    cmd = list(args.command)
    if "--" in argv:
        cmd = argv[argv.index("--") + 1:]
    if not cmd:
        raise UsageError("no command to launch: put it after --, e.g. "
                         "`wirespeed launch --hosts hosts.txt -N 2 -- wirespeed bench -e 64M`")
    return cmd


def _check_ssh(ssh: str) -> None:
    """--ssh (or WIRESPEED_SSH) as a command line, said in one line when it is not one."""
    try:
        words = shlex.split(ssh)
    except ValueError as e:
        raise UsageError(f"--ssh {ssh!r} cannot be read as a command line ({e}): quote it as "
                         "a shell would, e.g. --ssh 'ssh -i ~/.ssh/key -o Port=2222'") from None
    if not words:
        raise UsageError("--ssh is empty: give the command that reaches a host, e.g. "
                         "--ssh 'ssh -o BatchMode=yes -i ~/.ssh/key'")


def main(args, argv) -> int:
    from ..launch.hosts import ranks_per_host, read_hosts
    from ..launch.remote import free_port, plan, start
    if not args.hostfile:
        raise UsageError("--hosts FILE is required: one host per line (`node01 slots=4`, or "
                         "`netns:NAME` for the emulated cluster)")
    cmd = _command(args, argv)
    if args.master_port is not None and not 0 < args.master_port < 65536:
        raise UsageError(f"--master-port must be 1..65535, got {args.master_port}")
    hosts = read_hosts(args.hostfile)
    counts = ranks_per_host(hosts, args.nproc_per_host)
    if any(h.netns for h in hosts):
        from ..netem.ns import require_admin
        require_admin("netns: hosts")
    if any(not h.netns for h in hosts):
        _check_ssh(args.ssh)
    fast_net = None
    if args.fast_net:
        from ..netplugin import fast_net_env
        fast_net = fast_net_env()
    # A secret per job for the transport's handshake (docs/transport.md), unless the user gave
    # one. A dry run prints commands: it names the variable, never a value.
    from ..launch.environment import JOB_SECRET, with_job_secret
    environ = with_job_secret(dict(os.environ))
    if args.dry_run:
        environ.pop(JOB_SECRET)
    ranks = plan(hosts, counts, cmd, master_addr=args.master_addr, master_port=args.master_port,
                 ifname=args.ifname, workdir=args.workdir, ssh=args.ssh, exports=args.export or (),
                 environ=environ, free_port=free_port, fast_net=fast_net)
    if args.dry_run:
        sys.stderr.write(f"# the commands carry no {JOB_SECRET}: export one value of it to every "
                         "rank (docs/transport.md), or the job token alone admits\n")
        for r in ranks:
            print(f"# rank {r.rank} on {r.host}\n{r.shell()}")
        return 0
    if any(not h.netns for h in hosts) and shutil.which(shlex.split(args.ssh)[0]) is None:
        raise UsageError(f"`{shlex.split(args.ssh)[0]}` is not installed: install an ssh client "
                         "or use --dry-run and start the commands yourself")
    return start(ranks)
