#!/usr/bin/env python3
"""bench's own cost: `wirespeed bench`'s time against a bare loop over the same library call, in the
same processes, on the same buffers.

    .venv/bin/python benchmarks/bench_overhead.py                      # wirespeed, gloo, mpi; 4K, 64K, 1M
    .venv/bin/python benchmarks/bench_overhead.py --backends wirespeed,gloo --sizes 4K --tries 3 --json r.json

Two ranks per backend (local processes; mpirun for mpi). In each try, per size, every rank runs, one
after the other (the order alternates between tries):
- `bench`: the harness's `measure` on the case, exactly as `wirespeed bench` runs a size (warm-up,
  refill, timed loops, check, single calls), all_reduce float32 sum in place; its `time_us`;
- `bare`: the library's own call with nothing around it (`torch.distributed.all_reduce(t)`;
  mpi4py's `comm.Allreduce(MPI.IN_PLACE, array, MPI.SUM)` for mpi) on the same tensor, timed as an
  independent loop-average script would: a barrier, then the clock, `-n` calls back to back,
  elapsed / `-n`; the slowest rank's per batch, the median of `--batches` batches. Its result is
  checked as the harness checks an in-place sum: inputs refilled, one more call, every element.
The ratio bench / bare is what bench adds to the library; a try's ratio uses the two figures of that
try, and the table shows the median and the best ratio over tries beside each side's median time,
and `p20`: the ratio of the 20th percentiles of every loop either side ran (bench's loops from its
records' `time_loops_us`), the figure that holds where a few loops of a backend carry a scheduler
stall of a whole tick (gloo on a 2-core machine) and a median of five loops is mostly noise.
tests/multiproc/test_bench_overhead.py runs this at 4 KiB and asserts the best ratio.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ---------------------------------------------------------------- rank side
def bare_loops(backend, call, iters: int, batches: int, watchdog) -> list[float]:
    """The independent script's batches, in us a call: per batch a barrier, the clock, `iters`
    calls, the slowest rank's elapsed / iters. Its figure is their median."""
    clock = time.perf_counter
    per = []
    for b in range(batches):
        watchdog.step(f"bare loop {b + 1} of {batches}")
        backend.barrier()
        t0 = clock()
        for _ in range(iters):
            call()
        per.append(clock() - t0)
    rows = backend.allgather_floats(per)
    return [max(r[b] for r in rows) / iters * 1e6 for b in range(batches)]


def bare_call(name: str, t):
    """The library's own call on tensor t, nothing around it."""
    if name == "mpi":
        from mpi4py import MPI
        arr = t.numpy()   # the same memory, as a user of mpi4py hands it over
        return lambda: MPI.COMM_WORLD.Allreduce(MPI.IN_PLACE, arr, MPI.SUM)
    import torch.distributed as dist
    return lambda: dist.all_reduce(t)


def rank_main(a) -> int:
    from wirespeed.backends.registry import create
    from wirespeed.bench.collectives import COLLECTIVES
    from wirespeed.bench.config import BenchConfig
    from wirespeed.bench.dtypes import DTYPES
    from wirespeed.bench.harness import Series, make_case, measure
    from wirespeed.bench.watchdog import Watchdog
    from wirespeed.launch.environment import rank_info

    info = rank_info(need_master=a.backend != "mpi")
    backend = create(a.backend)
    backend.init(info, "cpu", a.timeout)
    coll = COLLECTIVES["all_reduce"]
    series = Series(coll, DTYPES["float32"], "sum", -1)
    cfg = BenchConfig(backend=a.backend, iters=a.iters, warmup_iters=a.warmup, timeout_s=a.timeout)
    watchdog = Watchdog(a.timeout, info.rank)
    out = []
    try:
        for nbytes in a.sizes:
            case = make_case(series, nbytes, True, info, "cpu")
            bufs = coll.alloc(case)
            coll.fill_inputs(case, bufs)
            call = bare_call(a.backend, bufs.recv)
            for _ in range(a.warmup):
                call()
            tries = []
            for i in range(a.tries):
                got = {}
                for what in (("bench", "bare") if i % 2 == 0 else ("bare", "bench")):
                    if what == "bench":
                        m = measure(backend, case, coll, cfg, watchdog, bufs=bufs)
                        if m["wrong"]:
                            raise SystemExit(f"bench's all_reduce of {nbytes} B was wrong: {m['wrong']} elements")
                        got["bench_us"] = m["time_us"]
                        got["bench_loops_us"] = m.get("time_loops_us", [m["time_us"]])  # one loop before
                    else:
                        got["bare_loops_us"] = bare_loops(backend, call, a.iters, a.batches, watchdog)
                        got["bare_us"] = statistics.median(got["bare_loops_us"])
                        coll.fill_inputs(case, bufs)   # the bare sums' check: one more call on fresh inputs
                        backend.barrier()
                        call()
                        wrong = sum(r[0] for r in backend.allgather_floats([float(coll.wrong(case, bufs))]))
                        if wrong:
                            raise SystemExit(f"the bare all_reduce of {nbytes} B was wrong: {wrong:g} elements")
                tries.append(got)
            out.append({"bytes": nbytes, "tries": tries})
        watchdog.step("finishing")
        backend.barrier()
    finally:
        watchdog.close()
    if info.rank == 0:
        with open(a.out, "w") as f:
            json.dump(out, f)
    backend.shutdown()
    return 0


