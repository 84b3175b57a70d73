"""all_gather and reduce_scatter across 3+ hosts: wirespeed's ring, its direct exchange, gloo.

    sudo .venv/bin/python benchmarks/gather_across_hosts.py                       # 3, 4, 8 hosts
    sudo .venv/bin/python benchmarks/gather_across_hosts.py --hosts 4 --ranks-per-host 2 --repeats 3

Builds one emulated cluster of the most hosts asked for (1 Gbit/s links by default) and, for each
host count, runs `wirespeed bench --cluster -c all_gather,reduce_scatter` with, in turn:
- `wirespeed direct`: WIRESPEED_GATHER_RING_MIN set beyond every size, so the planner keeps the
  direct exchange (every rank sends to all others at once), which was the only algorithm before
  the ring; its code is unchanged, so this is the old behaviour;
- `wirespeed`: the default, the ring host by host from 64 KiB per rank's chunk on 3+ hosts;
- `gloo`, for reference.
The three alternate within each repeat, so they meet the same load. Prints, per collective, host
count and size, the range of busbw / link over repeats and in-place/out-of-place calls (each a
loop of --iters calls), then tears the cluster down, even on error.
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

NAME = "gatherx"
VARIANTS = (("wirespeed direct", "wirespeed", {"WIRESPEED_GATHER_RING_MIN": str(1 << 60)}),
            ("wirespeed", "wirespeed", {}),
            ("gloo", "gloo", {}))


def run(backend: str, env: dict, ranks: int, per_host: int, args) -> list[dict]:
    with tempfile.NamedTemporaryFile(suffix=".jsonl") as f:
        cmd = [sys.executable, "-m", "wirespeed.cli.main", "bench", "--cluster", NAME, "-N", str(ranks),
               "--ranks-per-host", str(per_host), "--backend", backend, "-c", "all_gather,reduce_scatter",
               "--sizes", args.sizes, "-n", str(args.iters), "-w", "1", "--no-per-op", "--no-save",
               "--no-progress", "-T", "120", "--json", f.name]
        p = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **env})
        if p.returncode != 0:
            raise SystemExit(f"{backend} -N {ranks} failed:\n{p.stderr[-2000:]}")
        recs = [json.loads(line) for line in open(f.name) if line.strip()]
    bad = [r for r in recs if r.get("wrong")]
    if bad:
        raise SystemExit(f"{backend} -N {ranks}: wrong results: {bad[:2]}")
    return recs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", default="3,4,8")
    ap.add_argument("--ranks-per-host", type=int, default=1)
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--sizes", default="1M,4M,16M,64M")
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    rate = parse_rate(args.rate)
    hosts = [int(h) for h in args.hosts.split(",")]
    k = args.ranks_per_host
    C.up(max(hosts), rate, name=NAME, measure=False)
    # (hosts, variant, collective, bytes) -> busbw / link of every call loop
    got: dict[tuple, list[float]] = {}
    try:
        for h in hosts:
            for _ in range(args.repeats):
                for label, backend, env in VARIANTS:
                    for r in run(backend, env, h * k, k, args):
                        key = (h, label, r["collective"], r["bytes"])
                        got.setdefault(key, []).append(r["busbw_gbps"] * 8e9 / rate)
    finally:
        C.down(NAME)
    print(f"# busbw / link, {rate / 1e9:g} Gbit/s links, {k} rank(s) per host, {args.iters} calls per loop, "
          f"{args.repeats} repeats x in place and not: min-max")
    labels = [v[0] for v in VARIANTS]
    print("| collective | hosts | size | " + " | ".join(labels) + " |")
    print("|---|---|---|" + "---|" * len(labels))
    for coll in ("all_gather", "reduce_scatter"):
        for h in hosts:
            for size in sorted({key[3] for key in got if key[0] == h and key[2] == coll}):
                cells = []
                for label in labels:
                    v = got.get((h, label, coll, size), [])
                    cells.append(f"{min(v):.2f}-{max(v):.2f}" if v else "-")
                print(f"| {coll} | {h} | {size / 2**20:g} MiB | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
