#!/usr/bin/env python3
"""all_reduce on wirespeed vs gloo vs Open MPI, measured in one run on this machine.

    .venv/bin/python benchmarks/allreduce_vs_peers.py [--worlds 2,4,8] [--sizes 4K,1M,16M,64M]

For each world size it launches the ranks twice: once with torch (gloo and wirespeed groups in the
same processes, timed one after the other on the same buffers), once under mpirun (mpi4py on
Open MPI, default shared-memory transport). Time per op is the slowest rank's, median over
iterations (small sizes time batches of ops and divide). Every library's result is checked
(float32 sum of small integers, exact in any order) before it is timed; a wrong result aborts.
busbw = size / time x 2(n-1)/n (nccl-tests' definition). Ratios > 1 mean wirespeed is better.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

from wirespeed.launch.environment import free_port
from wirespeed.launch.local import rank_env

SIZES = {"4K": 4 << 10, "1M": 1 << 20, "16M": 16 << 20, "64M": 64 << 20}


def plan(nbytes: int) -> tuple[int, int, int]:
    """(warm-up iterations, timed iterations, ops per iteration) for a message size."""
    if nbytes <= 64 << 10:
        return 3, 15, 50
    if nbytes <= 1 << 20:
        return 3, 30, 4
    if nbytes <= 16 << 20:
        return 2, 12, 1
    return 2, 8, 1


# ---------------------------------------------------------------- worker side
def time_op(call, sync, gather_times, nbytes):
    warm, iters, batch = plan(nbytes)
    for _ in range(warm):
        call()
    sync()
    samples = []
    for _ in range(iters):
        t0 = time.perf_counter()
        for _ in range(batch):
            call()
        samples.append((time.perf_counter() - t0) / batch)
    per_iter_max = [max(col) for col in zip(*gather_times(samples))]
    return statistics.median(per_iter_max)


def check(buf, world, name):
    want = world * (world + 1) / 2
    if not bool((buf == want).all()):
        raise SystemExit(f"{name}: wrong all_reduce result ({buf[:4].tolist()} vs {want}): not timed")


def torch_worker(sizes):
    import datetime

    import torch
    import torch.distributed as dist
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
    import wirespeed.native  # noqa: F401

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=120))
    ws = dist.new_group(backend="wirespeed")
    groups = {"wirespeed": ws, "gloo": dist.group.WORLD}
    out = {}

    def gather_with(g):
        def gather(samples):
            t = torch.tensor(samples, dtype=torch.float64)
            allv = [torch.empty_like(t) for _ in range(world)]
            dist.all_gather(allv, t, group=g)
            return [v.tolist() for v in allv]
        return gather

    for label, nbytes in sizes.items():
        n = nbytes // 4
        for name, g in groups.items():
            buf = torch.full((n,), float(rank + 1))
            dist.all_reduce(buf, group=g)
            check(buf, world, name)
            out[f"{name}|{label}"] = time_op(lambda: dist.all_reduce(buf, group=g), lambda: dist.barrier(group=g),
                                             gather_with(g), nbytes)
        # The native API without torch's dispatch (same engine, same algorithms).
        native = ws.native
        buf = torch.full((n,), float(rank + 1))
        native.all_reduce(buf.data_ptr(), n, 0, 0, buf, True)  # blocking, as MPI_Allreduce is
        check(buf, world, "wirespeed-native")
        out[f"wirespeed-native|{label}"] = time_op(lambda: native.all_reduce(buf.data_ptr(), n, 0, 0, buf, True),
                                                   lambda: dist.barrier(group=ws), gather_with(ws), nbytes)
    if rank == 0:
        print("RESULT " + json.dumps(out), flush=True)
    dist.barrier()
    os._exit(0)


def mpi_worker(sizes):
    import numpy as np
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    rank, world = comm.Get_rank(), comm.Get_size()
    out = {}
    for label, nbytes in sizes.items():
        n = nbytes // 4
        src = np.full(n, float(rank + 1), dtype=np.float32)
        dst = np.empty_like(src)
        comm.Allreduce(src, dst, op=MPI.SUM)
        check(dst, world, "Open MPI")
        out[f"openmpi|{label}"] = time_op(lambda: comm.Allreduce(src, dst, op=MPI.SUM), comm.Barrier,
                                          lambda s: comm.allgather(s), nbytes)
    if rank == 0:
        print("RESULT " + json.dumps(out), flush=True)


# ---------------------------------------------------------------- driver side
def result_of(stdout: str, what: str) -> dict:
    for line in stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise SystemExit(f"{what} produced no result:\n{stdout[-2000:]}")


def run_torch(world, sizes_arg, timeout):
    port = free_port()
    procs = []
    for r in range(world):
        env = rank_env(r, world, port)
        procs.append(subprocess.Popen([sys.executable, __file__, "--worker", "torch", "--sizes", sizes_arg],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=timeout)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return result_of(outs[0], f"torch ranks (world {world})")


def run_mpi(world, sizes_arg, timeout):
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        return None
    cmd = [mpirun, "-np", str(world), "--oversubscribe", "--bind-to", "none"]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    cmd += [sys.executable, __file__, "--worker", "mpi", "--sizes", sizes_arg]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    return result_of(p.stdout + p.stderr, f"mpirun (world {world})")


def fmt_time(s):
    return f"{s * 1e6:9.1f} us" if s < 1e-3 else f"{s * 1e3:9.2f} ms"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worlds", default="2,4,8")
    ap.add_argument("--sizes", default="4K,1M,16M,64M")
    ap.add_argument("--worker", choices=["torch", "mpi"])
    ap.add_argument("--timeout", type=float, default=600)
    a = ap.parse_args()
    try:
        sizes = {s: SIZES[s] for s in a.sizes.split(",")}
        worlds = [int(w) for w in a.worlds.split(",")]
    except (KeyError, ValueError):
        ap.error(f"--sizes takes names from {','.join(SIZES)}; --worlds takes integers")
    if a.worker == "torch":
        return torch_worker(sizes)
    if a.worker == "mpi":
        return mpi_worker(sizes)

    print(f"# all_reduce float32 sum, {os.cpu_count()} CPUs, median over iterations of the slowest rank")
    print("# ratio = peer time / wirespeed time (>1: wirespeed faster); ws-torch via torch.distributed, "
          "ws-native via wirespeed._native")
    hdr = (f"{'ranks':>5} {'size':>5} | {'ws-torch':>12} {'ws-native':>12} {'gloo':>12} {'Open MPI':>12} | "
           f"{'busbw ws':>9} {'gloo':>6} {'MPI':>6} GB/s | {'vs gloo':>7} {'vs MPI':>7} {'native vs MPI':>13}")
    print(hdr)
    rows = []
    for w in worlds:
        t = run_torch(w, a.sizes, a.timeout)
        m = run_mpi(w, a.sizes, a.timeout) or {}
        for label, nbytes in sizes.items():
            ws, wn, gl = t[f"wirespeed|{label}"], t[f"wirespeed-native|{label}"], t[f"gloo|{label}"]
            mp = m.get(f"openmpi|{label}")
            bus = lambda s: nbytes / s * 2 * (w - 1) / w / 1e9 if s else float("nan")  # noqa: E731
            print(f"{w:>5} {label:>5} | {fmt_time(ws):>12} {fmt_time(wn):>12} {fmt_time(gl):>12} "
                  f"{fmt_time(mp) if mp else 'n/a':>12} | {bus(ws):9.2f} {bus(gl):6.2f} "
                  f"{bus(mp) if mp else float('nan'):6.2f}      | {gl / ws:7.2f} "
                  f"{(mp / ws) if mp else float('nan'):7.2f} {(mp / wn) if mp else float('nan'):13.2f}", flush=True)
            rows.append(dict(ranks=w, size=label, wirespeed=ws, wirespeed_native=wn, gloo=gl, openmpi=mp))
    print("# raw: " + json.dumps(rows))


if __name__ == "__main__":
    main()