# ---------------------------------------------------------------- driver side
def run_backend(name: str, a) -> list[dict]:
    """Rank 0's results for one backend (RuntimeError when its ranks failed)."""
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "r.json")
        argv = ["--rank", "--backend", name, "--sizes", ",".join(map(str, a.sizes)), "--tries", str(a.tries),
                "--iters", str(a.iters), "--warmup", str(a.warmup), "--batches", str(a.batches),
                "--timeout", str(a.timeout), "--out", out]
        env = dict(os.environ, OMP_NUM_THREADS="1",
                   PYTHONPATH=os.pathsep.join(p for p in (os.path.join(ROOT, "python"),
                                                          os.environ.get("PYTHONPATH")) if p))
        me = [sys.executable, os.path.abspath(__file__)]
        if name == "mpi":
            from wirespeed.launch.mpirun import ROOT_ENV, mpirun_command
            if os.geteuid() == 0:
                env.update(ROOT_ENV)
            env.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")  # as bench's launcher on a full machine
            procs = [subprocess.Popen(mpirun_command(argv, 2, program=me), env=env)]
        else:
            from wirespeed.launch.environment import free_port
            from wirespeed.launch.local import rank_env
            port = free_port()
            procs = [subprocess.Popen(me + argv, env=rank_env(r, 2, port, env)) for r in range(2)]
        try:
            codes = [p.wait(timeout=a.timeout * 4) for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        if any(codes) or not os.path.exists(out):
            raise RuntimeError(f"{name}: ranks exited {codes}")
        with open(out) as f:
            return json.load(f)


def low(values: list[float], q: float = 0.2) -> float:
    """The q-quantile (nearest rank) of values: where a backend's loops are a mix of plain ones and
    ones a scheduler stall lengthened by a whole tick (gloo here: 4 ms in a 20-call loop of 0.3 ms
    calls), the plain loops' time, which the median of a few loops is not."""
    v = sorted(values)
    return v[min(len(v) - 1, int(q * len(v)))]


def summarize(rows: list[dict]) -> list[dict]:
    out = []
    for r in rows:
        ratios = [t["bench_us"] / t["bare_us"] for t in r["tries"]]
        loops = {k: [x for t in r["tries"] for x in t[k + "_loops_us"]] for k in ("bench", "bare")}
        out.append({"bytes": r["bytes"], "bench_us": statistics.median(t["bench_us"] for t in r["tries"]),
                    "bare_us": statistics.median(t["bare_us"] for t in r["tries"]),
                    "ratio_median": statistics.median(ratios), "ratio_best": min(ratios),
                    "ratio_low_loops": low(loops["bench"]) / low(loops["bare"]), "tries": r["tries"]})
    return out


def load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> int:
    from wirespeed.sizes import format_size, parse_size
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backends", default="wirespeed,gloo,mpi")
    ap.add_argument("--sizes", default="4K,64K,1M")
    ap.add_argument("--tries", type=int, default=5, help="bench and bare, in turn, this many times a size")
    ap.add_argument("--iters", type=int, default=20, help="calls per loop (bench's -n)")
    ap.add_argument("--warmup", type=int, default=5, help="bench's -w")
    ap.add_argument("--batches", type=int, default=5, help="bare loops per try (the median is its figure)")
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--backend", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    a = ap.parse_args()
    a.sizes = [parse_size(s) for s in str(a.sizes).split(",")]
    if a.rank:
        return rank_main(a)
    print(f"# bench's all_reduce (float32 sum, in place, 2 ranks) against a bare loop of the library call, "
          f"same processes and buffers; {a.tries} tries a size, bench -n {a.iters} -w {a.warmup}, bare = "
          f"median of {a.batches} loops of {a.iters}; slowest rank; ratio = bench / bare")
    print(f"# {os.cpu_count()} CPUs; mpirun {'on PATH' if shutil.which('mpirun') else 'absent'}")
    from wirespeed.backends.registry import availability
    results = {}
    print(f"{'backend':10} {'size':>6} | {'bench':>10} {'bare':>10} | {'ratio':>6} {'best':>6} {'p20':>6} | "
          "tries (bench/bare us)")
    for name in a.backends.split(","):
        print(f"# {name}: {load()} at the start")
        why = availability(name)
        if why:
            print(f"{name:10} skipped: {why}")
            continue
        results[name] = summarize(run_backend(name, a))
        for r in results[name]:
            tries = " ".join(f"{t['bench_us']:.1f}/{t['bare_us']:.1f}" for t in r["tries"])
            print(f"{name:10} {format_size(r['bytes']):>6} | {r['bench_us']:8.1f}us {r['bare_us']:8.1f}us | "
                  f"{r['ratio_median']:6.3f} {r['ratio_best']:6.3f} {r['ratio_low_loops']:6.3f} | {tries}")
        sys.stdout.flush()
    print(f"# {load()} at the end")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
