"""`wirespeed plan simulate`: a plan's time per message size on a described machine.

The interpreter (interpret.py) already runs every thread block and port-channel proxy and carries
a virtual time in every synchronisation token; this module prices each op (`Timing`) and runs the
threads in virtual-time order (`SimMachine`), so a link, NIC or switch port is granted to
transfers first come, first served in virtual time, and contention shows. docs/plans-simulate.md
gives the model and where it stops being right. In short:

- a thread block pays `op` seconds to issue each op, then moves its bytes: each transfer queues
  on every resource on its path (a memory channel's ordered pair, the ranks' fabric ports, a
  NIC each way, a switch port, a rank's local memory), first come first served in virtual time,
  and ends when the last of them has carried it; an op's transfers to different peers run side
  by side;
- latency: a reader pays it (get, rre, glres); a writer's data arrives that much later, so the
  signal after a put, or the packets an LL write leaves, reach the peer a latency later;
- a port-channel put costs its thread block only the issue: the channel's proxy moves the bytes,
  one task after another, over the NICs (or over the memory path when both ranks share a host);
- LL packets are 8 bytes on the wire per 4 of data;
- with `cores`, ranks beyond the machine's cores slow their CPU work (issue, copies) by their
  share; with `proxy-copy`, a proxy copies a put's source in pieces before the wire carries them.
"""
from __future__ import annotations

import heapq
from collections import defaultdict
from dataclasses import dataclass, field

from .format import MAX_MESSAGE_BYTES, Plan, PlanError
from .interpret import Machine, Thread, op_count
from .layout import Layout, Span, smallest_size
from .topology import GB, Topology

# busbw = algbw x this factor (nccl-tests' doc/PERFORMANCE.md), the same factors as
# bench/collectives/*.py's busbw_factor (tests/plans/test_simulate.py checks they agree). Kept
# here so `plan simulate` does not import torch, which those modules need for their buffers.
BUSBW_FACTOR = {
    "allreduce": lambda n: 2 * (n - 1) / n,
    "allgather": lambda n: (n - 1) / n,
    "reducescatter": lambda n: (n - 1) / n,
    "alltoall": lambda n: (n - 1) / n,
    "sendrecv": lambda n: 1.0,
    "broadcast": lambda n: 1.0,
}

SYNC_OPS = {"nop", "barrier", "signal", "rlxsignal", "wait", "rlxwait", "flush", "sem_acquire", "sem_release"}


def busbw_factor(plan: Plan) -> float | None:
    f = BUSBW_FACTOR.get(plan.collective)
    return f(plan.nranks) if f else None


def default_sizes() -> list[int]:
    """1 KiB to 1 GiB by x4."""
    return [1024 * 4 ** k for k in range(11)]


def fit_size(plan: Plan, size: int) -> int:
    """The size nearest `size` that the plan's chunks split into whole alignment units."""
    unit = smallest_size(plan)
    return max(1, round(size / unit)) * unit


