"""How close `plan simulate` comes to `bench --plan` across emulated hosts (issue 24's 20 % goal).

    sudo .venv/bin/python benchmarks/plan_fidelity.py                          # 2 and 4 hosts
    sudo .venv/bin/python benchmarks/plan_fidelity.py --hosts 2 --rate 400mbit --sizes 1M,4M

Builds an emulated cluster (capped links, 1 Gbit/s by default) and for each of wirespeed's own
port-channel plans (plans/algorithms.py) at each host count:
- measures it: `wirespeed bench --plan` on the cluster, one rank per host, every call checked,
  the loop's time per call;
- predicts it twice with `wirespeed plan simulate` on the same plan and sizes, as many runs back
  to back as the loop has calls (`--runs`):
  - "link only": `cpu-emulated,port=<goodput>:50us`, the preset with the link's goodput (one
    pair of hosts, several flows);
  - "machine": the machine measured independently of the plans' runs, at this host count:
    `port=` the mean goodput per link while every host sends to the next at once (a ring of
    TCP flows, as many per pair as the executor's port groups open: execute.PORT_STREAMS),
    `port-fanin=` the mean goodput into one host's link while every other host sends to it at
    once (every host to every other, the same flows per pair; with 2 hosts there is no fan-in
    and it is left out), its latency from one small run (a 4 KiB sendrecv plan over the same
    hosts, the simulator's critical path at that size solved for the latency: the alpha of an
    alpha-beta model; the predicted rows are 1 MiB and up), `copy=` numpy's copy rate here, and
    `cores=` this machine's CPUs, shared by all the emulated hosts' ranks.
Prints both predictions / measured per plan, host count and size, and tears the cluster down,
even on error. Nothing is fitted to the rows it predicts.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

from wirespeed.netem import cluster as C
from wirespeed.netem.measure import tcp_throughput_many
from wirespeed.netem.units import parse_rate
from wirespeed.plans.algorithms import builtin, dump
from wirespeed.plans.execute import PORT_STREAMS

NAME = "planfid"
PLANS = ("allreduce_ring_port", "allgather_ring_port", "reducescatter_ring_port", "alltoall_port",
         "sendrecv_ring_port")


def wirespeed(*args, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "wirespeed.cli.main", *map(str, args)],
                          capture_output=True, text=True, env={**os.environ, **(env or {})})


def measured(path: str, hosts: int, args, sizes: str | None = None, iters: int | None = None) -> dict[int, float]:
    """bytes -> seconds per call, the loop's time (slowest rank), checked."""
    with tempfile.NamedTemporaryFile(suffix=".jsonl") as f:
        p = wirespeed("bench", "--plan", path, "--cluster", NAME, "-N", hosts, "--ranks-per-host", 1,
                      "--backend", "wirespeed", "--sizes", sizes or args.sizes, "-n", iters or args.iters, "-w", 1,
                      "--no-per-op", "--no-save", "--no-progress", "-T", 300, "--json", f.name)
        if p.returncode != 0:
            raise SystemExit(f"bench --plan {path} on {hosts} hosts failed:\n{p.stderr[-2000:]}")
        recs = [json.loads(line) for line in open(f.name) if line.strip()]
    bad = [r for r in recs if r.get("wrong")]
    if bad:
        raise SystemExit(f"{path}: wrong results on {hosts} hosts: {bad[:1]}")
    out: dict[int, list[float]] = {}
    for r in recs:
        out.setdefault(r["bytes"], []).append(r["time_us"] * 1e-6)
    return {b: min(ts) for b, ts in out.items()}   # in place and not: the better loop


def predicted(path: str, topology: str, sizes: list[int], runs: int = 1) -> dict[int, float]:
    """bytes -> simulated seconds per run, `runs` back to back as the measured loop makes them."""
    with tempfile.NamedTemporaryFile(suffix=".jsonl") as f:
        p = wirespeed("plan", "simulate", path, "--topology", topology, "--runs", runs,
                      "--sizes", ",".join(map(str, sizes)), "--json", f.name)
        if p.returncode != 0:
            raise SystemExit(f"plan simulate {path} failed:\n{p.stderr[-2000:]}")
        recs = [json.loads(line) for line in open(f.name) if line.strip()]
    return {r["size"]: r["time_us"] * 1e-6 for r in recs}


def copy_rate() -> float:
    """Bytes copied per second by numpy here (a proxy's copy, a local copy): best of 20 copies of
    16 MiB, between buffers already touched."""
    a = np.ones(1 << 22, dtype=np.float32)
    b = np.empty_like(a)
    best = float("inf")
    for _ in range(20):
        t = time.perf_counter()
        b[:] = a
        best = min(best, time.perf_counter() - t)
    return a.nbytes / best


def ring_goodput(c, hosts: int) -> float:
    """Mean bytes/s per link while each of the first `hosts` hosts sends to the next at once."""
    h = c.hosts[:hosts]
    pairs = [(h[i].netns, h[(i + 1) % hosts].netns, h[(i + 1) % hosts].addr) for i in range(hosts)]
    bps = tcp_throughput_many(pairs, streams=PORT_STREAMS, seconds=1.0)
    return sum(bps) / len(bps) / 8


