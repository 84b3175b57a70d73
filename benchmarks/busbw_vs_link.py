"""busbw, and what really crossed, against the capped link: every collective, 4 KiB to 256 MiB.

    sudo .venv/bin/python benchmarks/busbw_vs_link.py                         # 1 Gbit/s, wirespeed
    sudo .venv/bin/python benchmarks/busbw_vs_link.py --backends wirespeed,gloo --ranks 2,4
    sudo .venv/bin/python benchmarks/busbw_vs_link.py --rate 200mbit -e 16M

Builds a 2-host emulated cluster (wirespeed.netem), runs `wirespeed bench --cluster -c all` for
each backend and rank count (ranks placed round robin, so 4 ranks are 2 per host), and prints for
every collective the largest busbw / link and the largest sent / link over the sizes, where sent
is `link_sent_gbps`: what the busiest host's interface counter says it sent per second of the
loop. With one rank per host neither may pass 1.0; with several per host busbw may (hierarchical
algorithms send fewer bytes across hosts than busbw's formula assumes) and sent may not. The
suite's test (tests/netem/test_busbw_within_link.py) runs a short sweep; this is the long one.
The cluster is torn down at the end, even on error.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile

from wirespeed.netem import cluster as C
from wirespeed.netem.units import parse_rate

NAME = "bwlink"


def sweep(backend: str, ranks: int, args) -> list[dict]:
    with tempfile.NamedTemporaryFile(suffix=".jsonl") as f:
        cmd = [sys.executable, "-m", "wirespeed.cli.main", "bench", "--cluster", NAME, "-N", str(ranks),
               "--backend", backend, "-c", "all", "-b", args.b, "-e", args.e, "-f", "4",
               "-n", str(args.iters), "-w", "1", "--no-per-op", "--no-save", "--no-progress",
               "-T", "120", "--json", f.name]
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            raise SystemExit(f"{backend} -N {ranks} failed:\n{p.stderr[-2000:]}")
        return [r for r in map(json.loads, open(f.name)) if r.get("busbw_gbps", 0) > 0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--backends", default="wirespeed")
    ap.add_argument("--ranks", default="2")
    ap.add_argument("-b", default="4K")
    ap.add_argument("-e", default="256M")
    ap.add_argument("--iters", type=int, default=3)
    args = ap.parse_args()
    rate = parse_rate(args.rate)
    C.up(2, rate, name=NAME, measure=False)
    worst_ok = True
    try:
        print(f"# 2 hosts, link {rate / 1e9:g} Gbit/s; per collective, the largest ratio over sizes "
              f"{args.b}..{args.e} (size at which it occurred)")
        for backend in args.backends.split(","):
            for ranks in map(int, args.ranks.split(",")):
                recs = sweep(backend, ranks, args)
                per_host = ranks // 2
                print(f"\n{backend}, {ranks} ranks ({per_host} per host)")
                print(f"{'collective':>15} {'busbw/link':>11} {'at':>10} {'sent/link':>10} {'at':>10}")
                for coll in sorted({r["collective"] for r in recs}):
                    rows = [r for r in recs if r["collective"] == coll]
                    b = max(rows, key=lambda r: r["busbw_gbps"])
                    s = max(rows, key=lambda r: r["link_sent_gbps"])
                    bl, sl = b["busbw_gbps"] * 8e9 / rate, s["link_sent_gbps"] * 8e9 / rate
                    print(f"{coll:>15} {bl:>11.3f} {b['bytes']:>10} {sl:>10.3f} {s['bytes']:>10}")
                    worst_ok &= sl <= 1.0 and (per_host > 1 or bl <= 1.0)
    finally:
        C.down(NAME)
    print("\n" + ("every figure within the link" if worst_ok else "SOME FIGURE ABOVE THE LINK"))
    return 0 if worst_ok else 1


if __name__ == "__main__":
    sys.exit(main())