class Timing:
    """Prices ops and proxy tasks on a topology; keeps when each resource is next free."""

    def __init__(self, topo: Topology, nranks: int = 1):
        self.topo = topo
        # Ranks that outnumber the machine's cores each get a share of one: their CPU work (an
        # op's issue, a local copy, a proxy's copy) takes this much longer.
        self.slow = topo.cpu_slowdown(nranks)
        self.op_cost = topo.op * self.slow
        self.copy_rate = topo.copy / self.slow
        self.free: dict[tuple, float] = defaultdict(float)    # resource -> when it is next free
        self.busy: dict[tuple, float] = defaultdict(float)    # resource -> seconds it carried bytes
        self.moved: dict[str, float] = defaultdict(float)     # resource kind -> bytes carried
        self.last_from: dict[tuple, tuple] = {}                # NIC in -> the NIC that last sent into it

    # ---- resources ----
    def reserve(self, path: tuple, nbytes: float, rate: float, t0: float, rates: dict | None = None) -> float:
        """Carry nbytes over every resource of `path`, each first come first served from t0 at
        `rate`; returns when the last of them is done. Each resource is queued on by itself
        rather than all held at once: holding them together leaves a resource idle while the
        transfer waits for another, and with many transfers in flight those gaps, not the
        bandwidth, would set the time (a 64 MiB 8-rank allreduce ran 4x slower for it).
        `rates`: a resource's own rate for this transfer, where it differs (port_fanin)."""
        if nbytes <= 0:
            return t0
        free, busy = self.free, self.busy
        dur = nbytes / rate
        end = t0
        for r in path:
            d = nbytes / rates[r] if rates and r in rates else dur
            e = max(t0, free[r]) + d
            free[r] = e
            busy[r] += d
            if e > end:
                end = e
        self.moved[path[0][0]] += nbytes
        return end

    def memory_path(self, src: int, dst: int) -> tuple[tuple, float]:
        """The resources a memory-channel transfer from rank src to rank dst queues on, and its rate."""
        t = self.topo
        if t.fabric:
            return (("memory", src, dst), ("fabric-out", src), ("fabric-in", dst)), min(t.memory.bandwidth, t.fabric)
        return (("memory", src, dst),), t.memory.bandwidth

    def port_path(self, src: int, dst: int) -> tuple[tuple, float]:
        """A port-channel transfer: over the two hosts' NICs, or the memory path within a host
        (MSCCL++'s proxy copies within a node with the GPU's copy engine, over NVLink)."""
        t = self.topo
        if t.host(src) == t.host(dst):
            return self.memory_path(src, dst)
        return (("nic-out",) + t.nic(src), ("nic-in",) + t.nic(dst)), t.port.bandwidth

    def fanin_rates(self, path: tuple, t0: float) -> dict | None:
        """With `port_fanin`: a transfer into a NIC that is still carrying another host's
        transfer when this one could start shares that link with it (in reality both flows run
        at once, here they queue) and both lose goodput to the incast, so it crosses the NIC at
        the fan-in rate. Traffic from the NIC that is already sending into it, or into an idle
        NIC, keeps the port rate."""
        fanin = self.topo.port_fanin
        if not fanin or path[0][0] != "nic-out":
            return None
        src, dst = path[0][1:], path[1]
        last = self.last_from.get(dst)
        self.last_from[dst] = src
        if last is not None and last != src and self.free[dst] > t0:
            return {dst: min(fanin, self.topo.port.bandwidth)}
        return None

    def arrival_latency(self, src: int, dst: int, via: str) -> float:
        """How long after a write from rank src ends it is visible on rank dst."""
        t = self.topo
        if src == dst:
            return 0.0
        if via == "switch":
            return t.switch.latency
        if via == "port" and t.host(src) != t.host(dst):
            return t.port.latency
        return t.memory.latency

    # ---- the interpreter's hooks ----
    def signal_latency(self, m: Machine, rank: int, ch) -> float:
        return self.arrival_latency(rank, ch.peer, ch.type)

    def proxy(self, m: Machine, p: Thread, kind: str, arg) -> float:
        if kind != "put":
            return 0.0      # a signal leaves after the puts before it (the proxy's order)
        s, d, op, packets, run = arg
        nbytes = s.words * 4 * (2 if packets else 1)
        path, rate = self.port_path(p.rank, d.rank)
        piece = self.topo.proxy_copy
        if not piece or nbytes <= 0:
            return self.reserve(path, nbytes, rate, p.now, self.fanin_rates(path, p.now)) - p.now
        # A copying proxy (wirespeed's executor): a piece leaves once copied, so the wire starts
        # after the first piece's copy, and the last piece leaves after all of the copying. The
        # source's words are copied (4 bytes each, packets' flags being added by the receiver).
        data = s.words * 4
        first = min(data, piece) / self.copy_rate
        all_copied = data / self.copy_rate
        last_wire = min(nbytes, piece) / rate
        start = p.now + first
        end = max(self.reserve(path, nbytes, rate, start, self.fanin_rates(path, start)),
                  p.now + all_copied + last_wire)
        return end - p.now

    def op(self, m: Machine, t: Thread, op, offset: int, unit) -> float:
        t0 = t.now + self.op_cost
        n = op.name
        if n in SYNC_OPS or (op.channel_type == "port" and n in ("put", "pws", "pwsf", "ppkt", "rppkt")):
            return self.op_cost      # no bytes here: the proxy moves a port channel's
        if n in ("glres", "gstore", "gstorepkt"):
            return self.switch_op(m, t, op, offset, unit, t0) - t.now
        reads, writes = op_spans(m, t, op, offset, unit)
        me = t.rank
        local = 0.0
        remote: dict[tuple, float] = defaultdict(float)   # (src, dst) -> bytes
        read_remote = False
        for spans, read in ((reads, True), (writes, False)):
            for s in spans:
                b = s.words * (8 if s.packets else 4)
                if s.rank == me:
                    local += b
                else:
                    # bytes flow from the rank that holds them to the one that gets them
                    remote[(s.rank, me) if read else (me, s.rank)] += b
                    read_remote |= read
        end = t0
        if local:
            # A copy reads and writes each byte: `copy` is bytes copied per second.
            end = max(end, self.reserve((("local", me),), local / 2, self.copy_rate, t0))
        for (src, dst), b in remote.items():
            path, rate = self.memory_path(src, dst)
            end = max(end, self.reserve(path, b, rate, t0))
        if read_remote:
            end += self.topo.memory.latency
        return end - t.now

    def switch_op(self, m: Machine, t: Thread, op, offset, unit, t0: float) -> float:
        """Multimem: a load-reduce reads the chunk from every member through its switch port and
        returns one copy to the issuer; a store sends one copy up and the switch writes it into
        every member. Each rank's port to the switch is a resource per direction."""
        lay, me, w = m.layout, t.rank, op.where
        rate = self.topo.switch.bandwidth
        if op.name == "glres":
            s = lay.span(me, op.src[0], op.tbg, offset, unit, owner=me, where=w)
            if s is None:
                return t0
            b = s.words * 4
            ups = list(op.src[0].group) + [me]          # members read, then the issuer's store
            downs = list(op.dst[0].group) + [me]        # the reduced copy back, then the stores
            latency = self.topo.switch.latency
        else:
            if op.name == "gstore":
                s = lay.span(me, op.src[0], op.tbg, offset, unit, owner=me, where=w)
                if s is None:
                    return t0
                b = s.words * 4
            else:
                s = m.pspan(t, op, op.src[0])
                b = s.words * 8
            ups, downs, latency = [me], list(op.dst[0].group), 0.0
        end = t0
        for r in ups:
            end = max(end, self.reserve((("switch-up", r),), b, rate, t0))
        for r in downs:
            end = max(end, self.reserve((("switch-down", r),), b, rate, t0))
        return end + latency


