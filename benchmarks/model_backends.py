#!/usr/bin/env python3
"""A real network's gradient sync on wirespeed's backend vs gloo vs Open MPI, measured in one run.

    .venv/bin/python benchmarks/model_backends.py [--model resnet50] [-N 2] [--strategy allreduce,...]
                                                  [--bucket-mb 25] [-n 5]

Runs `wirespeed model` once per backend with the same shapes, buckets and strategies (each run checks
every result against the exact reference and fails on a wrong one), then prints the time per step of
each backend and the ratio gloo time / backend time (> 1: faster than gloo) per strategy.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

BACKENDS = ("gloo", "wirespeed", "mpi")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("-N", "--nproc", default="2")
    ap.add_argument("--strategy", default="allreduce,reduce-broadcast,sharded-ps")
    ap.add_argument("--bucket-mb", default="25")
    ap.add_argument("-n", "--iters", default="5")
    ap.add_argument("-w", "--warmup-iters", default="2")
    a = ap.parse_args()
    from wirespeed.backends import availability
    results: dict[str, dict[str, dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for b in BACKENDS:
            why = availability(b)
            if why:
                print(f"# {b}: skipped ({why})")
                continue
            out = os.path.join(tmp, f"{b}.jsonl")
            cmd = [sys.executable, "-m", "wirespeed.cli.main", "model", "--model", a.model, "-N", a.nproc,
                   "--backend", b, "--strategy", a.strategy, "--bucket-mb", a.bucket_mb, "-n", a.iters,
                   "-w", a.warmup_iters, "--json", out]
            print(f"# running: {' '.join(cmd[2:])}", flush=True)
            p = subprocess.run(cmd, capture_output=True, text=True)
            if p.returncode != 0:
                print(f"# {b}: failed (exit {p.returncode}): {p.stderr.strip().splitlines()[-1:]}")
                continue
            results[b] = {r["strategy"]: r for r in map(json.loads, open(out))}
    if "gloo" not in results:
        print("gloo did not run: no baseline")
        return 1
    ref = results["gloo"]
    any_rec = next(iter(ref.values()))
    print(f"\n{a.model}: {any_rec['arrays']} arrays, {any_rec['total_bytes'] / (1 << 20):.1f} MiB, "
          f"{any_rec['world_size']} ranks, {any_rec['buckets']} buckets; time per step in ms "
          "(median over steps of the slowest rank); ratio = gloo time / backend time")
    names = list(results)
    print(f"{'strategy':<18}" + "".join(f"{b + ' ms':>14}" for b in names)
          + "".join(f"{'gloo/' + b:>16}" for b in names if b != "gloo") + f"{'errors':>10}")
    for s in ref:
        row = f"{s:<18}"
        row += "".join(f"{results[b][s]['time_us'] / 1e3:>14.2f}" if s in results[b] else f"{'-':>14}"
                       for b in names)
        row += "".join(f"{ref[s]['time_us'] / results[b][s]['time_us']:>15.2f}x" if s in results[b]
                       else f"{'-':>16}" for b in names if b != "gloo")
        errs = {results[b][s]["error"] for b in names if s in results[b]}
        row += f"{'0' if errs == {0} else ','.join(map(str, errs)):>10}"
        print(row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
