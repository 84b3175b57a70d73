"""`wirespeed cluster up|status|down|link`: an emulated cluster of hosts on this machine.

The hosts are network namespaces with capped links to a switch namespace (see wirespeed.netem);
`wirespeed bench --cluster` then places ranks on them. Needs root or CAP_NET_ADMIN.
"""
from __future__ import annotations

from ..errors import UsageError
from .common import Parser, add, positive_int

# TCP goodput over a capped Ethernet link: 1448 payload bytes per 1514-byte frame (20 IP + 32 TCP
# with timestamps + 14 Ethernet). tc counts whole frames, so this is the most a TCP flow can show.
TCP_GOODPUT = 1448 / 1514


def register(sub) -> None:
    p = sub.add_parser("cluster", help="emulate a cluster on this machine: hosts as network "
                       "namespaces with capped links (needs root)",
                       description="Hosts as network namespaces joined by veth links to a switch "
                       "namespace, each link capped with tc htb; `bench --cluster` runs ranks on them.")
    cmds = p.add_subparsers(dest="cluster_cmd", metavar="ACTION", parser_class=Parser)

    u = cmds.add_parser("up", help="build the cluster (replacing one of the same name)")
    _name(u)
    add(u, "--hosts", default="4", type=positive_int("--hosts"), help="number of hosts")
    add(u, "--rate", default="1gbit", help="each host's link rate, each direction (tc units: 1gbit, 300mbit)")
    add(u, "--flow-rate", default=None,
        help="cap each TCP flow below the link rate, as cloud networks do (e.g. 300mbit)")
    add(u, "--delay", default=None, help="one-way delay per link, e.g. 100us (needs the netem qdisc)")
    u.add_argument("--host-rate", action="append", default=[], metavar="hN=RATE",
                   help="give host N a link of its own rate, e.g. h2=200mbit (repeatable): a slow "
                   "link for `wirespeed links` to find")
    add(u, "--no-measure", action="store_true", help="skip measuring what the caps really give")
    u.set_defaults(func=cmd_up)

    s = cmds.add_parser("status", help="hosts, addresses, caps and the measured rates")
    _name(s)
    add(s, "--measure", action="store_true", help="measure the link and flow rates again now")
    add(s, "--json", dest="as_json", action="store_true", help="print the cluster's state as JSON")
    s.set_defaults(func=cmd_status)

    d = cmds.add_parser("down", help="remove the cluster, and anything a killed run left behind")
    _name(d)
    add(d, "--all", dest="all_clusters", action="store_true",
        help="remove every wirespeed cluster on this machine")
    d.set_defaults(func=cmd_down)

    f = cmds.add_parser("hostfile", help="print a hosts file of the cluster for `wirespeed launch` "
                        "(or, with --names, for mpirun inside the cluster)")
    _name(f)
    add(f, "--slots", default=None, type=positive_int("--slots", 1), help="slots=N on every line")
    add(f, "--names", action="store_true", help="the hosts' names (`wsnet-ws-h0 slots=N`), as "
        "mpirun's --hostfile takes them: they resolve on every host of the cluster, not outside it")
    f.set_defaults(func=cmd_hostfile)

    x = cmds.add_parser("exec", help="run a command on one host: its network, host name, hosts "
                        "file and /dev/shm, with this machine's /sys and file systems",
                        description="Run COMMAND as a process of one emulated host, as ssh to a "
                        "real host would: in the host's network namespace, with the host's name "
                        "as hostname, its hosts file (every host resolves every other by name) and "
                        "its own /dev/shm. The machine's /sys (cgroups included) and file systems "
                        "stay visible, so daemons such as slurmd run there. The exit status is "
                        "COMMAND's.")
    _name(x)
    x.add_argument("host", help="h1, 1, the host's name (wsnet-ws-h1) or its address")
    x.add_argument("command", nargs="*", help="after --: the command and its arguments")
    x.set_defaults(func=cmd_exec)

    k = cmds.add_parser("link", help="take a host's link down or up (a pulled cable)")
    _name(k)
    k.add_argument("host", help="host index or name: 1 or h1")
    k.add_argument("state", choices=("up", "down"))
    k.set_defaults(func=cmd_link)

    p.set_defaults(func=lambda args, argv: (p.print_help(), 2)[1])


def _name(p) -> None:
    from ..netem.cluster import DEFAULT_NAME
    add(p, "--cluster-name", "--name", "--cluster", dest="cluster_name", default=DEFAULT_NAME,
        help="which cluster (several can exist side by side)")


def cmd_up(args, argv) -> int:
    from ..netem import cluster as C
    from ..netem.units import parse_delay, parse_rate
    rate = parse_rate(args.rate, "--rate")
    flow = parse_rate(args.flow_rate, "--flow-rate") if args.flow_rate else None
    delay = parse_delay(args.delay) if args.delay else None
    host_rates = parse_host_rates(args.host_rate)
    C.check_name(args.cluster_name)
    c, removed = C.up(int(args.hosts), rate, flow, delay, name=args.cluster_name,
                      measure=not args.no_measure, host_rates=host_rates)
    if removed:
        print(f"# removed an earlier cluster's namespaces: {' '.join(removed)}")
    print(describe(c))
    return 0


