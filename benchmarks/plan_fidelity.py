"""How close `plan simulate` comes to `bench --plan` across emulated hosts (issue 24's 20 % goal).

    sudo .venv/bin/python benchmarks/plan_fidelity.py                          # 2 and 4 hosts
    sudo .venv/bin/python benchmarks/plan_fidelity.py --hosts 2 --rate 400mbit --sizes 1M,4M

Builds an emulated cluster (capped links, 1 Gbit/s by default), measures the link's TCP goodput
with several flows (what a port channel's bytes really get), and for each of wirespeed's own
port-channel plans (plans/algorithms.py) at each host count:
- measures it: `wirespeed bench --plan` on the cluster, one rank per host, every call checked,
  the loop's time per call;
- predicts it: `wirespeed plan simulate --topology cpu-emulated,port=<goodput>:<latency>` with the
  same plan and sizes.
Prints predicted / measured per plan, host count and size, and tears the cluster down, even on
error. The simulator is not fitted to these runs: its only inputs are the preset and the link's
measured goodput.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

from wirespeed.netem import cluster as C
from wirespeed.netem.units import parse_rate
from wirespeed.plans.algorithms import builtin, dump

NAME = "planfid"
PLANS = ("allreduce_ring_port", "allgather_ring_port", "reducescatter_ring_port", "alltoall_port",
         "sendrecv_ring_port")


def wirespeed(*args, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "wirespeed.cli.main", *map(str, args)],
                          capture_output=True, text=True, env={**os.environ, **(env or {})})


def measured(path: str, hosts: int, args) -> dict[int, float]:
    """bytes -> seconds per call, the loop's time (slowest rank), checked."""
    with tempfile.NamedTemporaryFile(suffix=".jsonl") as f:
        p = wirespeed("bench", "--plan", path, "--cluster", NAME, "-N", hosts, "--ranks-per-host", 1,
                      "--backend", "wirespeed", "--sizes", args.sizes, "-n", args.iters, "-w", 1,
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


def predicted(path: str, topology: str, sizes: list[int]) -> dict[int, float]:
    with tempfile.NamedTemporaryFile(suffix=".jsonl") as f:
        p = wirespeed("plan", "simulate", path, "--topology", topology,
                      "--sizes", ",".join(map(str, sizes)), "--json", f.name)
        if p.returncode != 0:
            raise SystemExit(f"plan simulate {path} failed:\n{p.stderr[-2000:]}")
        recs = [json.loads(line) for line in open(f.name) if line.strip()]
    return {r["size"]: r["time_us"] * 1e-6 for r in recs}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", default="2,4")
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--sizes", default="1M,4M,16M")
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--plans", default=",".join(PLANS))
    ap.add_argument("--latency-us", type=float, default=50.0,
                    help="port-channel latency given to the simulator (the preset's)")
    args = ap.parse_args()
    rate = parse_rate(args.rate)
    hosts = [int(h) for h in args.hosts.split(",")]
    rows = []
    c, _ = C.up(max(hosts), rate, name=NAME, measure=True)
    try:
        goodput = c.measured["parallel_bps"] / 8          # bytes/s, several flows as the engine uses
        topo = f"cpu-emulated,port={goodput / 1e9:.6f}GB/s:{args.latency_us}us"
        with tempfile.TemporaryDirectory(prefix="planfid-") as tmp:
            for h in hosts:
                for name in args.plans.split(","):
                    path = os.path.join(tmp, f"{name}_{h}h.json")
                    with open(path, "w") as f:
                        f.write(dump(builtin(name, h, 1)))
                    meas = measured(path, h, args)
                    pred = predicted(path, topo, sorted(meas))
                    for b in sorted(meas):
                        if b in pred:
                            rows.append((name, h, b, pred[b], meas[b]))
    finally:
        C.down(NAME)
    print(f"# {rate / 1e9:g} Gbit/s links, TCP goodput with several flows {goodput * 8 / 1e9:.3f} Gbit/s; "
          f"topology {topo}; {args.iters} calls per loop; 1 rank per host")
    print("| plan | hosts | size | simulated (ms) | measured (ms) | simulated / measured |")
    print("|---|---|---|---|---|---|")
    for name, h, b, p, m in rows:
        print(f"| {name} | {h} | {b} | {p * 1e3:.2f} | {m * 1e3:.2f} | {p / m:.2f} |")
    far = [r for r in rows if r[2] >= 1 << 20 and abs(r[3] / r[4] - 1) > 0.2]
    print(f"# {len(rows) - len(far)} of {len(rows)} within 20 % at 1 MiB and above")
    return 0


if __name__ == "__main__":
    sys.exit(main())
