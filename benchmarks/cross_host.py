"""all_reduce across two emulated hosts on a capped link: wirespeed vs gloo (and Open MPI), in one run.

    sudo .venv/bin/python benchmarks/cross_host.py                    # 1 Gbit/s, 64 MiB, 2 and 4 ranks
    sudo .venv/bin/python benchmarks/cross_host.py --rate 1gbit --size 16M,64M --iters 5 --rounds 2
    sudo .venv/bin/python benchmarks/cross_host.py --rate 2gbit --flow-rate 250mbit --backends wirespeed,gloo,mpi
    sudo .venv/bin/python benchmarks/cross_host.py --backends wirespeed,wirespeed:12 --rounds 5   # probe vs 12 fixed

Builds a 2-host cluster (wirespeed.netem: network namespaces, htb-capped veth links), measures the
practical TCP ceiling of the link (4 parallel flows h0 -> h1, as long as one timed all_reduce),
(16 flows when every flow is capped with --flow-rate), then runs `wirespeed bench --cluster` with 2 ranks (one per host) and 4 ranks placed round robin
(0,2 on h0 | 1,3 on h1) for each backend, alternating backends so machine load hits both alike,
and prints busbw per run and busbw / ceiling. The cluster is torn down at the end, even on error.

`wirespeed:N` as a backend runs wirespeed with WIRESPEED_NSTREAMS=N (a fixed stream count, as
before the probe); plain `wirespeed` lets its setup probe choose (crates/wirespeed-core/src/hosts/
probe.rs). Each wirespeed run prints the streams per peer it used, from WIRESPEED_SETUP_STATS's
line (the same on every rank), and the summary gives each configuration's lowest and highest
busbw / ceiling beside the median.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

from wirespeed.netem import cluster as C
from wirespeed.netem.measure import tcp_throughput
from wirespeed.netem.units import parse_rate

NAME = "xhost"
# WIRESPEED_SETUP_STATS's line (python/wirespeed/native/rendezvous.py); the launcher relays the
# ranks' stderr as it comes, so lines may run together.
STREAMS = re.compile(r"wirespeed: rank (\d+) of \d+ set up in [^;]*; TCP streams per peer: (\d+) used of (\d+) opened")


def bench(spec: str, nproc: int, size: str, iters: int, warmup: int, timeout: int) -> dict:
    """One `wirespeed bench` run of backend `spec` (`wirespeed:N`: WIRESPEED_NSTREAMS=N); its
    largest record, with "streams" ("used/opened", every rank's alike) for wirespeed."""
    backend, _, nstreams = spec.partition(":")
    env = dict(os.environ)
    env.pop("WIRESPEED_NSTREAMS", None)
    if nstreams:
        env["WIRESPEED_NSTREAMS"] = nstreams
    if backend == "wirespeed":
        env["WIRESPEED_SETUP_STATS"] = "1"
    with tempfile.NamedTemporaryFile(suffix=".jsonl", delete=False) as f:
        out = f.name
    try:
        cmd = [sys.executable, "-m", "wirespeed.cli.main", "bench", "--cluster", NAME, "-N", str(nproc),
               "--backend", backend, "-c", "all_reduce", "--sizes", size, "-n", str(iters), "-w", str(warmup),
               "-d", "float32", "--no-save", "--no-progress", "--json", out, "--timeout", str(timeout)]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout + 120, env=env)
        if p.returncode != 0:
            raise SystemExit(f"{backend} with {nproc} ranks failed: {p.stderr.strip()[-800:]}")
        recs = [json.loads(line) for line in open(out) if line.strip()]
    finally:
        os.unlink(out)
    rec = max(recs, key=lambda r: r["bytes"])
    if rec["wrong"]:
        raise SystemExit(f"{spec} with {nproc} ranks: {rec['wrong']} wrong elements")
    if backend == "wirespeed":
        seen = {m.group(1): f"{m.group(2)}/{m.group(3)}" for m in STREAMS.finditer(p.stderr)}
        if len(seen) != nproc or len(set(seen.values())) != 1:
            raise SystemExit(f"{spec} with {nproc} ranks: expected one stream count from each rank, got {seen}")
        rec["streams"] = next(iter(seen.values()))
    return rec


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", default="1gbit", help="link cap per host, each way")
    ap.add_argument("--size", default="64M", help="all_reduce size(s) per rank, comma-separated")
    ap.add_argument("--flow-rate", default=None, help="cap every TCP flow too (as clouds do), e.g. 250mbit")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=2, help="alternating rounds per backend and placement")
    ap.add_argument("--backends", default="wirespeed,gloo",
                    help="comma-separated: wirespeed, wirespeed:N (WIRESPEED_NSTREAMS=N), gloo, mpi")
    ap.add_argument("--timeout", type=int, default=300)
    ap.add_argument("--placements", default="2,4", help="rank counts to run: 2 (0 | 1), 4 (0,2 | 1,3)")
    args = ap.parse_args(argv)
    nprocs = [int(n) for n in args.placements.split(",")]
    if not set(nprocs) <= {2, 4}:
        ap.error("--placements takes 2, 4 or 2,4")
    rate = parse_rate(args.rate)
    flow_rate = parse_rate(args.flow_rate) if args.flow_rate else None
    backends = args.backends.split(",")
    sizes = args.size.split(",")
    for b in backends:
        name, _, n = b.partition(":")
        if name not in ("wirespeed", "gloo", "mpi") or (n and (name != "wirespeed" or not n.isdigit())):
            ap.error(f"--backends: {b!r} is not wirespeed, wirespeed:N, gloo or mpi")
    peers = [b for b in backends if b != "wirespeed"]
    c, _ = C.up(2, rate, flow_rate_bps=flow_rate, name=NAME, measure=False)
    try:
        h0, h1 = c.hosts
        # As long as an all_reduce of this size takes at the cap: steady state, not slow start.
        flows = 16 if flow_rate else 4
        ceiling_bps = tcp_throughput(h0.netns, h1.netns, h1.addr, flows, 4.0)
        ceiling = ceiling_bps / 8e9
        capped = f", every flow capped at {flow_rate / 1e9:g} Gbit/s" if flow_rate else ""
        print(f"# link {rate / 1e9:g} Gbit/s per host each way (htb){capped}; TCP ceiling, {flows} flows "
              f"over 4 s: {ceiling:.4f} GB/s ({ceiling_bps / rate:.1%} of the cap)")
        print(f"# all_reduce float32 {args.size} per rank, {args.iters} iters after {args.warmup} warm-up, "
              f"{args.rounds} rounds alternating backends; busbw = S/t x 2(n-1)/n, t = slowest rank's median")
        results: dict[tuple[str, str, int], list[float]] = {}
        streams: dict[tuple[str, str, int], list[str]] = {}
        for rnd in range(args.rounds):
            for size in sizes:
                for nproc in nprocs:
                    for b in (backends if rnd % 2 == 0 else backends[::-1]):
                        rec = bench(b, nproc, size, args.iters, args.warmup, args.timeout)
                        results.setdefault((size, b, nproc), []).append(rec["busbw_gbps"])
                        used = f", streams {rec['streams']}" if "streams" in rec else ""
                        if "streams" in rec:
                            streams.setdefault((size, b, nproc), []).append(rec["streams"])
                        print(f"  round {rnd} {size:>4} {b:<12} {nproc} ranks: busbw {rec['busbw_gbps']:.4f} GB/s "
                              f"({rec['busbw_gbps'] / ceiling:.1%} of ceiling), {rec['time_us'] / 1e3:.1f} ms/op{used}",
                              flush=True)
        print()
        ratios = [p for p in peers if "wirespeed" in backends]
        print(f"{'size':>5} {'placement':<20} " + " ".join(f"{b + ' GB/s':>15} {'/ceiling':>9}" for b in backends)
              + "".join(f" {'ws/' + p:>9}" for p in ratios))
        for size in sizes:
            for nproc, label in ((2, "2 ranks: 0 | 1"), (4, "4 ranks: 0,2 | 1,3")):
                if nproc not in nprocs:
                    continue
                med = {b: statistics.median(results[(size, b, nproc)]) for b in backends}
                row = f"{size:>5} {label:<20} " + " ".join(f"{med[b]:>15.4f} {med[b] / ceiling:>9.1%}" for b in backends)
                row += "".join(f" {med['wirespeed'] / med[p]:>9.2f}" for p in ratios)
                print(row)
        print()
        print("busbw / ceiling over the rounds (lowest, median, highest), and the streams used / opened per run:")
        for size in sizes:
            for nproc in nprocs:
                for b in backends:
                    r = sorted(x / ceiling for x in results[(size, b, nproc)])
                    used = " ".join(streams.get((size, b, nproc), []))
                    print(f"  {size:>4} {nproc} ranks {b:<12} {r[0]:.3f} {statistics.median(r):.3f} {r[-1]:.3f}"
                          f"  ({len(r)} runs){'  streams ' + used if used else ''}")
    finally:
        C.down(NAME)
    return 0


if __name__ == "__main__":
    sys.exit(main())