def op_spans(m: Machine, t: Thread, op, offset: int, unit) -> tuple[list[Span], list[Span]]:
    """The spans a thread block's op reads and writes, as Machine.execute computes them (port
    channels' puts and multimem ops aside: the proxy and switch_op price those)."""
    n = op.name
    reads: list[Span] = []
    writes: list[Span] = []
    if n in ("put", "pws", "pwsf"):
        for i, dst in enumerate(op.dst):
            s = m.span(t, op, op.src[i], offset, unit)
            d = m.span(t, op, dst, offset, unit, scratch_half=False)
            if s is not None and d is not None:
                reads.append(s)
                writes.append(d)
    elif n == "get":
        for i, src in enumerate(op.src):
            s = m.span(t, op, src, offset, unit, scratch_half=False)
            d = m.span(t, op, op.dst[i], offset, unit)
            if s is not None and d is not None:
                reads.append(s)
                writes.append(d)
    elif n == "copy":
        s = m.span(t, op, op.src[0], offset, unit)
        d = m.span(t, op, op.dst[0], offset, unit)
        if s is not None and d is not None:
            reads.append(s)
            writes.append(d)
    elif n in ("re", "res", "rre", "rres"):
        spans = [m.span(t, op, ref, offset, unit, scratch_half=ref.via == "local") for ref in op.src]
        if spans[0] is not None:
            reads.extend(spans)
            for dst in op.dst if n in ("res", "rres") else op.dst[:1]:
                writes.append(m.span(t, op, dst, offset, unit, scratch_half=dst.via == "local"))
    elif n == "cpkt":
        reads.append(m.span(t, op, op.src[0]))
        writes.append(m.pspan(t, op, op.dst[0]))
    elif n == "upkt":
        reads.append(m.pspan(t, op, op.src[0], force_scratch=True))
        writes.append(m.span(t, op, op.dst[0]))
    elif n == "ppkt":
        for i, dst in enumerate(op.dst):
            reads.append(m.span(t, op, op.src[i]))
            writes.append(m.pspan(t, op, dst, owner=dst.rank))
    elif n == "rppkt":
        reads.append(m.pspan(t, op, op.src[0], force_scratch=True))
        writes.extend(m.pspan(t, op, dst, owner=dst.rank) for dst in op.dst)
    elif n in ("respkt", "repkt", "recpkt", "recspkt"):
        reads.append(m.span(t, op, op.src[0]))
        reads.extend(m.pspan(t, op, ref, force_scratch=True, size_of=op.src[0]) for ref in op.src[1:])
        writes.append(m.span(t, op, op.dst[0]))
        remote = op.dst[1:]
        if n in ("recpkt", "recspkt"):
            writes.append(m.pspan(t, op, op.dst[1], size_of=op.src[0]))
            remote = op.dst[2:]
        if n in ("respkt", "recspkt"):
            writes.extend(m.pspan(t, op, dst, force_scratch=True, size_of=op.src[0], owner=dst.rank)
                          for dst in remote)
    return [s for s in reads if s is not None], [s for s in writes if s is not None]


