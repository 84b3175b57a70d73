"""The NCCL network plugin's throughput with one TCP stream and with several, in one run.

    .venv/bin/python benchmarks/nccl_plugin_streams.py --where loopback
    sudo .venv/bin/python benchmarks/nccl_plugin_streams.py --where cluster --rate 2gbit --flow-rate 250mbit
    sudo .venv/bin/python benchmarks/nccl_plugin_streams.py      # both

Runs the plugin driver (target/nccl-plugin/wirespeed-nccl-driver, built by `make plugin`) in its
`bench` scenario: two processes load libnccl-net-wirespeed.so through dlopen, connect as NCCL's
proxy does, and rank 0 sends to rank 1 in 512 KiB messages with 8 in flight (NCCL's default step
size and step count per connection); rank 1 times the transfer and spot-checks the bytes. With
--bidir both directions at once, as in a ring all_reduce. The same run measures each
WIRESPEED_NSTREAMS value in alternating rounds, so machine load hits them alike, and prints the
median rate and its ratio to one stream.

On the emulated cluster (2 hosts in network namespaces, each link capped by htb at --rate each
way, and each TCP flow at --flow-rate) it also prints rate x 8 / link: the share of the link the
plugin fills. The cluster is built for the run and torn down after it, even on error.
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys

from wirespeed.netem import cluster as C
from wirespeed.netem.units import parse_rate

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DRIVER = os.path.join(ROOT, "target", "nccl-plugin", "wirespeed-nccl-driver")
NAME = "ncclplug"
RESULT = re.compile(r"RESULT .* GBps=([0-9.]+)")


def run_pair(streams: int, total: str, wraps: tuple[list[str], list[str]], env: dict, bidir: bool,
             msg: str, window: int, timeout: int) -> float:
    cmd = [DRIVER, "pair", "--scenario", "bench", "--api", "11", "--msg", msg, "--window", str(window),
           "--total", total, "--timeout", str(timeout)]
    if bidir:
        cmd.append("--bidir")
    for i, w in enumerate(wraps):
        if w:
            cmd += [f"--wrap{i}", " ".join(w)]
    e = dict(os.environ, **env, WIRESPEED_NSTREAMS=str(streams))
    p = subprocess.run(cmd, env=e, capture_output=True, text=True, timeout=timeout + 30)
    rates = [float(m.group(1)) for m in RESULT.finditer(p.stdout)]
    if p.returncode != 0 or not rates:
        raise SystemExit(f"driver failed with {streams} streams:\n{p.stdout[-1500:]}\n{p.stderr[-1500:]}")
    return statistics.mean(rates)  # with --bidir: the mean of both receivers


def sweep(label: str, streams_list: list[int], totals: dict[int, str], wraps, env, args,
          link_bps: int | None) -> None:
    results: dict[int, list[float]] = {s: [] for s in streams_list}
    for rnd in range(args.rounds):
        order = streams_list if rnd % 2 == 0 else streams_list[::-1]
        for s in order:
            r = run_pair(s, totals[s], wraps, env, args.bidir, args.msg, args.window, args.timeout)
            results[s].append(r)
            extra = f", {r * 8e9 / link_bps:.1%} of the link" if link_bps else ""
            print(f"  {label} round {rnd} streams {s:>2}: {r:.4f} GB/s{extra}", flush=True)
    base = statistics.median(results[streams_list[0]])
    print(f"\n{label}: median of {args.rounds} rounds, {args.msg} messages, {args.window} in flight"
          f"{', both directions' if args.bidir else ''}")
    print(f"{'streams':>8} {'GB/s':>9} {'x ' + str(streams_list[0]) + ' stream':>11}"
          + (f" {'x8/link':>8}" if link_bps else ""))
    for s in streams_list:
        m = statistics.median(results[s])
        row = f"{s:>8} {m:>9.4f} {m / base:>11.2f}"
        if link_bps:
            row += f" {m * 8e9 / link_bps:>8.1%}"
        print(row)
    print(flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--where", default="loopback,cluster", help="loopback, cluster, or both")
    ap.add_argument("--streams", default="1,2,4,8", help="WIRESPEED_NSTREAMS values to compare")
    ap.add_argument("--rate", default="2gbit", help="cluster: link cap per host, each way")
    ap.add_argument("--flow-rate", default="250mbit", help="cluster: cap per TCP flow (0: none)")
    ap.add_argument("--msg", default="512K", help="message size (NCCL's step: 4 MiB buffer / 8 steps)")
    ap.add_argument("--window", type=int, default=8, help="messages in flight per connection")
    ap.add_argument("--seconds", type=float, default=3.0, help="cluster: about this long per run")
    ap.add_argument("--loopback-total", default="1G", help="loopback: bytes per run")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--bidir", action="store_true", help="both directions at once")
    ap.add_argument("--timeout", type=int, default=120)
    args = ap.parse_args(argv)
    if not os.access(DRIVER, os.X_OK):
        raise SystemExit(f"{DRIVER} is missing: run `make plugin` first")
    streams = [int(s) for s in args.streams.split(",")]
    where = set(args.where.split(","))
    if "loopback" in where:
        env = {"WIRESPEED_IFNAME": "lo", "WIRESPEED_NET_ALLOW_LOOPBACK": "1"}
        print(f"# loopback, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the start")
        sweep("loopback", streams, {s: args.loopback_total for s in streams}, ([], []), env, args, None)
    if "cluster" in where:
        rate = parse_rate(args.rate)
        flow = parse_rate(args.flow_rate) if args.flow_rate not in ("0", "") else None
        c, _ = C.up(2, rate, flow, name=NAME, measure=True)
        try:
            h0, h1 = c.hosts
            m = c.measured
            print(f"# emulated cluster: link {rate / 1e9:g} Gbit/s per host each way"
                  + (f", each TCP flow capped at {flow / 1e9:g} Gbit/s" if flow else "")
                  + f"; measured h0 -> h1: 1 flow {m['one_flow_bps'] / 1e9:.3f} Gbit/s, "
                  f"{m['streams']} flows {m['parallel_bps'] / 1e9:.3f} Gbit/s")
            # Size each run for about --seconds at the rate its stream count can reach.
            totals = {}
            for s in streams:
                bps = min(rate, (flow or rate) * s)
                totals[s] = str(max(16 << 20, int(bps / 8 * args.seconds)) >> 20) + "M"
            wraps = (["ip", "netns", "exec", h0.netns], ["ip", "netns", "exec", h1.netns])
            env = {"WIRESPEED_IFNAME": h0.ifname}
            sweep("cluster", streams, totals, wraps, env, args, rate)
        finally:
            C.down(NAME)
    return 0


if __name__ == "__main__":
    sys.exit(main())
