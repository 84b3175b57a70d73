"""What torch's call path adds to a wirespeed all_reduce, in the same processes: a loop of
`dist.all_reduce(t, group=g)` against a loop of the group's native blocking call on the same
tensor, N local ranks (spawned here), float32 sum. Run by hand:

    .venv/bin/python benchmarks/torch_path_cost.py --ranks 8 --kib 4 --calls 3000

Prints rank 0's time per call of each loop (back to back, after 200 untimed calls and a barrier)
and their ratio. docs/small-messages.md reads it: with more ranks than cores, every op waits for
every rank's Python to get a core, so torch's few microseconds of Python per call cost much more
than they do with a core per rank."""
from __future__ import annotations

import argparse
import datetime
import os
import socket
import subprocess
import sys
import time


def rank_main(rank: int, world: int, port: int, kib: int, calls: int) -> None:
    import torch
    import torch.distributed as dist
    import wirespeed.native  # noqa: F401  (registers the backend)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world, init_method=f"tcp://127.0.0.1:{port}",
                            timeout=datetime.timedelta(seconds=120))
    g = dist.new_group(backend="wirespeed")
    n = kib * 256
    t = torch.ones(n)
    native, ptr = g.native, t.data_ptr()

    def loop(f) -> float:
        for _ in range(200):
            f()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(calls):
            f()
        return (time.perf_counter() - t0) / calls * 1e6

    via_torch = loop(lambda: dist.all_reduce(t, group=g))
    direct = loop(lambda: native.all_reduce(ptr, n, 0, 0, t, True))
    t.fill_(1.0)
    dist.all_reduce(t, group=g)
    if not torch.equal(t, torch.full((n,), float(world))):
        raise SystemExit(f"torch_path_cost: rank {rank}: the checked all_reduce is wrong")
    if rank == 0:
        print(f"{world} ranks, {kib} KiB: dist.all_reduce {via_torch:.1f} us, native call {direct:.1f} us, "
              f"ratio {via_torch / direct:.2f} (rank 0, {calls} calls each)")
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--kib", type=int, default=4)
    ap.add_argument("--calls", type=int, default=3000)
    ap.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.ranks < 2 or a.kib < 1 or a.calls < 1:
        ap.error("--ranks >= 2, --kib >= 1, --calls >= 1")
    if a.rank is not None:
        rank_main(a.rank, a.ranks, a.port, a.kib, a.calls)
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen([sys.executable, __file__, "--ranks", str(a.ranks), "--kib", str(a.kib),
                               "--calls", str(a.calls), "--rank", str(r), "--port", str(port)], env=os.environ)
             for r in range(a.ranks)]
    codes = [p.wait(timeout=600) for p in procs]
    if any(codes):
        raise SystemExit(f"torch_path_cost: ranks exited {codes}")


if __name__ == "__main__":
    main()
