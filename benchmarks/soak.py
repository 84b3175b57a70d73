#!/usr/bin/env python3
"""Soak: thousands of random collectives of every kind, dtype, op and size, every one checked.

    .venv/bin/python benchmarks/soak.py                        # 2, 4, 8 ranks, 2000 ops each
    .venv/bin/python benchmarks/soak.py --worlds 4 --ops 20000 --backend gloo --seed 7

For each world size it starts the ranks as `wirespeed bench -N` does (torchrun's variables, the
same launcher and its supervision). Every rank draws the same sequence from one seeded generator:
a collective (all_reduce, all_gather, reduce_scatter, broadcast, reduce, all_to_all, send_recv,
barrier), a dtype (all eight), an op (sum, prod, min, max, avg) for those that reduce, a root,
in place or not, and a size, log-uniform from 0 bytes to --max-bytes with odd sizes included.
Each op gets fresh buffers filled with the harness's verifiable data and is checked against the
exact expected result (bench/verifiable.py). Where the backend has only one variant (torch.distributed
has no out-of-place all_reduce) the other is run; cases it cannot run at all (gloo's integer avg)
are counted as skipped. A step that makes no progress within --timeout ends the rank (the
harness watchdog).

Prints per world size: ops run, skipped, bytes moved (the largest buffer each op touches, as
nccl-tests counts size, summed), wrong elements (must be 0), and the slowest op with what it was.
Exit status 1 if any element was wrong.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))


def draw(rng: random.Random, world: int, max_bytes: int):
    """One op's description, the same on every rank (same generator, same calls)."""
    from wirespeed.bench.collectives import COLLECTIVES
    from wirespeed.bench.dtypes import DTYPES, OPS
    coll = COLLECTIVES[rng.choice(sorted(COLLECTIVES))]
    dtype = DTYPES[rng.choice(sorted(DTYPES))]
    op = rng.choice(OPS) if coll.reduces else None
    root = rng.randrange(world) if coll.rooted else -1
    inplace = rng.choice(coll.variants)
    if rng.random() < 0.05:
        nbytes = 0
    else:  # log-uniform, then any byte count (odd ones included) up to that
        nbytes = rng.randint(1, int(math.exp(rng.uniform(0, math.log(max_bytes)))))
    return coll, dtype, op, root, inplace, nbytes


def rank_main(args) -> int:
    from wirespeed.bench.collectives import Case
    from wirespeed.bench.watchdog import Watchdog
    from wirespeed.launch.environment import rank_info
    from wirespeed.cli.rankjob import start_backend

    info = rank_info()
    backend = start_backend(args.backend, "cpu", info, args.timeout)
    rng = random.Random(args.seed * 1000 + info.world_size)
    watchdog = Watchdog(args.timeout, info.rank)
    ops = skipped = nbytes_total = wrong = 0
    slowest = (0.0, "")
    per_kind: dict[str, int] = {}
    t_start = time.perf_counter()
    try:
        for i in range(args.ops):
            coll, dtype, op, root, inplace, nbytes = draw(rng, info.world_size, args.max_bytes)
            if coll.name == "barrier":
                nbytes = 0
            if backend.unsupported(coll.name, dtype.name, op, inplace, "cpu"):
                inplace = not inplace  # torch.distributed has one variant of some collectives
                if inplace not in coll.variants or backend.unsupported(coll.name, dtype.name, op,
                                                                       inplace, "cpu"):
                    skipped += 1
                    continue
            count, send, recv = coll.counts(nbytes, dtype.itemsize, info.world_size)
            case = Case(coll.name, dtype, op, root, inplace, count, send, recv, info.rank,
                        info.world_size, "cpu")
            what = (f"#{i} barrier" if coll.name == "barrier" else
                    f"#{i} {coll.name} {case.nbytes} B {dtype.name}{' ' + op if op else ''}"
                    f"{f' root {root}' if root >= 0 else ''}{' in-place' if inplace else ''}")
            watchdog.step(f"soaking {what}")
            bufs = coll.alloc(case)
            coll.fill_inputs(case, bufs)
            t0 = time.perf_counter()
            coll.run(backend, case, bufs)
            backend.synchronize()
            took = time.perf_counter() - t0
            wrong += coll.wrong(case, bufs)
            if took > slowest[0]:
                slowest = (took, what)
            ops += 1
            nbytes_total += case.nbytes
            per_kind[coll.name] = per_kind.get(coll.name, 0) + 1
        watchdog.step("gathering the totals")
        rows = backend.allgather_floats([float(ops), float(skipped), float(nbytes_total),
                                         float(wrong), slowest[0]])
        descs = backend.allgather_floats([float(b) for b in slowest[1].encode()[:120].ljust(120, b"\0")])
    finally:
        watchdog.close()
    elapsed = time.perf_counter() - t_start
    if info.rank == 0:
        slow_rank = max(range(len(rows)), key=lambda r: rows[r][4])
        text = bytes(int(x) for x in descs[slow_rank]).rstrip(b"\0").decode()
        out = {"world": info.world_size, "backend": args.backend, "ops": int(rows[0][0]),
               "skipped": int(rows[0][1]), "bytes": int(rows[0][2]),
               "wrong": int(sum(r[3] for r in rows)), "slowest_s": rows[slow_rank][4],
               "slowest_what": text, "slowest_rank": slow_rank, "seconds": elapsed,
               "kinds": per_kind}
        with open(args.result, "w") as f:
            json.dump(out, f)
    backend.shutdown()
    return 0