def fanin_goodput(c, hosts: int) -> float:
    """Mean bytes/s into one host's link while each of the first `hosts` hosts sends to every
    other at once (hosts - 1 senders into every link): the incast a plan's alltoall makes, with
    no plan and no engine in it."""
    h = c.hosts[:hosts]
    pairs = [(i, j) for i in range(hosts) for j in range(hosts) if i != j]
    bps = tcp_throughput_many([(h[i].netns, h[j].netns, h[j].addr) for i, j in pairs],
                              streams=PORT_STREAMS, seconds=1.0)
    into = [sum(b for (_, j), b in zip(pairs, bps) if j == d) for d in range(hosts)]
    return sum(into) / len(into) / 8


LATENCY_PLAN, LATENCY_SIZE, LATENCY_ITERS = "sendrecv_ring_port", 4096, 50


def port_latency(tmp: str, hosts: int, base: str, args) -> tuple[float, float]:
    """The port latency that makes the simulator's time of a 4 KiB sendrecv plan the measured one:
    simulated time is linear in the latency (the latency hops on its critical path), so two
    simulations solve it. Returns (latency s, measured s)."""
    path = os.path.join(tmp, f"latency_{hosts}h.json")
    with open(path, "w") as f:
        f.write(dump(builtin(LATENCY_PLAN, hosts, 1)))
    meas = min(measured(path, hosts, args, sizes=str(LATENCY_SIZE), iters=LATENCY_ITERS).values())
    s0 = predicted(path, f"{base}:0us", [LATENCY_SIZE], LATENCY_ITERS)[LATENCY_SIZE]
    s1 = predicted(path, f"{base}:1000us", [LATENCY_SIZE], LATENCY_ITERS)[LATENCY_SIZE]
    return max(0.0, (meas - s0) / (s1 - s0) * 1e-3), meas


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", default="2,4")
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--sizes", default="1M,4M,16M")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--plans", default=",".join(PLANS))
    ap.add_argument("--latency-us", type=float, default=50.0,
                    help="port-channel latency given to the simulator (the preset's)")
    args = ap.parse_args()
    rate = parse_rate(args.rate)
    hosts = [int(h) for h in args.hosts.split(",")]
    rows = []
    notes = []
    cores = os.cpu_count() or 1
    copy = copy_rate()
    c, _ = C.up(max(hosts), rate, name=NAME, measure=True)
    try:
        goodput = c.measured["parallel_bps"] / 8          # bytes/s, several flows as the engine uses
        link_only = f"cpu-emulated,port={goodput / 1e9:.6f}GB/s:{args.latency_us}us"
        notes.append(f"# link only: {link_only} (h0 -> h1 with 4 flows, {goodput * 8 / 1e9:.3f} Gbit/s)")
        with tempfile.TemporaryDirectory(prefix="planfid-") as tmp:
            for h in hosts:
                ring = ring_goodput(c, h)
                fanin = fanin_goodput(c, h) if h > 2 else None
                base = f"cpu-emulated,copy={copy / 1e9:.3f}GB/s,cores={cores},port={ring / 1e9:.6f}GB/s"
                lat, small = port_latency(tmp, h, base, args)
                machine = f"{base}:{lat * 1e6:.0f}us"
                if fanin:
                    machine += f",port-fanin={fanin / 1e9:.6f}GB/s"
                fan = f"fan-in goodput {fanin * 8 / 1e9:.3f} Gbit/s per link; " if fanin else ""
                notes.append(f"# machine, {h} hosts: {machine} (ring goodput {ring * 8 / 1e9:.3f} Gbit/s per "
                             f"link; {fan}numpy copy {copy / 1e9:.2f} GB/s; {cores} cores; latency from "
                             f"{LATENCY_PLAN} at {LATENCY_SIZE} B measured {small * 1e3:.2f} ms)")
                for name in args.plans.split(","):
                    path = os.path.join(tmp, f"{name}_{h}h.json")
                    with open(path, "w") as f:
                        f.write(dump(builtin(name, h, 1)))
                    meas = measured(path, h, args)
                    p0 = predicted(path, link_only, sorted(meas), args.iters)
                    p1 = predicted(path, machine, sorted(meas), args.iters)
                    for b in sorted(meas):
                        if b in p0 and b in p1:
                            rows.append((name, h, b, p0[b], p1[b], meas[b]))
    finally:
        C.down(NAME)
    print(f"# {rate / 1e9:g} Gbit/s links; {args.iters} calls per loop; 1 rank per host")
    print("\n".join(notes))
    print("| plan | hosts | size | measured (ms) | link only (ms) | link only / measured | machine (ms) | "
          "machine / measured |")
    print("|---|---|---|---|---|---|---|---|")
    for name, h, b, p0, p1, m in rows:
        print(f"| {name} | {h} | {b >> 20} MiB | {m * 1e3:.2f} | {p0 * 1e3:.2f} | {p0 / m:.2f} | "
              f"{p1 * 1e3:.2f} | {p1 / m:.2f} |")
    for label, k in (("link only", 3), ("machine", 4)):
        far = [r for r in rows if r[2] >= 1 << 20 and abs(r[k] / r[5] - 1) > 0.2]
        print(f"# {label}: {len(rows) - len(far)} of {len(rows)} within 20 % at 1 MiB and above")
    return 0


if __name__ == "__main__":
    sys.exit(main())