class SimMachine(Machine):
    """The interpreter with a discrete-event scheduler: the thread (block or proxy) that can act
    earliest in virtual time acts next, so resources are granted in virtual-time order.

    A thread's key in the heap is a lower bound of when it next acts (its `now`); when it comes
    out ready, its true start (the latest token it will join) is computed and, if another thread
    could act earlier, it goes back in at that time. A thread that cannot act is parked on what it
    waits for and woken by it (a signal posted, packets written, a semaphore released, a barrier
    passed, a proxy drained), so a step costs a few heap operations, not a scan of every thread.
    Tokens are never earlier than the step that made them, so steps happen in time order."""

    def __init__(self, plan: Plan, layout: Layout, timing: Timing, runs: int = 1):
        self._heap: list = []
        self._seq = 0
        self._queued: set[int] = set()
        self._parked: dict[tuple, list[Thread]] = defaultdict(list)
        self._running = False
        self.steps_run = 0
        super().__init__(plan, layout, runs=runs, data=False, timing=timing)

    def start_run(self, rank: int) -> None:
        # A rank's next run (runs > 1) starts as its last ends, as a benchmark loop's calls do
        # (Machine.finish_run): its thread blocks join the heap at once.
        n = len(self.live)
        super().start_run(rank)
        if self._running:
            for t in self.live[n:]:
                self._push(t, t.now)

    # ---- the heap ----
    def _push(self, th: Thread, key: float) -> None:
        if th.tid in self._queued:
            return
        self._queued.add(th.tid)
        heapq.heappush(self._heap, (key, self._seq, th))
        self._seq += 1

    def _wake(self, key: tuple) -> None:
        waiting = self._parked.pop(key, None)
        if waiting:
            for th in waiting:
                self._push(th, th.now)

    def _push_proxy(self, p: Thread) -> None:
        if p.queue:
            self._push(p, max(p.now, p.queue[0][1].time))

    # ---- wake-ups: the interpreter's hand-over points ----
    def post_signal(self, key: tuple, tok) -> None:
        super().post_signal(key, tok)
        self._wake(("sig",) + key)

    def write_packets(self, t: Thread, span: Span, tok, run: int | None = None) -> None:
        # The packets reach their owner a latency after the write ends (the token is fresh,
        # made by the caller for this write alone, so moving its time touches nothing else).
        if t.kind == "proxy":
            via = "port"
        else:
            op = t.steps[t.pc][0]
            via = "switch" if op.name == "gstorepkt" else op.channel_type
        tok.time += self.timing.arrival_latency(t.rank, span.rank, via)
        super().write_packets(t, span, tok, run)
        self._wake(("pkt", span.rank))

    def port_put(self, t, op, src_ref, dst_ref, c, offset, unit, packets) -> None:
        super().port_put(t, op, src_ref, dst_ref, c, offset, unit, packets)
        if c is not None:
            self._push_proxy(self.proxies[(t.rank, c)])

    def signal(self, t: Thread, ctype: str, c: int, relaxed: bool = False) -> None:
        super().signal(t, ctype, c, relaxed)
        if ctype == "port":
            self._push_proxy(self.proxies[(t.rank, c)])

    # ---- the scheduler ----
    def _park(self, t: Thread, op) -> None:
        n, rank = op.name, t.rank
        key: tuple = ("any",)
        if n in ("wait", "rlxwait"):
            need: dict[int, int] = {}
            for c in op.channels:
                k = (rank, op.channel_type, c)
                need[c] = need.get(c, 0) + 1
                if self.pending_signals(k) < need[c]:
                    key = ("sig",) + k
                    break
        elif n == "flush":
            for c in op.channels:
                if self.proxies[(rank, c)].queue:
                    key = ("proxy", rank, c)
                    break
        elif n == "sem_acquire":
            key = ("sem", rank)
        elif n == "barrier":
            key = ("barrier", rank, op.barrier_id)
        else:
            spans = self.packet_reads(t, op)
            if spans:
                key = ("pkt", spans[0].rank)
        self._parked[key].append(t)

    def _start(self, t: Thread, op) -> float:
        """When a ready op really starts: after every token it will join."""
        n, rank, at = op.name, t.rank, t.now
        if n in ("wait", "rlxwait"):
            seen: dict[int, int] = {}
            for c in op.channels:
                i = seen.get(c, 0)
                seen[c] = i + 1
                at = max(at, self.signals[(rank, op.channel_type, c)][i].time)
        elif n == "sem_acquire":
            taken: dict[int, int] = {}
            for s in op.semaphores:
                i = taken.get(s, 0)
                taken[s] = i + 1
                at = max(at, self.sems[rank][s][i].time)
        elif n == "barrier":
            at = max(at, self.barrier_done[t.barrier].time)
        elif n == "flush":
            for c in op.channels:
                at = max(at, self.proxies[(rank, c)].now)
        return at

    def _after(self, t: Thread, op) -> None:
        n = op.name
        if n == "sem_release":
            self._wake(("sem", t.rank))
        elif n == "barrier":
            self._wake(("barrier", t.rank, op.barrier_id))
        elif n == "pwsf":
            for c in op.channels:
                self._wake(("proxy", t.rank, c))

    def run(self) -> None:
        for r in self.plan.ranks:
            self.start_run(r.id)
        for t in self.live:
            self._push(t, t.now)
        self._running = True
        heap, queued = self._heap, self._queued
        woke_all = False
        while True:
            while heap:
                _, _, th = heapq.heappop(heap)
                queued.discard(th.tid)
                if th.kind == "proxy":
                    if not th.queue:
                        continue      # drained meanwhile by a pwsf's flush
                    at = max(th.now, th.queue[0][1].time)
                    if heap and at > heap[0][0]:
                        self._push(th, at)
                        continue
                    self.proxy_step(th)
                    self.steps_run += 1
                    if th.queue:
                        self._push_proxy(th)
                    else:
                        self._wake(("proxy", th.rank, th.tb))
                    woke_all = False
                    continue
                # The block runs on while it is still the earliest (saves a heap round per op).
                while th.pc < len(th.steps):
                    op = th.steps[th.pc][0]
                    if not self.ready(th, op):
                        self._park(th, op)
                        break
                    at = self._start(th, op)
                    if heap and at > heap[0][0]:
                        self._push(th, at)
                        break
                    self.step(th)
                    self.steps_run += 1
                    woke_all = False
                    self._after(th, op)
            if not self.live:
                return
            if woke_all:
                self.deadlock()
            # Nothing queued yet threads live: a wake-up this scheduler missed would show here
            # as threads that can move after all; give every one a try before calling it a
            # deadlock (the interpreter's own verdict, with its names for what each waits on).
            woke_all = True
            self._parked.clear()
            for t in self.live:
                self._push(t, t.now)
            for p in self.proxies.values():
                self._push_proxy(p)


