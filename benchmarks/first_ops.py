#!/usr/bin/env python3
"""all_reduce op by op after a barrier: how long each of the first ops takes, wirespeed native and Open MPI.

    .venv/bin/python benchmarks/first_ops.py                 # 2 ranks, 16 MiB
    .venv/bin/python benchmarks/first_ops.py --ranks 4 --size 64M

collectives_vs_mpi.py times loops of 5-7 ops at 16 MiB, the contenders taking turns, so a loop
there mostly measures how fast a library gets going again after another one ran. This script
separates that from the steady op. In each of three settings, per library: one warm-up op (as
collectives_vs_mpi.py does), a barrier, then 8 ops each timed alone; 20 repeats; per position the
median over repeats, the maximum over ranks:
- `alternating`: wirespeed and Open MPI take turns, as in collectives_vs_mpi.py;
- `alone`: one library only, repeat after repeat;
- `alone, 64 MiB written before each`: one library, each rank writes 64 MiB of its own memory before
  each repeat (caches and TLB refilled with something else, as compute between steps would).
- `alone, 20 ms asleep / spinning before each`: one library, each rank idle (sleeping) or busy on
  its core without touching memory for about as long as the other library's turn lasts at 16 MiB.
- `--as-benchmark` adds `as collectives_vs_mpi.py, N ops`: every contender of that script
  (wirespeed native and through torch, Open MPI, gloo, torch's fake-backend floor) takes its turn in the
  same rotating order with its own ~20 ms loop (iterations calibrated as there), 3 rounds as there
  repeated 7 times; the first ops of each loop of wirespeed native and Open MPI are shown.
Each library's result is checked before anything is timed (collectives_vs_mpi.Case.check).
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "python"))

from collectives_vs_mpi import FLOOR, SIZES, Case, calibrate, rank_setup  # noqa: E402
from wirespeed.launch.environment import free_port  # noqa: E402

POSITIONS, REPEATS = 8, 20


def as_collectives_vs_mpi(ctx, impls, nbytes, cases):
    """The turns of collectives_vs_mpi.py (its worker's rotation, calibration and warm-up), each
    op of the loops of wirespeed native and Open MPI timed alone."""
    from mpi4py import MPI
    comm, rank = ctx["comm"], ctx["rank"]
    cs = {i: cases.get(i) or Case(i, "all_reduce", nbytes, ctx) for i in impls}
    for i in impls:
        if i != FLOOR and i not in cases:
            cs[i].check()
    iters = {i: calibrate(cs[i], comm, 20e-3) for i in impls}
    shown = ("ws-native", "mpi")
    pos = {i: [[] for _ in range(min(POSITIONS, iters[i]))] for i in shown}
    for _ in range(7):
        for rnd in range(3):
            for impl in impls[rnd % len(impls):] + impls[:rnd % len(impls)]:
                c, n = cs[impl], iters[impl]
                for _ in range(max(1, n // 20)):
                    c.call()
                comm.Barrier()
                for k in range(n):
                    t0 = time.perf_counter()
                    c.call()
                    if impl in shown and k < POSITIONS:
                        pos[impl][k].append(time.perf_counter() - t0)
    for impl in shown:
        med = [comm.allreduce(statistics.median(p), op=MPI.MAX) for p in pos[impl]]
        if rank == 0:
            label = f"as collectives_vs_mpi.py, {iters[impl]} ops"
            print(f"{label:34} {impl:9} " + " ".join(f"{m * 1e3:6.2f}" for m in med), flush=True)


def worker(nbytes, as_benchmark=False):
    from mpi4py import MPI
    import numpy as np
    import torch.distributed as dist
    # The contenders' groups as collectives_vs_mpi.py makes them.
    ctx, impls = rank_setup()
    comm, rank, world = ctx["comm"], ctx["rank"], ctx["world"]
    cases = {i: Case(i, "all_reduce", nbytes, ctx) for i in ("ws-native", "mpi")}
    for c in cases.values():
        c.check()
    other = np.ones(64 << 18, dtype=np.float32)  # 64 MiB of this rank's own memory

    def run(label, order, between):
        pos = {i: [[] for _ in range(POSITIONS)] for i in order}
        for _ in range(REPEATS):
            for impl in order:
                between()
                c = cases[impl]
                c.call()
                comm.Barrier()
                for k in range(POSITIONS):
                    t0 = time.perf_counter()
                    c.call()
                    pos[impl][k].append(time.perf_counter() - t0)
        for impl in order:
            med = [comm.allreduce(statistics.median(p), op=MPI.MAX) for p in pos[impl]]
            if rank == 0:
                print(f"{label:34} {impl:9} " + " ".join(f"{m * 1e3:6.2f}" for m in med), flush=True)

    if rank == 0:
        print(f"# all_reduce float32 {nbytes >> 20} MiB, {world} ranks; ops 1..{POSITIONS} after one warm-up op and "
              f"a barrier, ms: median of {REPEATS} repeats, max over ranks", flush=True)
    run("alternating", ("ws-native", "mpi"), lambda: None)
    for impl in ("ws-native", "mpi"):
        run("alone", (impl,), lambda: None)
    for impl in ("ws-native", "mpi"):
        run("alone, 64 MiB written before each", (impl,), lambda: other.__iadd__(1.0))

    def spin(s=0.02):
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < s:
            pass

    for impl in ("ws-native", "mpi"):
        run("alone, 20 ms asleep before each", (impl,), lambda: time.sleep(0.02))
    for impl in ("ws-native", "mpi"):
        run("alone, 20 ms spinning before each", (impl,), spin)
    if as_benchmark:
        as_collectives_vs_mpi(ctx, impls, nbytes, cases)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--size", default="16M", help=f"from {','.join(SIZES)}")
    ap.add_argument("--as-benchmark", action="store_true",
                    help="also time the ops in collectives_vs_mpi.py's turns (all its contenders, ~20 ms loops)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.size not in SIZES or a.ranks < 2:
        ap.error(f"--size from {','.join(SIZES)}; --ranks >= 2")
    if a.worker:
        return worker(SIZES[a.size], a.as_benchmark)
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        raise SystemExit("mpirun not found: install Open MPI (apt-get install openmpi-bin libopenmpi-dev)")
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), OMP_NUM_THREADS="1")
    cmd = [mpirun, "-np", str(a.ranks), "--oversubscribe", "--bind-to", "none"]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    for v in ("MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS"):
        cmd += ["-x", v]
    cmd += [sys.executable, os.path.abspath(__file__), "--worker", "--size", a.size] + ["--as-benchmark"] * a.as_benchmark
    print("# load average " + " ".join(f"{x:.2f}" for x in os.getloadavg()) + " at the start", flush=True)
    rc = subprocess.run(cmd, env=env, timeout=900).returncode
    print("# load average " + " ".join(f"{x:.2f}" for x in os.getloadavg()) + " at the end", flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