def launch(args, world: int, result: str) -> int:
    from wirespeed.launch.environment import free_port
    from wirespeed.launch.local import die_with_parent, rank_env, supervise
    port = free_port()
    argv = [sys.executable, os.path.abspath(__file__), "--as-rank", "--ops", str(args.ops),
            "--max-bytes", str(args.max_bytes), "--seed", str(args.seed), "--backend", args.backend,
            "--timeout", str(args.timeout), "--result", result]
    procs = [subprocess.Popen(argv, env=rank_env(r, world, port), preexec_fn=die_with_parent)
             for r in range(world)]
    return supervise(procs)


def human(n: float) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{int(n)} B"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--worlds", default="2,4,8", help="comma list of rank counts")
    p.add_argument("--ops", type=int, default=2000, help="random collectives per world size")
    p.add_argument("--max-bytes", type=int, default=1 << 20, help="largest buffer of an op")
    p.add_argument("--backend", default="wirespeed", help="wirespeed (default) or gloo")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--timeout", type=float, default=120.0, help="seconds without progress")
    p.add_argument("--as-rank", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--result", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.as_rank:
        return rank_main(args)
    print(f"# soak: {args.ops} random checked collectives per world size, backend {args.backend}, "
          f"sizes 0 B to {human(args.max_bytes)}, seed {args.seed}, timeout {args.timeout:g} s")
    print(f"{'ranks':>5} {'ops':>7} {'skipped':>7} {'bytes':>11} {'wrong':>6} {'seconds':>8} "
          f"{'ops/s':>7} {'slowest op':>11}  what (rank)")
    failed = 0
    with tempfile.TemporaryDirectory(prefix="wirespeed-soak-") as tmp:
        for world in (int(w) for w in args.worlds.split(",")):
            result = os.path.join(tmp, f"{world}.json")
            code = launch(args, world, result)
            if code != 0 or not os.path.exists(result):
                print(f"{world:>5} the job failed with status {code}", flush=True)
                failed = failed or code or 1
                continue
            with open(result) as f:
                r = json.load(f)
            failed = failed or (1 if r["wrong"] else 0)
            print(f"{world:>5} {r['ops']:>7} {r['skipped']:>7} {human(r['bytes']):>11} "
                  f"{r['wrong']:>6} {r['seconds']:>8.1f} {r['ops'] / r['seconds']:>7.0f} "
                  f"{r['slowest_s'] * 1e3:>8.2f} ms  {r['slowest_what']} (rank {r['slowest_rank']})",
                  flush=True)
            print(f"{'':>5} by kind: " + ", ".join(f"{k} {n}" for k, n in sorted(r["kinds"].items())),
                  flush=True)
    return failed


if __name__ == "__main__":
    sys.exit(main())