def parse_host_rates(items: list[str]) -> dict[int, int]:
    """['h2=200mbit', '3=1gbit'] -> {2: 200_000_000, 3: 1_000_000_000}."""
    from ..netem.units import parse_rate
    out: dict[int, int] = {}
    for item in items:
        host, sep, rate = item.partition("=")
        index = host.strip()[1:] if host.strip().startswith("h") else host.strip()
        if not sep or not index.isdigit():
            raise UsageError(f"--host-rate {item!r}: write HOST=RATE, e.g. h2=200mbit")
        if int(index) in out:
            raise UsageError(f"--host-rate names h{index} twice")
        out[int(index)] = parse_rate(rate, f"--host-rate h{index}")
    return out


def cmd_status(args, argv) -> int:
    from ..netem import cluster as C
    C.check_name(args.cluster_name)
    c = C.remeasure(args.cluster_name) if args.measure else C.load(args.cluster_name)
    if c is None:
        left = C.leftovers(args.cluster_name)
        print(f"no emulated cluster {args.cluster_name!r} is up"
              + (f"; leftover namespaces {' '.join(left)}: `wirespeed cluster down` removes them"
                 if left else ""))
        return 1
    print(c.to_json() if args.as_json else describe(c))
    return 0


def cmd_down(args, argv) -> int:
    from ..netem import cluster as C
    C.check_name(args.cluster_name)
    removed = C.down(args.cluster_name, all_clusters=args.all_clusters)
    print(f"removed {' '.join(removed)}" if removed else "nothing to remove")
    return 0


def cmd_hostfile(args, argv) -> int:
    from ..netem import cluster as C
    c = C.require(C.check_name(args.cluster_name))
    slots = f" slots={args.slots}" if args.slots else ""
    prefix = "" if args.names else "netns:"
    print("\n".join(f"{prefix}{h.netns}{slots}" for h in c.hosts))
    return 0


def cmd_exec(args, argv) -> int:
    import os
    import shutil
    import sys

    from ..launch.cluster import link_env
    from ..netem import cluster as C
    from ..netem.ns import require_admin
    cmd = argv[argv.index("--") + 1:] if "--" in argv else list(args.command)
    if not cmd:
        raise UsageError("no command to run: put it after --, e.g. "
                         "`wirespeed cluster exec h1 -- hostname`")
    require_admin("wirespeed cluster exec")
    for tool in ("nsenter", "unshare"):
        if shutil.which(tool) is None:
            raise UsageError(f"wirespeed cluster exec needs `{tool}`: install util-linux")
    c = C.require(C.check_name(args.cluster_name))
    host = C.find_host(c, args.host)
    env = dict(os.environ)
    env.update(link_env(c))  # so bench's records name the link rates, as on the cluster launcher
    argv_ = [*C.exec_prefix(host.netns), *cmd]
    sys.stdout.flush()
    sys.stderr.flush()
    # Replace this process, so that signals reach COMMAND and its exit status is ours.
    os.execvpe(argv_[0], argv_, env)


def cmd_link(args, argv) -> int:
    from ..netem import cluster as C
    c = C.require(args.cluster_name)
    h = C.find_host(c, args.host)
    C.set_link(c.name, h.index, args.state == "up")
    print(f"link of h{h.index} is {args.state}")
    return 0


def describe(c) -> str:
    from ..netem.units import human_rate
    delay = f"{c.delay_s * 1e6:g} us one-way delay (netem)" if c.delay_s else "no added delay"
    flow = f", each TCP flow capped at {human_rate(c.flow_rate_bps)}" if c.flow_rate_bps else ""
    lines = [f"# emulated cluster {c.name!r}: {len(c.hosts)} hosts, link {human_rate(c.rate_bps)} "
             f"each way (tc {c.shaper}){flow}, {delay}",
             f"# {'host':<5} {'namespace':<24} {'if':<4} address"]
    for h in c.hosts:
        own = f"  link {human_rate(c.rate_of(h.index))}" if str(h.index) in c.host_rates else ""
        lines.append(f"  h{h.index:<4} {h.netns:<24} {h.ifname:<4} {h.addr}{own}")
    m = c.measured
    if m:
        flow_cap = c.flow_rate_bps or c.rate_bps
        lines.append(f"# measured {m['from']} -> {m['to']}, TCP goodput over {m['seconds']:g} s: "
                     f"1 flow {human_rate(m['one_flow_bps'])} ({m['one_flow_bps'] / flow_cap:.1%} of "
                     f"{'flow cap' if c.flow_rate_bps else 'link'}), {m['streams']} flows "
                     f"{human_rate(m['parallel_bps'])} ({m['parallel_bps'] / c.rate_bps:.1%} of link)")
        lines.append(f"# (TCP can show at most {TCP_GOODPUT:.1%} of a cap: tc counts Ethernet, IP and "
                     "TCP headers)")
    elif len(c.hosts) >= 2:
        lines.append("# not measured yet: `wirespeed cluster status --measure`")
    flag = "" if c.name == "ws" else f" --name {c.name}"
    from ..netem.cluster import agent_path
    lines.append(f"# a command on a host: wirespeed cluster exec{flag} h0 -- CMD; Open MPI's rsh "
                 f"agent (mpirun --mca plm_rsh_agent): {agent_path(c.name)}")
    lines.append("# run on it: wirespeed bench --cluster"
                 + ("" if c.name == "ws" else f" {c.name}") + " -N <ranks> ...; remove: "
                 "wirespeed cluster down" + ("" if c.name == "ws" else f" --name {c.name}"))
    return "\n".join(lines)

