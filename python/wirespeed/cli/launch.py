"""`wirespeed launch --hosts FILE -N K -- wirespeed bench ...`: one job over many hosts.

Every rank gets torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
MASTER_PORT), so the command it runs behaves as under torchrun. Real hosts are reached with ssh
(one session per rank, as MXNet's launcher does); `netns:NAME` hosts of the emulated cluster are
entered as `wirespeed cluster exec` enters them, other namespaces with `ip netns exec`. --dry-run
prints the exact per-rank commands instead of running them.
"""
from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass

from ..errors import UsageError
from .common import add, positive_int

DEFAULT_PORT = 29500
# What `wirespeed cluster exec` tells a process about the emulated links (launch/cluster.link_env).
LINK_VARS = ("_WIRESPEED_CLUSTER", "_WIRESPEED_LINK_RATE_BPS", "_WIRESPEED_FLOW_RATE_BPS",
             "_WIRESPEED_HOST_RATES_BPS")


@dataclass
class RankLaunch:
    rank: int
    host: str
    argv: list[str]

    def shell(self) -> str:
        return " ".join(shlex.quote(a) for a in self.argv)


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


def _netns_address(ns: str) -> tuple[str, str, list[str]]:
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
            env = {"_WIRESPEED_CLUSTER": c.name, "_WIRESPEED_LINK_RATE_BPS": str(c.rate_bps)}
            if c.flow_rate_bps:
                env["_WIRESPEED_FLOW_RATE_BPS"] = str(c.flow_rate_bps)
            return env
    return {}


def plan(hosts, counts, cmd, *, master_addr=None, master_port=None, ifname=None, workdir=None,
         ssh="ssh", exports=(), environ=None, resolve=_netns_address, free_port=None,
         fast_net=None) -> list[RankLaunch]:
    """Each rank's full command line, in rank order. Pure but for `resolve` and `free_port`.
    `fast_net`: the plugin's variables (wirespeed.netplugin.fast_net_env) for every rank."""
    from ..launch.cluster import IFNAME_VARS
    from ..launch.environment import JOB_SECRET
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
                   "OMP_NUM_THREADS": environ.get("OMP_NUM_THREADS", "1")}
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


def _free_port(ns: str, addr: str) -> int:
    from ..launch.cluster import free_port_in
    return free_port_in(ns, addr)



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
    from ..launch.local import _die_with_parent, supervise
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
                 environ=environ, free_port=_free_port, fast_net=fast_net)
    if args.dry_run:
        sys.stderr.write(f"# the commands carry no {JOB_SECRET}: export one value of it to every "
                         "rank (docs/transport.md), or the job token alone admits\n")
        for r in ranks:
            print(f"# rank {r.rank} on {r.host}\n{r.shell()}")
        return 0
    if any(not h.netns for h in hosts) and shutil.which(shlex.split(args.ssh)[0]) is None:
        raise UsageError(f"`{shlex.split(args.ssh)[0]}` is not installed: install an ssh client "
                         "or use --dry-run and start the commands yourself")
    procs = []
    try:
        for r in ranks:
            procs.append(subprocess.Popen(r.argv, preexec_fn=_die_with_parent,
                                          stdin=subprocess.DEVNULL))
    except OSError as e:
        for p in procs:
            p.kill()
        raise UsageError(f"could not start rank {len(procs)}: {e}") from None
    return supervise(procs)