@dataclass
class SimResult:
    plan: Plan
    requested: int          # the size asked for
    size: int               # the size simulated (the nearest the plan's chunks allow)
    time: float             # seconds from every rank starting to the last rank finishing, per run
    factor: float | None
    steps: int = 0
    busiest: str = ""       # the resource that carried bytes longest, and for how much of the time
    moved: dict = field(default_factory=dict)
    runs: int = 1           # back-to-back runs simulated; time is their total / runs

    @property
    def algbw(self) -> float:
        return self.size / self.time / GB if self.time > 0 else float("inf")

    @property
    def busbw(self) -> float | None:
        return None if self.factor is None else self.algbw * self.factor

    def record(self, path: str) -> dict:
        return {"schema": "wirespeed.plan_simulate/1", "plan": path, "name": self.plan.name,
                "collective": self.plan.collective, "ranks": self.plan.nranks,
                "protocol": self.plan.protocol, "requested_size": self.requested, "size": self.size,
                "time_us": self.time * 1e6, "algbw_gbps": self.algbw, "busbw_gbps": self.busbw,
                "busbw_factor": self.factor, "busiest": self.busiest, "bytes_moved": self.moved,
                "steps": self.steps, "runs": self.runs}


# About 6 us per op on the development VM: 5 million ops is half a minute, and the unrolled
# steps' lists alone take a few hundred MB. Beyond it a size is refused rather than left to run.
MAX_STEPS = 5_000_000


