"""`wirespeed train` on the emulated cluster: gloo against wirespeed, the same run, the figures of
issue 28's done-when.

    sudo .venv/bin/python benchmarks/train_cluster.py                       # resnet50 64 px, DDP
    sudo .venv/bin/python benchmarks/train_cluster.py --parallel fsdp
    sudo .venv/bin/python benchmarks/train_cluster.py --flow-rate none      # the uncapped link
    sudo .venv/bin/python benchmarks/train_cluster.py --what-if             # 2 hosts fit, 4 measured
    sudo .venv/bin/python benchmarks/train_cluster.py --what-if --batch-size 1 \
        --train-args "--model gpt --layers 4 --hidden 512 --seq-len 16"      # a network-bound step

Builds a cluster (2 hosts at 2 Gbit/s with 250 Mbit/s per TCP flow by default, as cloud networks
cap flows), runs `wirespeed train --cluster ... --backend gloo,wirespeed --repeat R` (one rank per
host; the backends interleaved A B A B), and prints its comparison: samples/s, step, compute,
exposed share, wire time and the step over its lower limit, and wirespeed's speed-up over gloo.
With --what-if it fits on 2 hosts of a 4-host cluster at 1 Gbit/s and measures 4, for each backend,
and prints predicted beside measured. The cluster is torn down at the end, even on error.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile

from wirespeed.netem import cluster as C
from wirespeed.netem.units import parse_rate

NAME = "trainb"


def train(args, world: int, backends: str, extra: list[str]) -> list[dict]:
    with tempfile.NamedTemporaryFile(suffix=".jsonl") as f:
        cmd = [sys.executable, "-m", "wirespeed.cli.main", "train", "--model", args.model,
               "--image-size", str(args.image_size), "--batch-size", str(args.batch_size),
               "--parallel", args.parallel, "--cluster", NAME, "-N", str(world), "--backend", backends,
               "-w", "2", "-n", str(args.steps), "-T", "300", "--no-save", "--json", f.name,
               *args.train_args.split(), *extra]
        print("$ wirespeed " + " ".join(cmd[3:]), flush=True)
        p = subprocess.run(cmd, text=True)
        if p.returncode != 0:
            raise SystemExit(f"train failed (exit {p.returncode})")
        return [json.loads(line) for line in open(f.name)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--image-size", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--parallel", default="ddp")
    ap.add_argument("--rate", default="2gbit")
    ap.add_argument("--flow-rate", default="250mbit", help="per-flow cap, or none")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--what-if", action="store_true")
    ap.add_argument("--train-args", default="", help="more `wirespeed train` flags, e.g. "
                    "'--model gpt --layers 4 --hidden 512 --seq-len 16'")
    args = ap.parse_args()
    if args.what_if:
        return what_if(args)
    flow = None if args.flow_rate == "none" else parse_rate(args.flow_rate)
    C.up(2, parse_rate(args.rate), name=NAME, flow_rate_bps=flow, measure=False)
    try:
        recs = train(args, 2, "gloo,wirespeed", ["--repeat", str(args.repeat)])
    finally:
        C.down(NAME)
    by = {r["backend"]: r for r in recs if not r.get("predicted")}
    g, w = by["gloo"], by["wirespeed"]
    print(f"\n# {args.model} {args.image_size} px, batch {args.batch_size}, {args.parallel}, 2 hosts "
          f"at {args.rate}, flows capped at {args.flow_rate}")
    for r in (g, w):
        print(f"{r['backend']:<10} {r['samples_per_s']:8.2f} samples/s  step {r['step_us'] / 1e3:7.1f} ms"
              f"  compute {r['compute_us'] / 1e3:7.1f} ms  exposed {r['exposed_pct']:3.0f}%  "
              f"wire {r['wire_us'] / 1e3:7.1f} ms  step/limit {r['step_vs_limit']:.2f}x")
    print(f"wirespeed / gloo samples/s: {w['samples_per_s'] / g['samples_per_s']:.2f}x")
    return 0


def what_if(args) -> int:
    C.up(4, parse_rate("1gbit"), name=NAME, measure=False)
    try:
        rows = []
        for backend in ("gloo", "wirespeed"):
            two = train(args, 2, backend, ["--what-if-hosts", "4", "--no-scaling"])
            pred = next(r for r in two if r.get("predicted"))
            four = train(args, 4, backend, ["--no-scaling"])[0]
            rows.append((backend, pred["step_us"], four["step_us"]))
    finally:
        C.down(NAME)
    net = args.train_args or f"{args.model} {args.image_size} px"
    print(f"\n# {net}, batch {args.batch_size}, {args.parallel}: fitted on 2 hosts at 1 Gbit/s, "
          "the step on 4")
    for backend, p, m in rows:
        print(f"{backend:<10} predicted {p / 1e3:8.1f} ms  measured {m / 1e3:8.1f} ms  "
              f"error {(p - m) / m:+.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
