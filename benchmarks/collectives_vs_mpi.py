#!/usr/bin/env python3
"""all_reduce, all_gather, reduce_scatter and broadcast: wirespeed against Open MPI and gloo in the same processes.

    .venv/bin/python benchmarks/collectives_vs_mpi.py                      # 2, 4, 8 ranks; 4K..256M
    .venv/bin/python benchmarks/collectives_vs_mpi.py --worlds 2 --sizes 4K,64K,1M --colls all_reduce

One `mpirun` per world size starts the ranks; each rank is at once an MPI process (mpi4py on Open
MPI, its default shared-memory transport: vader/sm with CMA) and a torch.distributed rank of a
"wirespeed" group. So the contenders run in the very same processes, one after the other, on
the same buffers' sizes:
- `ws-native`: wirespeed's native API, the blocking form (`g.all_reduce(ptr, n, dtype, op, t, True)`: t owns the memory),
  as MPI_Allreduce is blocking;
- `ws-torch`: `torch.distributed.all_reduce(t, group=wirespeed_group)` and friends (async_op=False);
- `Open MPI`: `comm.Allreduce(MPI.IN_PLACE, buf)`, `Allgather`, `Reduce_scatter_block`, `Bcast`;
- `gloo`: the very torch calls of ws-torch on a `dist.new_group(backend="gloo")` group of the same
  ranks: torch's own CPU backend, what a torch user gets without wirespeed;
- `torch floor`: the ws-torch calls on a group of torch's own C++ "fake" backend, which moves no
  data and returns a completed Work at once: what torch's API costs before any backend runs, the
  least any backend can take through `torch.distributed` (not a collective, so not checked;
  "n/a" where this torch lacks the fake backend).

Timing, the same for every contender, two ways from the same processes (--timing, default both).
Loop (nccl-tests' method): warm-up ops, a barrier, a loop of `iters` back-to-back ops, the elapsed
time / iters on each rank, the maximum over ranks. Spaced (how users time a call inside their own
loop, issue 40): each call preceded by a barrier (and with --dirty-mb by writing a buffer, as
compute between a training step's buckets would), timed alone, the call's time the slowest rank's,
the median of 20 calls (10 from 64 MiB). `iters` is
calibrated once per case so a loop lasts ~--loop-ms, and is the same on every rank. The contenders are
measured in turn (the order rotates each round) for --rounds rounds; a case's time is the median
over rounds. The machine is shared: the load average is printed before and after each world, and
only ratios within one run mean much. Sizes follow nccl-tests: the whole buffer (all_gather's
output, reduce_scatter's input, all_reduce's and broadcast's buffer). busbw = size / time x
2(n-1)/n for all_reduce, (n-1)/n for all_gather and reduce_scatter, 1 for broadcast.
Every contender's result is checked against the exact answer before it is timed; a wrong result
stops the run.

The copy bound (all_reduce, 16 MiB and up). On one host both wirespeed and Open MPI (vader with
CMA) move the bytes with the kernel's cross-process copy, so that copy's speed bounds them. Before
each world size the driver measures, in the same run, one process copying with nothing else of ours
running: memcpy (ctypes.memmove between two written buffers) and process_vm_readv from a second,
sleeping process. S bytes go as one call, or as back-to-back calls of 256 KiB, 1 MiB or 4 MiB
pieces, each landing in its place or all in one reused scratch piece (as a library that copies to
scratch and reduces from there: the scratch stays in cache); the rate is the best way's best of 5
timed copies, every way's bytes checked once. It measures both S and S/n (the piece a rank copies per
peer, whose working set may fit a cache that S does not), and C is the faster of the two
process_vm_readv rates. Then:  busbw <= min(n, cores) x C / n.  Why: every rank must end with the
sum of all n inputs, so each receives at least 2(n-1)/n x S bytes (reduce-scatter then all-gather:
(n-1)/n x S in each phase; at 2 ranks one whole copy each way is S too); that is 2(n-1) x S bytes
copied in all, by at most min(n, cores) cores at once, so t >= 2(n-1)S / (min(n, cores) x C), and
busbw = S/t x 2(n-1)/n gives the bound (2 ranks on 2 cores: C; 4 ranks: C/2). It ignores the
reduction's cost, latency, and parallel copies slowing each other (one memory system), so it is an
upper limit, likely loose; a library above it means an assumption is wrong (a way to move bytes
without a copy, or C measured low: a faster way to copy than those tried), and the line says so.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

# The checkout's package first, before anything of wirespeed is imported (here and in the ranks):
# run from a worktree, the script measures that tree's wirespeed, not one installed elsewhere.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from wirespeed.launch.environment import free_port  # noqa: E402

SIZES = {"4K": 4 << 10, "16K": 16 << 10, "64K": 64 << 10, "256K": 256 << 10, "1M": 1 << 20,
         "4M": 4 << 20, "16M": 16 << 20, "64M": 64 << 20, "256M": 256 << 20}
COLLS = ["all_reduce", "all_gather", "reduce_scatter", "broadcast"]
IMPLS = ["ws-native", "ws-torch", "mpi", "gloo"]
FLOOR = "torch-floor"


def busbw_factor(coll: str, n: int) -> float:
    return {"all_reduce": 2 * (n - 1) / n, "all_gather": (n - 1) / n, "reduce_scatter": (n - 1) / n,
            "broadcast": 1.0}[coll]


BOUND_FROM = 16 << 20  # all_reduce sizes from here up get the copy-bound lines


def allreduce_copy_bound(n: int, cores: int, copy_bw: float) -> float:
    """The highest busbw (same unit as copy_bw) a one-host all_reduce of n ranks can reach when its
    bytes move by cross-process copies that run at copy_bw on each of min(n, cores) cores at once.

    Every rank must end with the sum of all n inputs, so in the bandwidth model every rank receives at
    least 2(n-1)/n x S bytes (reduce-scatter + all-gather reaches it: (n-1)/n x S in each phase; at 2
    ranks "one whole copy each way" receives S too). Moved by copies, that is 2(n-1) x S bytes copied
    in all; with p = min(n, cores) copies in parallel the time is t >= 2(n-1)S / (p x copy_bw), and
    busbw = S/t x 2(n-1)/n <= p x copy_bw / n. Ignored, so the bound stays an upper limit: the
    reduction's own arithmetic and memory traffic, latency, synchronisation, and parallel copies
    slowing each other through the shared memory system."""
    if n < 2 or cores < 1 or copy_bw <= 0:
        raise ValueError(f"need n >= 2, cores >= 1, copy_bw > 0 (got {n}, {cores}, {copy_bw})")
    return min(n, cores) * copy_bw / n


# ---------------------------------------------------------------- worker side
class Case:
    """One collective at one size for one contender: buffers, a checked op, a timed op."""

    def __init__(self, impl, coll, nbytes, ctx):
        import numpy as np
        import torch
        self.impl, self.coll = impl, coll
        rank, world = ctx["rank"], ctx["world"]
        n = max(nbytes // 4 // world * world, world)  # float32 elements, a multiple of the world
        per = n // world
        self.n, self.per, self.rank, self.world = n, per, rank, world
        # torch tensors for everyone; numpy views of the same memory for mpi4py.
        if coll == "all_reduce" or coll == "broadcast":
            self.a = torch.zeros(n)
            self.b = None
        elif coll == "all_gather":
            self.a = torch.zeros(per)
            self.b = torch.zeros(n)
        else:  # reduce_scatter
            self.a = torch.zeros(n)
            self.b = torch.zeros(per)
        self.np_a = self.a.numpy()
        self.np_b = self.b.numpy() if self.b is not None else None
        self.call = self._bind(ctx, np)

    def _bind(self, ctx, np):
        import torch.distributed as dist
        a, b, coll = self.a, self.b, self.coll
        if self.impl == "mpi":
            from mpi4py import MPI
            comm = ctx["comm"]
            na, nb = self.np_a, self.np_b
            return {"all_reduce": lambda: comm.Allreduce(MPI.IN_PLACE, na, op=MPI.SUM),
                    "all_gather": lambda: comm.Allgather(na, nb),
                    "reduce_scatter": lambda: comm.Reduce_scatter_block(na, nb, op=MPI.SUM),
                    "broadcast": lambda: comm.Bcast(na, root=0)}[coll]
        if self.impl in ("ws-torch", "gloo", FLOOR):
            g = ctx[{"ws-torch": "group", "gloo": "gloo", FLOOR: "fake"}[self.impl]]
            return {"all_reduce": lambda: dist.all_reduce(a, group=g),
                    "all_gather": lambda: dist.all_gather_into_tensor(b, a, group=g),
                    "reduce_scatter": lambda: dist.reduce_scatter_tensor(b, a, group=g),
                    "broadcast": lambda: dist.broadcast(a, src=0, group=g)}[coll]
        g = ctx["native"]
        w, pa = self.world, a.data_ptr()
        if coll == "all_reduce":
            n = self.n
            return lambda: g.all_reduce(pa, n, 0, 0, a, True)
        if coll == "broadcast":
            buf = (pa, self.n * 4)
            return lambda: g.broadcast(buf, 0, a, True)
        pb, chunk = b.data_ptr(), self.per * 4
        if coll == "all_gather":
            send, recv = (pa, chunk), [(pb + r * chunk, chunk) for r in range(w)]
            return lambda: g.all_gather(send, recv, (a, b), True)
        send, per = [(pa + r * chunk, chunk) for r in range(w)], self.per
        return lambda: g.reduce_scatter(send, pb, per, 0, 0, (a, b), True)

    def check(self):
        """Run the op once on inputs whose exact result is known; raise if any element differs."""
        import torch
        r, w, per = self.rank, self.world, self.per
        idx = torch.arange(self.n, dtype=torch.float32)
        block = torch.div(idx, per, rounding_mode="floor")
        if self.coll == "all_reduce":
            self.a.copy_(r + 1 + idx % 7)
            want = w * (w + 1) / 2 + w * (idx % 7)
            got = self.a
        elif self.coll == "broadcast":
            self.a.copy_(idx % 251 if r == 0 else torch.full_like(idx, -1.0))
            want, got = idx % 251, self.a
        elif self.coll == "all_gather":
            self.a.copy_(r * 100 + torch.arange(per, dtype=torch.float32) % 97)
            self.b.fill_(-1.0)
            want = block * 100 + (idx - block * per) % 97
            got = self.b
        else:
            self.a.copy_(r + 1 + 1000 * block)
            self.b.fill_(-1.0)
            want = w * (w + 1) / 2 + 1000 * r * w + torch.zeros(per)
            got = self.b
        self.call()
        if not torch.equal(got, want.to(got.dtype)):
            bad = int((got != want).nonzero()[0])
            raise SystemExit(f"{self.impl} {self.coll} of {self.n * 4} bytes on {w} ranks: rank {r} element "
                             f"{bad} is {float(got[bad])}, expected {float(want[bad])}: not timed")
        # Time on zeros: sums stay 0, so no value ever grows into infinities or denormals.
        self.a.zero_()
        if self.b is not None:
            self.b.zero_()


def timed_loop(case, iters, comm, warm):
    for _ in range(warm):
        case.call()
    comm.Barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        case.call()
    el = (time.perf_counter() - t0) / iters
    return comm.allreduce(el, op=max_op())


def spaced_times(case, comm, iters, dirty):
    """The way users time one call inside their own loop: each call preceded by a barrier (and, with
    `dirty`, by writing that buffer first, as a training step's compute refills the caches between
    its buckets), timed alone; a call's time is the slowest rank's. Returns the median over `iters`
    calls (the timing of issue 40's tables: 20 calls, 10 from 64 MiB)."""
    import numpy as np
    case.call()                      # one untimed call: the first touch of this case's buffers
    mine = np.zeros(iters)
    for i in range(iters):
        if dirty is not None:
            dirty.fill(i)
        comm.Barrier()
        t0 = time.perf_counter()
        case.call()
        mine[i] = time.perf_counter() - t0
    slowest = np.zeros(iters)
    comm.Allreduce(mine, slowest, op=max_op())
    return float(np.median(slowest))


def calibrate(case, comm, loop_s):
    """Iterations for a loop of about `loop_s`, the same on every rank: loops of 1, 2, 4... ops
    until one lasts 2 ms on the slowest rank, then the best per-op time of two such loops scales it
    (the best, so a moment of someone else's load does not shrink every later loop)."""
    k = 1
    while True:
        per = timed_loop(case, k, comm, warm=1)
        if per * k >= 2e-3 or k >= 1024:
            break
        k *= 2
    per = min(per, timed_loop(case, k, comm, warm=0))
    return int(min(max(loop_s / per, 2), 5000))


def max_op():
    from mpi4py import MPI
    return MPI.MAX


def rank_setup():
    """This rank's contenders, each in the same processes: MPI's world, and torch.distributed with
    a wirespeed group, a gloo group of its own (as ws-torch has: not the default group's) and
    torch's fake group where this torch has it. Returns (ctx, impls): what Case takes, and the
    contenders to run (the floor only with the fake group)."""
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    rank, world = comm.Get_rank(), comm.Get_size()
    import torch
    import torch.distributed as dist
    import wirespeed.native  # noqa: F401  (registers the backend)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=300))
    group = dist.new_group(backend="wirespeed")
    gloo = dist.new_group(backend="gloo")
    try:
        import torch.testing._internal.distributed.fake_pg  # noqa: F401  (registers torch's "fake" backend)
        fake = dist.new_group(backend="fake")
    except Exception:  # a torch without its testing package or the fake backend: no floor column
        fake = None
    ctx = {"rank": rank, "world": world, "comm": comm, "group": group, "native": group.native, "gloo": gloo,
           "fake": fake}
    return ctx, IMPLS + ([FLOOR] if fake is not None else [])


def worker(a):
    import torch.distributed as dist
    ctx, impls = rank_setup()
    comm, rank = ctx["comm"], ctx["rank"]
    sizes = [SIZES[s] for s in a.sizes.split(",")]
    colls = a.colls.split(",")
    results = {}
    import torch
    dirty = torch.zeros(int(a.dirty_mb * (1 << 20)) // 4) if a.dirty_mb > 0 else None
    for coll in colls:
        for nbytes in sizes:
            cases = {impl: Case(impl, coll, nbytes, ctx) for impl in impls}
            iters = {}
            for impl, c in cases.items():
                if impl != FLOOR:
                    c.check()
                iters[impl] = calibrate(c, comm, a.loop_ms * 1e-3)
            times = {impl: [] for impl in impls}
            spaced = {impl: [] for impl in impls}
            calls = 20 if nbytes < (64 << 20) else 10
            for rnd in range(a.rounds):
                order = impls[rnd % len(impls):] + impls[:rnd % len(impls)]
                for impl in order:
                    if a.timing in ("loop", "both"):
                        times[impl].append(timed_loop(cases[impl], iters[impl], comm, warm=max(1, iters[impl] // 20)))
                    if a.timing in ("spaced", "both"):
                        spaced[impl].append(spaced_times(cases[impl], comm, calls, dirty))
            results[f"{coll}|{nbytes}"] = {
                impl: {"median": statistics.median(times[impl]) if times[impl] else None, "all": times[impl],
                       "iters": iters[impl],
                       "spaced": statistics.median(spaced[impl]) if spaced[impl] else None,
                       "spaced_all": spaced[impl]}
                for impl in impls}
            del cases
    if rank == 0:
        print("RESULT " + json.dumps(results), flush=True)
    comm.Barrier()
    dist.destroy_process_group()


# ---------------------------------------------------------------- driver side
def load():
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def run_world(world, a):
    mpirun = shutil.which("mpirun")
    port = free_port()
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    cmd = [mpirun, "-np", str(world), "--oversubscribe", "--bind-to", "none"]
    if a.nice:
        # With autogroup scheduling (the Linux default for desktops and VMs) nice only ranks processes
        # within one session's group: start a session of our own and set that group's niceness.
        cmd = ["setsid", "sh", "-c", f'echo {a.nice} > /proc/self/autogroup 2>/dev/null; exec nice -n {a.nice} "$@"',
               "sh"] + cmd
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    for v in ("MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS"):
        cmd += ["-x", v]
    cmd += [sys.executable, os.path.abspath(__file__), "--worker", "--sizes", a.sizes, "--colls", a.colls,
            "--rounds", str(a.rounds), "--loop-ms", str(a.loop_ms), "--timing", a.timing,
            "--dirty-mb", str(a.dirty_mb)]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout, env=env)
    except subprocess.TimeoutExpired:
        raise SystemExit(f"the {world}-rank run did not finish within {a.timeout:.0f} s (raise --timeout)")
    out = p.stdout + p.stderr
    for line in out.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise SystemExit(f"the {world}-rank run (exit {p.returncode}) produced no result:\n{out[-3000:]}")


# A second process whose memory the driver reads with process_vm_readv: it fills a buffer with a known
# pattern (so the copy can be checked), prints the buffer's address and waits for its stdin to close.
_PEER = """
import ctypes, mmap, sys
n = int(sys.argv[1])
m = mmap.mmap(-1, n)
m[:] = bytes(range(256)) * (n // 256)
print(ctypes.addressof(ctypes.c_char.from_buffer(m)), flush=True)
sys.stdin.read()
"""


COPY_CHUNKS = (256 << 10, 1 << 20, 4 << 20)  # besides one whole-buffer call


def copy_bandwidths(sizes, reps=5):
    """{size: (memcpy bytes/s, process_vm_readv bytes/s, chunk bytes of the latter's best)} in this
    process: S bytes copied as one call or as back-to-back calls of 256 KiB, 1 MiB or 4 MiB (a library
    may copy in pieces and its pieces may meet the caches better), the best over chunkings of the best
    of `reps` timed copies after an untimed one. Every buffer is written before the first copy, so no
    page fault is timed; each chunking's bytes are checked once. One process copies at a time: the
    per-core rate the bound assumes."""
    import ctypes

    class Iovec(ctypes.Structure):
        _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]

    libc = ctypes.CDLL(None, use_errno=True)
    pvr = libc.process_vm_readv
    pvr.restype = ctypes.c_ssize_t
    pvr.argtypes = [ctypes.c_int, ctypes.POINTER(Iovec), ctypes.c_ulong, ctypes.POINTER(Iovec),
                    ctypes.c_ulong, ctypes.c_ulong]
    big = max(sizes)
    peer = subprocess.Popen([sys.executable, "-c", _PEER, str(big)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        remote = int(peer.stdout.readline())
        pattern = bytes(range(256)) * (big // 256)
        src, dst = bytearray(pattern), bytearray(big)
        a_src = ctypes.addressof(ctypes.c_char.from_buffer(src))
        a_dst = ctypes.addressof(ctypes.c_char.from_buffer(dst))
        ctypes.memset(a_dst, 1, big)  # touched, and not already the answer
        out = {}
        for n in sizes:
            best = {"memcpy": (0.0, 0, True), "process_vm_readv": (0.0, 0, True)}
            # (piece, into place): pieces land where they belong, so the destination is all of S;
            # (piece, not in place): every piece lands in one reused scratch piece that stays in cache,
            # as when a library copies into scratch and reduces from there.
            ways = [(c, True) for c in COPY_CHUNKS if c < n] + [(n, True)] + [(c, False) for c in COPY_CHUNKS if c < n]
            for chunk, in_place in ways:
                offs = range(0, n, chunk)
                pairs = [(a_dst + (o if in_place else 0), o) for o in offs]
                last = offs[-1]

                def memcpy():
                    for d, o in pairs:
                        ctypes.memmove(d, a_src + o, chunk)

                iovs = [(Iovec(d, chunk), Iovec(remote + o, chunk)) for d, o in pairs]

                def readv():
                    for loc, rem in iovs:
                        got = pvr(peer.pid, ctypes.byref(loc), 1, ctypes.byref(rem), 1, 0)
                        if got != chunk:
                            raise SystemExit(f"process_vm_readv of {chunk} bytes returned {got} "
                                             f"(errno {ctypes.get_errno()}): no cross-process copy figure")

                for name, f in (("process_vm_readv", readv), ("memcpy", memcpy)):
                    ctypes.memset(a_dst, 1, n)
                    f()
                    if (dst[:n] != pattern[:n]) if in_place else (dst[:chunk] != pattern[last:last + chunk]):
                        raise SystemExit(f"{name} of {n} bytes in {chunk}-byte pieces copied wrong bytes: "
                                         "no copy figure")
                    ts = []
                    for _ in range(reps):
                        t0 = time.perf_counter()
                        f()
                        ts.append(time.perf_counter() - t0)
                    best[name] = max(best[name], (n / min(ts), chunk, in_place))
            out[n] = (best["memcpy"][0], best["process_vm_readv"][0], *best["process_vm_readv"][1:])
        return out
    finally:
        peer.stdin.close()
        peer.wait(timeout=30)


def llc_size():
    """The last-level cache's size as sysfs reports it (text), or 'unknown'."""
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        idx = max((int(open(f"{base}/{d}/level").read()), d) for d in os.listdir(base) if d.startswith("index"))
        return f"L{idx[0]} {open(f'{base}/{idx[1]}/size').read().strip()}"
    except (OSError, ValueError):
        return "unknown"


def fmt_bytes(n):
    return next(f"{n >> k}{u}" for k, u in ((20, "M"), (10, "K"), (0, "")) if n >= 1 << k and n % (1 << k) == 0)


def fmt(s):
    return f"{s * 1e6:.1f} us" if s < 1e-3 else f"{s * 1e3:.2f} ms"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worlds", default="2,4,8", help="rank counts, comma separated (default 2,4,8)")
    ap.add_argument("--sizes", default=",".join(SIZES), help=f"from {','.join(SIZES)}")
    ap.add_argument("--colls", default=",".join(COLLS), help=f"from {','.join(COLLS)}")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of the contenders per case (median)")
    ap.add_argument("--loop-ms", type=float, default=20.0, help="target duration of one timed loop")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds allowed per world size")
    ap.add_argument("--nice", type=int, default=0,
                    help="run the ranks at this niceness (e.g. -10, as root): on a machine shared with other "
                         "jobs, ranks then lose fewer time slices to them, for every contender alike")
    ap.add_argument("--timing", choices=("loop", "spaced", "both"), default="both",
                    help="loop: back-to-back calls, nccl-tests' way; spaced: each call after a barrier, timed alone, "
                         "the slowest rank's time, median of 20 (10 from 64M), as users time a call in their loop; "
                         "both (default): both tables from the same processes")
    ap.add_argument("--dirty-mb", type=float, default=0.0,
                    help="spaced timing: write a buffer of this many MiB before each call (other work between "
                         "calls, as a training step's compute between its buckets); default 0")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    try:
        worlds = [int(w) for w in a.worlds.split(",")]
        bad = [s for s in a.sizes.split(",") if s not in SIZES] + [c for c in a.colls.split(",") if c not in COLLS]
    except ValueError:
        ap.error("--worlds takes integers, e.g. 2,4,8")
    if bad or any(w < 2 for w in worlds) or a.rounds < 1 or a.loop_ms <= 0:
        ap.error(f"--sizes from {','.join(SIZES)}; --colls from {','.join(COLLS)}; --worlds >= 2; "
                 f"--rounds >= 1; --loop-ms > 0 (got {','.join(bad) or 'bad numbers'})")
    if a.worker:
        return worker(a)
    if shutil.which("mpirun") is None:
        raise SystemExit("mpirun not found: install Open MPI (apt-get install openmpi-bin libopenmpi-dev)")

    if a.nice:
        print(f"# ranks run at niceness {a.nice}")
    print(f"# {os.cpu_count()} CPUs; float32 sum; time = max over ranks of (loop of back-to-back ops / iters), "
          f"median of {a.rounds} rounds")
    print("# MPI/x = Open MPI's time / x's time (>= 1: x as fast as Open MPI or faster); busbw in GB/s")
    print("# gloo = the ws-torch calls on a torch group of gloo, torch's own CPU backend")
    print("# torch floor = the same torch call on torch's C++ 'fake' backend (moves nothing): torch's own cost")
    hdr = (f"{'collective':<14} {'ranks':>5} {'size':>5} | {'ws-native':>10} {'ws-torch':>10} {'Open MPI':>10} "
           f"{'gloo':>10} {'torch floor':>11} | {'bw native':>9} {'bw MPI':>7} | {'MPI/native':>10} {'MPI/torch':>9} "
           f"{'MPI/gloo':>8} {'MPI/floor':>9}")
    rows = []
    bound_sizes = [l for l in a.sizes.split(",") if SIZES[l] >= BOUND_FROM] if "all_reduce" in a.colls.split(",") else []
    cores = os.cpu_count()
    for w in worlds:
        print(f"# {w} ranks: {load()} at the start", flush=True)
        # Each size's working set and that of one rank's piece (S/n, what a reduce-scatter/all-gather
        # copies per peer): pieces may stay in a cache that the whole buffer does not fit.
        copy_sizes = sorted({SIZES[l] for l in bound_sizes} | {SIZES[l] // w for l in bound_sizes})
        bws = copy_bandwidths(copy_sizes) if bound_sizes else {}
        if bws:
            print(f"# copy bandwidth here, now, one process copying, best of 5 and of 256K/1M/4M/whole pieces, in place or "
                  f"to scratch "
                  f"(last-level cache: {llc_size()}): "
                  + "; ".join(f"{fmt_bytes(n)}: memcpy {bws[n][0] / 1e9:.2f} GB/s, process_vm_readv "
                              f"{bws[n][1] / 1e9:.2f} GB/s ({fmt_bytes(bws[n][2])} pieces{'' if bws[n][3] else ' to scratch'})"
                              for n in copy_sizes), flush=True)
        res = run_world(w, a)
        for key, title in (("median", "loop: back-to-back calls, time / calls, median of rounds"),
                           ("spaced", "spaced: each call after a barrier"
                            + (f" and {a.dirty_mb:g} MiB written" if a.dirty_mb > 0 else "")
                            + ", the slowest rank's time, median of 20 calls (10 from 64M), median of rounds")):
            if a.timing not in (key if key == "spaced" else "loop", "both"):
                continue
            print(f"# {title}")
            print(hdr)
            for coll in a.colls.split(","):
                for label in a.sizes.split(","):
                    nbytes = SIZES[label]
                    r = res[f"{coll}|{nbytes}"]
                    nat, tor, mpi, glo = (r[i][key] for i in IMPLS)
                    floor = r[FLOOR][key] if FLOOR in r else None
                    f = busbw_factor(coll, w)
                    print(f"{coll:<14} {w:>5} {label:>5} | {fmt(nat):>10} {fmt(tor):>10} {fmt(mpi):>10} {fmt(glo):>10} "
                          f"{fmt(floor) if floor else 'n/a':>11} | "
                          f"{nbytes / nat * f / 1e9:9.2f} {nbytes / mpi * f / 1e9:7.2f} | {mpi / nat:10.2f} "
                          f"{mpi / tor:9.2f} {mpi / glo:8.2f} {f'{mpi / floor:9.2f}' if floor else 'n/a':>9}",
                          flush=True)
        for coll in a.colls.split(","):
            for label in a.sizes.split(","):
                r = res[f"{coll}|{SIZES[label]}"]
                rows.append(dict(collective=coll, ranks=w, bytes=SIZES[label], **{i: r[i] for i in r}))
        if bws and a.timing != "spaced":
            print(f"# all_reduce against the copy bound: busbw <= min(ranks, cores) x C / ranks, C = the faster "
                  f"process_vm_readv GB/s of the size S and of the piece S/ranks ({cores} cores; reduction, latency "
                  f"and copies slowing each other ignored); share = busbw / bound")
            for l in bound_sizes:
                nbytes = SIZES[l]
                copy_bw = max(bws[nbytes][1], bws[nbytes // w][1])
                bound = allreduce_copy_bound(w, cores, copy_bw)
                r = res[f"all_reduce|{nbytes}"]
                cells, over = [], []
                for impl, name in (("ws-native", "ws-native"), ("ws-torch", "ws-torch"), ("mpi", "Open MPI"),
                                   ("gloo", "gloo")):
                    bw = nbytes / r[impl]["median"] * busbw_factor("all_reduce", w)
                    cells.append(f"{name} {bw / 1e9:5.2f} GB/s = {bw / bound:4.2f}")
                    if bw > bound:
                        over.append(name)
                print(f"all_reduce {w:>5} {l:>5} | C {copy_bw / 1e9:5.2f} bound {bound / 1e9:5.2f} GB/s | "
                      + " | ".join(cells)
                      + (f" | ABOVE THE BOUND ({', '.join(over)}): an assumption of the bound fails here" if over else ""),
                      flush=True)
                rows.append(dict(collective="all_reduce", ranks=w, bytes=nbytes, cores=cores, bound=bound,
                                 copy_bw=copy_bw,
                                 copy={n: bws[n][:2] for n in (nbytes, nbytes // w)}))
        print(f"# {w} ranks: {load()} at the end", flush=True)
    print("# raw: " + json.dumps(rows))


if __name__ == "__main__":
    main()