def simulate(plan: Plan, topo: Topology, size: int, requested: int | None = None, runs: int = 1) -> SimResult:
    """Run the plan at `size` bytes on `topo`, every rank starting at time 0, `runs` times back
    to back per rank (a benchmark loop: each rank starts its next run when its own last one
    ends); the time is from the start to the last rank's last run ending, divided by `runs`."""
    if size > MAX_MESSAGE_BYTES:
        raise PlanError(f"{plan.source}: {size} bytes is more than {MAX_MESSAGE_BYTES} ({MAX_MESSAGE_BYTES >> 40} "
                        "TiB), the largest message wirespeed simulates (MAX_MESSAGE_BYTES)")
    layout = Layout(plan, size)
    ops = op_count(plan, layout) * runs
    if ops > MAX_STEPS:
        raise PlanError(f"{plan.source}: at {size} bytes{f' x {runs} runs' if runs > 1 else ''} the plan's "
                        f"pipelines unroll into {ops} ops, more "
                        f"than the {MAX_STEPS} the simulator runs in about half a minute: use smaller sizes")
    timing = Timing(topo, plan.nranks)
    m = SimMachine(plan, layout, timing, runs)
    m.run()
    end = max((r["time"] for r in m.results), default=0.0)
    busiest = ""
    if timing.busy and end > 0:
        res, busy = max(timing.busy.items(), key=lambda kv: kv[1])
        busiest = f"{_resource_name(res, min(topo.nics_per_host, topo.ranks_per_host))} {min(1.0, busy / end):.0%}"
    return SimResult(plan, requested or size, size, end / runs, busbw_factor(plan), m.steps_run, busiest,
                     dict(timing.moved), runs)


