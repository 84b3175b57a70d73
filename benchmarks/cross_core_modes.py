#!/usr/bin/env python3
"""How much a 2-rank staged copy costs right now, in several fresh process pairs.

    .venv/bin/python benchmarks/cross_core_modes.py               # 6 pairs, 64 KiB
    .venv/bin/python benchmarks/cross_core_modes.py --pairs 10 --bytes 16384

Each pair is two new processes joined in a wirespeed group; rank 0 broadcasts `--bytes` to rank
1 through the staging slot (copy in, one sync, copy out: data one core just wrote, read by the
other) in a loop, and the pair prints the time per op for a few consecutive loops. On a VM the
figure depends on where the hypervisor has placed the vCPUs: docs/small-messages.md found 2.9, 8
and 30 us for 64 KiB on the development VM, fixed for a pair's life and changing between pairs.
Run it before a benchmark to know which mode the machine is in. The broadcast's result is checked
in every pair before it is timed.
"""
from __future__ import annotations

import argparse
import datetime
import multiprocessing as mp
import os
import socket
import time


def _rank(rank: int, port: int, nbytes: int, loops: int, q) -> None:
    import torch
    import torch.distributed as dist
    # This probe measures the staged copy: raise both staging limits (2 ranks have their own).
    os.environ["WIRESPEED_STAGE_MAX"] = os.environ["WIRESPEED_PAIR_STAGE_MAX"] = str(max(nbytes, 1))
    from wirespeed.native.rendezvous import rendezvous
    store = dist.TCPStore("127.0.0.1", port, 2, rank == 0)
    g = rendezvous(store, rank, 2, datetime.timedelta(seconds=30))
    t = torch.arange(nbytes, dtype=torch.uint8) if rank == 0 else torch.zeros(nbytes, dtype=torch.uint8)
    g.broadcast((t.data_ptr(), nbytes), 0, t, True)
    if not torch.equal(t, torch.arange(nbytes, dtype=torch.uint8)):
        q.put((rank, f"rank {rank}: broadcast result is wrong: not timed"))
        return
    for _ in range(200):   # warm-up: page faults, the first slot reuse
        g.broadcast((t.data_ptr(), nbytes), 0, t, True)
    times = []
    for _ in range(loops):
        g.barrier(True)
        n = 2000
        t0 = time.perf_counter()
        for _ in range(n):
            g.broadcast((t.data_ptr(), nbytes), 0, t, True)
        times.append((time.perf_counter() - t0) / n * 1e6)
    q.put((rank, times))


def _pair(nbytes: int, loops: int) -> list[float]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    q = mp.get_context("spawn").Queue()
    ps = [mp.get_context("spawn").Process(target=_rank, args=(r, port, nbytes, loops, q)) for r in range(2)]
    for p in ps:
        p.start()
    got = dict(q.get(timeout=120) for _ in ps)
    for p in ps:
        p.join()
    for v in got.values():
        if isinstance(v, str):
            raise SystemExit(v)
    return [max(a, b) for a, b in zip(got[0], got[1])]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=6, help="fresh process pairs to measure (default 6)")
    ap.add_argument("--bytes", type=int, default=65536, help="bytes per broadcast (default 65536; at most 1 MiB)")
    ap.add_argument("--loops", type=int, default=3, help="timed loops of 2,000 ops per pair (default 3)")
    a = ap.parse_args()
    if a.pairs < 1 or a.loops < 1 or not 1 <= a.bytes <= 1 << 20:
        ap.error("--pairs and --loops at least 1; --bytes from 1 to 1048576 (the staging slot)")
    print(f"# 2-rank staged broadcast of {a.bytes} B, us per op (slowest rank), {a.loops} loops per pair")
    for i in range(a.pairs):
        print(f"pair {i + 1}: " + " ".join(f"{t:6.1f}" for t in _pair(a.bytes, a.loops)), flush=True)


if __name__ == "__main__":
    main()
