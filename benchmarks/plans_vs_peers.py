#!/usr/bin/env python3
"""An MSCCL++ execution plan run by `wirespeed bench --plan`, beside wirespeed's own collective,
gloo and Open MPI (when mpi4py and mpirun are here), measured one after the other in one run.

    .venv/bin/python benchmarks/plans_vs_peers.py PLAN.json [PLAN.json ...] [--sizes 4K,64K,1M]
    .venv/bin/python benchmarks/plans_vs_peers.py            # the tests' one-shot all_reduce plans

Every figure comes from `wirespeed bench` itself (its records: the loop's time, slowest rank, and
the harness's check on every checked call), with the same ranks, sizes and iterations for each
library; a plan's sizes are those the plan splits (the bench rounds them, and the others run the
rounded sizes too, so the rows compare like with like). Ratios are the peer's time over the
plan's: above 1, the plan is faster. Add --cluster NAME to run everything on the emulated cluster.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))


def bench(args: list[str], out: str, extra: list[str]) -> list[dict]:
    cmd = [sys.executable, "-m", "wirespeed.cli.main", "bench", *args, *extra, "--json", out,
           "--no-save", "--no-progress", "--no-per-op"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        print(f"# {' '.join(args[:4])}: failed ({p.returncode}): {p.stderr.strip().splitlines()[-1:]}")
        return []
    with open(out) as f:
        return [json.loads(line) for line in f if line.strip()]


def default_plans(tmp: str) -> list[str]:
    """wirespeed's own one-host all-reduce plans (plans/algorithms.py)."""
    from wirespeed.plans.algorithms import builtin, dump
    out = []
    for name, n in (("allreduce_oneshot", 2), ("allreduce_oneshot_ll", 2), ("allreduce_oneshot", 4)):
        path = os.path.join(tmp, f"{name}_{n}r.json")
        with open(path, "w") as f:
            f.write(dump(builtin(name, n)))
        out.append(path)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("plans", nargs="*")
    ap.add_argument("--sizes", default="4K,64K,1M")
    ap.add_argument("-n", "--iters", default="20")
    ap.add_argument("-w", "--warmup-iters", default="3")
    ap.add_argument("--cluster", default=None)
    a = ap.parse_args()
    from wirespeed.backends.mpi import missing as mpi_missing
    from wirespeed.bench.collectives.plan import BENCH_NAMES
    from wirespeed.plans.format import load
    tmp = tempfile.mkdtemp(prefix="plans-vs-peers-")
    plans = a.plans or default_plans(tmp)
    extra = ["-n", a.iters, "-w", a.warmup_iters, *(["--cluster", a.cluster] if a.cluster else [])]
    peers = ["wirespeed", "gloo"] + ([] if mpi_missing() else ["mpi"])
    for i, path in enumerate(plans):
        plan = load(path)
        coll = BENCH_NAMES.get(plan.collective)
        mine = bench(["--plan", path, "--sizes", a.sizes], os.path.join(tmp, f"plan{i}.jsonl"), extra)
        if not mine:
            continue
        sizes = ",".join(str(r["bytes"]) for r in mine)
        # The libraries' variant the plan runs where they have it (torch: all_reduce in place only).
        theirs = {}
        for backend in peers:
            recs = bench(["-c", coll, "--backend", backend, "-N", str(plan.nranks), "--sizes", sizes],
                         os.path.join(tmp, f"{backend}{i}.jsonl"), extra)
            theirs[backend] = {}
            for r in recs:
                best = theirs[backend].get(r["bytes"])
                if r["inplace"] == plan.inplace or best is None:
                    theirs[backend][r["bytes"]] = r
        print(f"\n# plan {plan.name} ({path}): {plan.collective} {plan.protocol}, {plan.nranks} ranks"
              f"{', cluster ' + a.cluster if a.cluster else ''}; time = loop, slowest rank (us); "
              "ratio = peer's time / plan's")
        head = f"{'bytes':>10} {'plan':>10}" + "".join(f" {b:>10} {'ratio':>6}" for b in peers)
        print(head)
        for r in mine:
            row = f"{r['bytes']:>10} {r['time_us']:>10.1f}"
            for b in peers:
                o = theirs[b].get(r["bytes"])
                row += f" {o['time_us']:>10.1f} {o['time_us'] / r['time_us']:>6.2f}" if o else f" {'-':>10} {'-':>6}"
            print(row + ("" if r["wrong"] == 0 else f"  WRONG: {r['wrong']} elements"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