def _resource_name(res: tuple, nics: int = 1) -> str:
    kind = res[0]
    if kind == "memory":
        return f"memory {res[1]}->{res[2]}"
    if kind in ("nic-out", "nic-in"):
        return f"host {res[1]} NIC{f' {res[2]}' if nics > 1 else ''} {kind[4:]}"
    if kind in ("fabric-out", "fabric-in"):
        return f"rank {res[1]} fabric {kind[7:]}"
    if kind in ("switch-up", "switch-down"):
        return f"rank {res[1]} switch {kind[7:]}"
    return f"rank {res[1]} local copy"


def compare(plans: list[tuple[str, Plan]], topo: Topology, sizes: list[int], runs: int = 1) -> list[list[SimResult]]:
    """Per requested size, each plan's result (at the size nearest it that the plan allows)."""
    if len({(p.collective, p.nranks) for _, p in plans}) > 1:
        seen = ", ".join(f"{path}: {p.collective} on {p.nranks} ranks" for path, p in plans)
        raise PlanError(f"plans side by side must do one collective on one number of ranks ({seen})")
    return [[simulate(p, topo, fit_size(p, s), requested=s, runs=runs) for _, p in plans] for s in sizes]


def table(plans: list[tuple[str, Plan]], rows: list[list[SimResult]], topo: Topology) -> list[str]:
    """Per size: each plan's time and busbw, the fastest marked."""
    from ..sizes import human_bytes
    labels = [label for label, _ in plans]
    width = max(12, max(len(x) for x in labels))
    p0 = plans[0][1]
    out = [topo.describe(),
           f"{p0.collective} on {p0.nranks} ranks; busbw = algbw x {_factor_text(p0)} (nccl-tests); "
           "time from every rank starting to the last finishing"]
    notes = False
    for results in rows:
        req = results[0].requested
        out.append("")
        out.append(f"{human_bytes(req)} ({req} B)")
        out.append(f"  {'plan':<{width}}  {'time (us)':>12}  {'busbw (GB/s)':>12}  {'algbw (GB/s)':>12}  busiest")
        best = min(range(len(results)), key=lambda i: results[i].time)
        for i, r in enumerate(results):
            bus = f"{r.busbw:12.4g}" if r.busbw is not None else f"{'-':>12}"
            star = "*" if r.size != r.requested else " "
            notes = notes or star == "*"
            mark = "  <- fastest" if len(results) > 1 and i == best else ""
            note = f"  [at {r.size} B]" if star == "*" else ""
            if not r.plan.min_size <= r.size <= r.plan.max_size:
                # MSCCL++'s executor would not pick the plan for this size.
                note += f"  [outside the plan's message sizes {r.plan.min_size}..{r.plan.max_size}]"
            out.append(f"  {labels[i]:<{width}}{star} {r.time * 1e6:12.2f}  {bus}  {r.algbw:12.4g}  "
                       f"{r.busiest}{mark}{note}")
    if notes:
        out.append("")
        out.append("* simulated at the nearest size the plan's chunks split into whole alignment units "
                   "(a multiple of its smallest size), shown in brackets; bandwidths use that size")
    return out


def _factor_text(plan: Plan) -> str:
    f = busbw_factor(plan)
    return "-" if f is None else f"{f:.4g}"
