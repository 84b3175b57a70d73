"""Run a plan's thread blocks in one process, one operation at a time, deterministically.

`Machine` is the executor's semantics without a GPU (docs/plans.md gives each op's meaning): every
thread block of every rank is a thread with a program counter; each port channel has a proxy
thread that carries out its puts and signals in order, as MSCCL++'s proxy service does; each rank
has a host thread that writes its input before a run and reads its output after. A round-robin
scheduler runs any thread whose next op can run; an op that must wait (a `wait` with no signal
pending, packets whose flags are not yet this run's, a semaphore at zero, a barrier not full, a
`flush` with puts still queued) leaves its thread blocked and has no effect. When no thread can
move and some have not finished, that is a deadlock, and every blocked op is named.

Why one schedule is enough: a wait is satisfied by the signals sent to its channel, counted, so
the k-th wait on a channel pairs with the k-th signal in every legal schedule; the same holds for
a semaphore with one releaser, barrier generations and packet flags. So the synchronisation
structure, and with it whether the plan deadlocks, is the same in every schedule; what can differ
is the data, and that is the race detector's job (hazards.py), which reasons over the
happens-before order these pairings give, not over this schedule's timing.

`runs` executions follow each other per rank, as a benchmark loop runs them: a rank starts run
k+1 when its own thread blocks have finished run k (stream order), never waiting for its peers,
so a plan whose last writes into a peer are not fenced by a final signal/wait races with the
peer's next run, and the checker says so.

Data mode (`data=True`) moves real values through numpy arenas (layout.py); without it only the
synchronisation and each op's spans are kept, which is what the simulator needs at sizes whose
data would not fit.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from .format import Op, Plan, PlanError
from .layout import Layout, Span

PACKET_OPS = {"ppkt", "rppkt", "respkt", "repkt", "recpkt", "recspkt", "cpkt", "upkt", "gstorepkt"}
WINDOWED = {"put", "pws", "pwsf", "get", "copy", "re", "res", "rre", "rres", "glres", "gstore"}


class Deadlock(PlanError):
    """No thread can move and some have not finished."""


@dataclass
class Token:
    """What one thread hands another through a sync: its happens-before clocks and its virtual time."""

    vc: np.ndarray | None
    vis: np.ndarray | None
    time: float = 0.0
    # What a relaxed edge carries instead of `vis`: what the sender saw when its run started.
    # Data written before a kernel starts is visible to everything ordered after the start (a
    # kernel boundary fences), so a relaxed signal does order that data, and only that.
    base: np.ndarray | None = None
    relaxed: bool = False


@dataclass(eq=False)   # a thread is itself: compared by identity (removing one from `live` is quick)
class Thread:
    tid: int
    kind: str            # "tb" | "proxy" | "host"
    rank: int
    tb: int = -1
    run: int = 0
    steps: list = field(default_factory=list)   # (op, offset, unit) with pipelines unrolled
    pc: int = 0
    now: float = 0.0
    vc: np.ndarray | None = None
    vis: np.ndarray | None = None
    queue: deque = field(default_factory=deque)  # proxy: its pending tasks
    blocked_on: str = ""
    barrier: tuple | None = None
    start_vis: np.ndarray | None = None
    # A thread block's ops are not ordered across its GPU threads unless a `nop`
    # (__syncthreads) or barrier separates them: `seg_start` is the clock of the first op after
    # the last such point, and `pending` what a wait (done by a few threads) taught the block,
    # which the rest of its threads know only after the next sync point.
    seg_start: int = 1 << 62
    pending: tuple | None = None
    # The latest of the block's own ops known finished through another thread (a packet that
    # came back, a signal chain): ordered before what the block does next, nop or not.
    self_known: int = 0
    # The thread blocks of its rank's run, when the Machine made them together (start_run): the
    # run ends when the last of them does.
    mates: list | None = None

    def label(self) -> str:
        if self.kind == "tb":
            return f"rank {self.rank}, tb {self.tb}"
        if self.kind == "proxy":
            return f"rank {self.rank}'s port-channel proxy {self.tb}"
        return f"rank {self.rank}'s host"


def unroll(plan: Plan, layout: Layout, rank: int, ops: list[Op]) -> list:
    """A thread block's ops as steps: a pipeline becomes its body repeated over the chunk in
    units of unit_size bytes (the executor's iteration count)."""
    steps = []
    for op in ops:
        if op.name != "pipeline":
            steps.append((op, 0, None))
            continue
        total = op.pipeline_chunks * layout.chunk[rank]
        rounds = -(-total // op.unit_size)
        for i in range(rounds):
            for inner in op.inner:
                steps.append((inner, i * op.unit_size, op.unit_size if inner.name in WINDOWED else None))
    return steps


def op_count(plan: Plan, layout: Layout) -> int:
    """The steps `unroll` makes of every thread block of the plan at this layout's size, counted
    without making them."""
    n = 0
    for r in plan.ranks:
        for ops in r.threadblocks:
            for op in ops:
                if op.name == "pipeline":
                    rounds = -(-op.pipeline_chunks * layout.chunk[r.id] // op.unit_size)
                    n += rounds * len(op.inner)
                else:
                    n += 1
    return n


def thread_count(plan: Plan, runs: int) -> int:
    """An upper bound of the threads a Machine makes (the length of its vector clocks): every
    thread block of every run, each rank's host, each port channel's proxy."""
    return plan.nranks * (runs * (max((len(r.threadblocks) for r in plan.ranks), default=0) + 2)) \
        + sum(len(r.channels["port"]) for r in plan.ranks)


class Machine:
    """A plan at one size, its threads, memory and synchronisation state. `observer` (hazards.py)
    sees every access and sync; `timing` (simulate.py) prices every op."""

    def __init__(self, plan: Plan, layout: Layout, runs: int = 1, data: bool = True,
                 observer=None, timing=None, inputs=None):
        self.plan, self.layout, self.runs, self.data = plan, layout, runs, data
        self.observer, self.timing = observer, timing
        self.inputs = inputs          # callable(rank, run, words) -> values for the input buffer
        self.mem = [np.zeros(n) for n in layout.arena] if data else None
        self.signals: dict[tuple, deque] = {}      # (rank, type, channel) -> tokens
        self.sems = [[Semaphore(v) for v in r.semaphores] for r in plan.ranks]
        self.barriers: dict[tuple, list] = {}      # (rank, id) -> [generation, arrived tokens]
        self.barrier_done: dict[tuple, Token] = {}
        self.packets: list[list] = [[] for _ in plan.ranks]   # per rank: [start, end, run, token]
        self.threads: list[Thread] = []
        self.proxies: dict[tuple, Thread] = {}
        self.current_run = [0] * plan.nranks
        self.results: list[dict] = []              # per (rank, run): the output the host read
        self.steps = [[unroll(plan, layout, r.id, ops) for ops in r.threadblocks] for r in plan.ranks]
        self.n_threads = thread_count(plan, runs)
        for r in plan.ranks:
            for ch in r.channels["port"]:
                self.proxies[(r.id, ch.number)] = self._thread("proxy", r.id, tb=ch.number)
        self.hosts = [self._thread("host", r.id) for r in plan.ranks]
        self.live: list[Thread] = []
        self.left: dict[tuple, int] = {}       # (rank, run) -> its thread blocks not yet finished

    # ---- threads ----
    def _thread(self, kind, rank, tb=-1, run=0, steps=None) -> Thread:
        t = Thread(len(self.threads), kind, rank, tb, run, steps or [])
        if self.observer is not None:
            t.vc = np.zeros(self.n_threads, dtype=np.int64)
            t.vis = np.zeros(self.n_threads, dtype=np.int64)
            t.vc[t.tid] = t.vis[t.tid] = 1
        self.threads.append(t)
        return t

    def token(self, t: Thread, delay: float = 0.0, inclusive: bool = False) -> Token:
        """A snapshot of `t` for a thread it synchronises with. A thread block's signal carries
        only what its threads finished by the last sync point (`inclusive`: the current op too,
        for the packets it writes, whose flags travel with their data); a sequential thread
        (proxy, host) moves on to a new epoch."""
        tok = Token(None, None, t.now + delay)
        if t.vc is not None:
            tok.vc, tok.vis = t.vc.copy(), t.vis.copy()
            if t.kind == "tb" and not inclusive:
                tok.vc[t.tid] = tok.vis[t.tid] = t.seg_start - 1
            tok.base = t.start_vis if t.start_vis is not None else tok.vis
            if t.kind != "tb":
                t.vc[t.tid] += 1
                t.vis[t.tid] += 1
        return tok

    def join(self, t: Thread, tok: Token, relaxed: bool = False, deferred: bool = False) -> None:
        """`t` learns `tok`. `deferred`: learnt by the few GPU threads that waited, so the block
        as a whole knows it only from its next sync point."""
        t.now = max(t.now, tok.time)
        if t.vc is not None and tok.vc is not None:
            # A relaxed edge (either end relaxed) orders execution; of the data written before
            # it, only what was there when the sender's run started is known to be visible.
            vis = tok.base if (relaxed or tok.relaxed) else tok.vis
            if deferred and t.kind == "tb":
                if t.pending is None:
                    t.pending = (tok.vc.copy(), vis.copy())
                else:
                    np.maximum(t.pending[0], tok.vc, out=t.pending[0])
                    np.maximum(t.pending[1], vis, out=t.pending[1])
                return
            t.self_known = max(t.self_known, int(tok.vc[t.tid]))
            np.maximum(t.vc, tok.vc, out=t.vc)
            np.maximum(t.vis, vis, out=t.vis)

    def sync_point(self, t: Thread) -> None:
        """A `nop` or barrier: every GPU thread of the block has finished the ops before it and
        knows what any of them learnt."""
        if t.vc is not None:
            t.seg_start = int(t.vc[t.tid]) + 1
            if t.pending is not None:
                np.maximum(t.vc, t.pending[0], out=t.vc)
                np.maximum(t.vis, t.pending[1], out=t.vis)
                t.pending = None

    # ---- runs ----
    def start_run(self, rank: int) -> None:
        run = self.current_run[rank] + 1
        self.current_run[rank] = run
        host = self.hosts[rank]
        host.run = run
        if self.data:
            span = Span(rank, self.layout.base[rank]["input"], self.layout.words[rank]["input"])
            self.access(host, span, write=True, where=f"rank {rank}'s input, written before run {run}")
            self.mem[rank][span.start:span.end] = self.inputs(rank, run, span.words)
        tok = self.token(host)
        mates: list[Thread] = []
        self.left[(rank, run)] = len(self.steps[rank])
        for tb, steps in enumerate(self.steps[rank]):
            t = self._thread("tb", rank, tb, run, steps)
            t.mates = mates
            mates.append(t)
            self.join(t, tok)
            if t.vis is not None:
                t.start_vis = t.vis.copy()
                t.seg_start = int(t.vc[t.tid]) + 1
            self.live.append(t)
        if not self.steps[rank]:
            self.finish_run(rank, [])

    def finish_run(self, rank: int, ended: list[Thread]) -> None:
        host = self.hosts[rank]
        for t in ended:
            self.join(host, self.token(t, inclusive=True))
        run = self.current_run[rank]
        out = None
        if self.data:
            span = Span(rank, self.layout.base[rank]["output"], self.layout.words[rank]["output"])
            self.access(host, span, write=False, where=f"rank {rank}'s output, read after run {run}")
            out = self.mem[rank][span.start:span.end].copy()
        self.results.append({"rank": rank, "run": run, "output": out, "time": host.now})
        if run < self.runs:
            self.start_run(rank)

    def run(self) -> None:
        for r in self.plan.ranks:
            self.start_run(r.id)
        while True:
            moved = False
            for t in self.order(list(self.live)):
                if self.step(t):
                    moved = True
            for p in self.proxies.values():
                while p.queue:
                    self.proxy_step(p)
                    moved = True
            if not self.live:
                return
            if not moved:
                self.deadlock()

    def order(self, threads: list[Thread]) -> list[Thread]:
        """The order one scheduler round tries the live threads in (a simulator orders by
        virtual time); any order gives the same synchronisation (see the module's docstring)."""
        return threads

    def waiting(self, most: int) -> str:
        """The live threads' blocked ops and what each waits for, the first `most` of them."""
        lines = [f"{t.steps[t.pc][0].where} (run {t.run}) waits for {t.blocked_on or 'its turn'}"
                 for t in self.live]
        more = f" (and {len(lines) - most} more)" if len(lines) > most else ""
        return "; ".join(lines[:most]) + more

    def deadlock(self):
        raise Deadlock(f"{self.plan.source}: deadlock: no thread block can move: {self.waiting(6)}"
                       + self.unbalanced())

    def unbalanced(self) -> str:
        """Channels whose signals per run do not match their pair's waits (the usual cause)."""
        sent: dict[tuple, int] = {}
        waited: dict[tuple, int] = {}
        for r, tbs in enumerate(self.steps):
            for steps in tbs:
                for op, _, _ in steps:
                    n = op.name
                    for c in op.channels:
                        if n in ("signal", "rlxsignal", "pws", "pwsf"):
                            ch = self.plan.ranks[r].channels[op.channel_type][c]
                            key = (ch.peer, op.channel_type, ch.pair)
                            sent[key] = sent.get(key, 0) + 1
                        elif n in ("wait", "rlxwait"):
                            key = (r, op.channel_type, c)
                            waited[key] = waited.get(key, 0) + 1
        out = []
        for key in sorted(set(waited) | set(sent)):
            if waited.get(key, 0) > sent.get(key, 0):
                r, ctype, c = key
                peer = self.plan.ranks[r].channels[ctype][c].peer
                out.append(f"rank {r} waits {waited[key]} time(s) per run on {ctype} channel {c}, "
                           f"rank {peer} signals it {sent.get(key, 0)} time(s)")
        return (". Unbalanced: " + "; ".join(out[:4])) if out else ""

    # ---- one step ----
    def step(self, t: Thread) -> bool:
        """Run `t`'s next op if it can run; False (nothing changed) when it must wait."""
        op, offset, unit = t.steps[t.pc]
        if not self.ready(t, op):
            return False
        t.blocked_on = ""
        if t.vc is not None:
            t.vc[t.tid] += 1      # each op of a block is its own epoch: see Thread.seg_start
            t.vis[t.tid] += 1
        self.execute(t, op, offset, unit)
        t.pc += 1
        if t.pc == len(t.steps):
            self.sync_point(t)    # a kernel's end: every GPU thread of the block is done
            self.live.remove(t)
            rank = t.rank
            if t.mates is not None:
                # Counted, not searched for: a scan of every live thread per finished block made
                # a 20,000-rank plan take minutes.
                self.left[(rank, t.run)] -= 1
                if not self.left[(rank, t.run)]:
                    del self.left[(rank, t.run)]
                    self.finish_run(rank, t.mates)
            elif not any(x.rank == rank and x.kind == "tb" for x in self.live):
                ended = [x for x in self.threads if x.kind == "tb" and x.rank == rank and x.run == t.run]
                self.finish_run(rank, ended)
        return True

    def ready(self, t: Thread, op: Op) -> bool:
        n = op.name
        if n in ("wait", "rlxwait"):
            need: dict[int, int] = {}   # a channel listed twice waits for two signals
            for c in op.channels:
                need[c] = need.get(c, 0) + 1
                if self.pending_signals((t.rank, op.channel_type, c)) < need[c]:
                    ch = self.plan.ranks[t.rank].channels[op.channel_type][c]
                    t.blocked_on = f"a signal from rank {ch.peer} on {op.channel_type} channel {c}"
                    return False
            return True
        if n == "flush":
            for c in op.channels:
                if self.proxies[(t.rank, c)].queue:
                    t.blocked_on = f"port channel {c}'s proxy"
                    return False
            return True
        if n == "sem_acquire":
            need = {}
            for s in op.semaphores:
                need[s] = need.get(s, 0) + 1
                if len(self.sems[t.rank][s]) < need[s]:
                    t.blocked_on = f"a release of semaphore {s}"
                    return False
            return True
        if n == "barrier":
            key = (t.rank, op.barrier_id)
            state = self.barriers.setdefault(key, [0, []])
            if t.barrier is None:
                t.barrier = (key, state[0])
                self.sync_point(t)     # the barrier syncs the block's own threads first
                state[1].append(self.token(t, inclusive=True))
                if len(state[1]) == op.barrier_count:
                    done = Token(None, None, 0.0)
                    for tok in state[1]:
                        done = _merge(done, tok)
                    self.barrier_done[(key, state[0])] = done
                    state[0] += 1
                    state[1] = []
            if (t.barrier) in self.barrier_done:
                return True
            t.blocked_on = f"{op.barrier_count} thread blocks of rank {t.rank} at barrier {op.barrier_id}"
            return False
        for span in self.packet_reads(t, op):
            if not self.packets_ready(t, span):
                t.blocked_on = (f"packets (this run's flag) in words {span.start}..{span.end - 1} of rank "
                                f"{span.rank}'s memory that no op has written yet")
                return False
        return True

    # ---- packets ----
    def packet_reads(self, t: Thread, op: Op) -> list[Span]:
        """The packet ranges `op` reads, each of which must carry this run's flag first."""
        n = op.name
        if n in ("rppkt", "upkt"):      # the executor reads these from scratch, whatever the type says
            return [self.pspan(t, op, op.src[0], force_scratch=True)]
        if n == "gstorepkt" or (n == "ppkt" and op.channel_type == "port"):
            return [self.pspan(t, op, op.src[0])]
        if n in ("respkt", "repkt", "recpkt", "recspkt"):
            return [self.pspan(t, op, ref, force_scratch=True, size_of=op.src[0]) for ref in op.src[1:]]
        return []

    def packets_ready(self, t: Thread, span: Span) -> bool:
        covered, pos, toks = True, span.start, []
        recs = sorted((r for r in self.packets[span.rank] if r[2] == t.run and r[0] < span.end and r[1] > span.start),
                      key=lambda r: r[0])
        for s, e, _, tok in recs:
            if s > pos:
                covered = False
                break
            pos = max(pos, e)
            toks.append(tok)
        if pos < span.end:
            covered = False
        if covered:
            # A flag orders the read after its packet's write; it makes only that packet's data
            # visible (hazards.py exempts the packet words), so the edge is a relaxed one.
            for tok in toks:
                self.join(t, tok, relaxed=True)
        return covered

    def write_packets(self, t: Thread, span: Span, tok: Token, run: int | None = None) -> None:
        """Packets of run `run` (default: the writer's) now lie in `span`; `tok` is what a reader
        of them learns (a packet read is ordered after the write that set its flag)."""
        recs = self.packets[span.rank]
        # A newer write of a range replaces older records of it (keeps the list short).
        recs[:] = [r for r in recs if not (r[0] >= span.start and r[1] <= span.end)]
        recs.append([span.start, span.end, t.run if run is None else run, tok])

    def pspan(self, t, op, ref, force_scratch=False, size_of=None, owner=None):
        """The packet range of `ref` as the executor addresses it: doubled offsets, plus the run's
        scratch half when the executor adds it."""
        if force_scratch and ref.buffer != "scratch":
            from dataclasses import replace
            ref = replace(ref, buffer="scratch")
        if size_of is not None and size_of.count != ref.count:
            from dataclasses import replace
            ref = replace(ref, count=size_of.count)
        owner = ref.rank if owner is None else owner
        # The executor adds its own run's scratch half, to remote addresses too.
        so = self.layout.scratch_offset(t.rank, t.run) if ref.buffer == "scratch" else 0
        return self.layout.span(t.rank, ref, op.tbg, owner=owner, packets=True, scratch_offset=so, where=op.where)

    # ---- memory ----
    def span(self, t, op, ref, offset=0, unit=None, scratch_half=True):
        so = 0
        if ref.buffer == "scratch" and ref.via == "local" and scratch_half:
            so = self.layout.scratch_offset(t.rank, t.run)
        return self.layout.span(t.rank, ref, op.tbg, offset, unit, owner=ref.rank, scratch_offset=so, where=op.where)

    def access(self, t: Thread, span: Span, write: bool, where: str) -> None:
        if self.observer is not None and span is not None:
            self.observer.access(t, span, write, where)

    def load(self, t, span: Span, where) -> np.ndarray:
        self.access(t, span, False, where)   # packet spans: read after waiting on their flags
        if not self.data:
            return None
        m = self.mem[span.rank]
        if span.packets:
            return m[span.start:span.end:2].copy()
        return m[span.start:span.end].copy()

    def store(self, t, span: Span, values, where, flag: int = 0) -> None:
        if not self.data:
            self.access(t, span, True, where)
            return
        m = self.mem[span.rank]
        # Storing exactly what is there already (a multicast that includes its own sender, a
        # packet re-sent with the same flag) cannot change what any reader sees, in any order:
        # it is not a conflicting write.
        if span.packets:
            same = np.array_equal(m[span.start:span.end:2], values) and bool(np.all(m[span.start + 1:span.end:2] == flag))
        else:
            same = np.array_equal(m[span.start:span.end], values)
        if not same:
            self.access(t, span, True, where)
        if span.packets:
            m[span.start:span.end:2] = values
            m[span.start + 1:span.end:2] = flag
        else:
            m[span.start:span.end] = values

    # ---- the ops ----
    def execute(self, t: Thread, op: Op, offset: int, unit) -> None:
        n = op.name
        w = op.where
        cost = self.timing.op(self, t, op, offset, unit) if self.timing else 0.0
        t.now += cost
        if n in ("nop",):
            self.sync_point(t)
            return
        if n == "barrier":
            self.sync_point(t)
            self.join(t, self.barrier_done[t.barrier])
            t.barrier = None
            return
        if n in ("signal", "rlxsignal"):
            for c in op.channels:
                self.signal(t, op.channel_type, c, relaxed=n == "rlxsignal")
            return
        if n in ("wait", "rlxwait"):
            for c in op.channels:
                self.join(t, self.take_signal((t.rank, op.channel_type, c)), relaxed=n == "rlxwait",
                          deferred=True)
            return
        if n == "flush":
            for c in op.channels:
                self.join(t, self.token(self.proxies[(t.rank, c)]), deferred=True)
            return
        if n == "sem_release":
            for s in op.semaphores:
                self.sems[t.rank][s].append(self.token(t))
            return
        if n == "sem_acquire":
            for s in op.semaphores:
                self.join(t, self.sems[t.rank][s].popleft(), deferred=True)
            return
        if n in ("put", "pws", "pwsf"):
            if op.channel_type == "port":
                for i, dst in enumerate(op.dst):
                    c = op.channels[i] if i < len(op.channels) else None
                    self.port_put(t, op, op.src[i], dst, c, offset, unit, packets=False)
                    if n in ("pws", "pwsf"):
                        self.signal(t, "port", c)
                if n == "pwsf":
                    for c in set(op.channels):
                        self.flush_now(t, c)
                return
            for i, dst in enumerate(op.dst):
                s = self.span(t, op, op.src[i], offset, unit)
                d = self.span(t, op, dst, offset, unit, scratch_half=False)
                if s is None or d is None:
                    continue
                self.store(t, d, self.load(t, s, w), w)
            if n in ("pws", "pwsf"):
                for c in op.channels:
                    self.signal(t, "memory", c)
            return
        if n == "get":
            for i, src in enumerate(op.src):
                s = self.span(t, op, src, offset, unit, scratch_half=False)
                d = self.span(t, op, op.dst[i], offset, unit)
                if s is None or d is None:
                    continue
                self.store(t, d, self.load(t, s, w), w)
            return
        if n == "copy":
            s = self.span(t, op, op.src[0], offset, unit)
            d = self.span(t, op, op.dst[0], offset, unit)
            if s is not None and d is not None:
                self.store(t, d, self.load(t, s, w), w)
            return
        if n in ("re", "res", "rre", "rres"):
            spans = [self.span(t, op, ref, offset, unit, scratch_half=ref.via == "local") for ref in op.src]
            if spans[0] is None:
                return
            acc = self.load(t, spans[0], w)
            for s in spans[1:]:
                v = self.load(t, s, w)
                if self.data:
                    acc = acc + v
            for dst in op.dst if n in ("res", "rres") else op.dst[:1]:
                d = self.span(t, op, dst, offset, unit, scratch_half=dst.via == "local")
                self.store(t, d, acc, w)
            return
        if n == "cpkt":
            s = self.span(t, op, op.src[0])
            d = self.pspan(t, op, op.dst[0])
            self.store(t, d, self.load(t, s, w), w, flag=t.run)
            self.write_packets(t, d, self.token(t, inclusive=True))
            return
        if n == "upkt":
            s = self.pspan(t, op, op.src[0], force_scratch=True)
            d = self.span(t, op, op.dst[0])
            self.store(t, d, self.load(t, s, w), w)
            return
        if n == "ppkt":
            if op.channel_type == "port":
                for i, dst in enumerate(op.dst):
                    self.port_put(t, op, op.src[i], dst, op.channels[i] if i < len(op.channels) else None,
                                  0, None, packets=True)
                return
            for i, dst in enumerate(op.dst):
                s = self.span(t, op, op.src[i])
                d = self.pspan(t, op, dst, owner=dst.rank)
                self.store(t, d, self.load(t, s, w), w, flag=t.run)
                self.write_packets(t, d, self.token(t, inclusive=True))
            return
        if n == "rppkt":
            s = self.pspan(t, op, op.src[0], force_scratch=True)
            vals = self.load(t, s, w)
            if op.channel_type == "port":
                for i, dst in enumerate(op.dst):
                    self.port_put(t, op, op.src[0], dst, op.channels[i] if i < len(op.channels) else None,
                                  0, None, packets=True)
                return
            for dst in op.dst:
                d = self.pspan(t, op, dst, owner=dst.rank)
                self.store(t, d, vals, w, flag=t.run)
                self.write_packets(t, d, self.token(t, inclusive=True))
            return
        if n in ("respkt", "repkt", "recpkt", "recspkt"):
            src0 = self.span(t, op, op.src[0])
            acc = self.load(t, src0, w)
            for ref in op.src[1:]:
                v = self.load(t, self.pspan(t, op, ref, force_scratch=True, size_of=op.src[0]), w)
                if self.data:
                    acc = acc + v
            self.store(t, self.span(t, op, op.dst[0]), acc, w)
            remote = op.dst[1:]
            if n in ("recpkt", "recspkt"):
                d = self.pspan(t, op, op.dst[1], size_of=op.src[0])
                self.store(t, d, acc, w, flag=t.run)
                self.write_packets(t, d, self.token(t, inclusive=True))
                remote = op.dst[2:]
            if n in ("respkt", "recspkt"):
                for dst in remote:
                    d = self.pspan(t, op, dst, force_scratch=True, size_of=op.src[0], owner=dst.rank)
                    self.store(t, d, acc, w, flag=t.run)
                    self.write_packets(t, d, self.token(t, inclusive=True))
            return
        if n == "glres":
            group = op.src[0].group
            acc = None
            for r in group:
                s = self.layout.span(t.rank, op.src[0], op.tbg, offset, unit, owner=r, where=w)
                if s is None:
                    return
                v = self.load(t, s, w)
                acc = v if acc is None or not self.data else acc + v
            for r in op.dst[0].group:
                d = self.layout.span(t.rank, op.dst[0], op.tbg, offset, unit, owner=r, where=w)
                self.store(t, d, acc, w)
            return
        if n == "gstore":
            s = self.span(t, op, op.src[0], offset, unit)
            if s is None:
                return
            vals = self.load(t, s, w)
            for r in op.dst[0].group:
                self.store(t, self.layout.span(t.rank, op.dst[0], op.tbg, offset, unit, owner=r, where=w), vals, w)
            return
        if n == "gstorepkt":
            s = self.pspan(t, op, op.src[0])
            vals = self.load(t, s, w)
            for r in op.dst[0].group:
                so = self.layout.scratch_offset(r, t.run) if op.dst[0].buffer == "scratch" else 0
                d = self.layout.span(t.rank, op.dst[0], op.tbg, owner=r, packets=True, scratch_offset=so, where=w)
                self.store(t, d, vals, w, flag=t.run)
                self.write_packets(t, d, self.token(t, inclusive=True))
            return
        raise PlanError(f"{w}: wirespeed reads this op but cannot run it yet")  # pragma: no cover

    # ---- channels ----
    def signal(self, t: Thread, ctype: str, c: int, relaxed: bool = False) -> None:
        ch = self.plan.ranks[t.rank].channels[ctype][c]
        if ctype == "port":
            self.proxies[(t.rank, c)].queue.append(("signal", self.token(t), (ch, t.run)))
            return
        tok = self.token(t, delay=self.timing.signal_latency(self, t.rank, ch) if self.timing else 0.0)
        tok.relaxed = relaxed   # orders execution, not the data written in the run before it
        self.post_signal((ch.peer, ctype, ch.pair), tok)

    # The three places where signals cross between threads: a multi-process executor
    # (execute.py) replaces them with counters in shared memory and messages.
    def pending_signals(self, key: tuple) -> int:
        """Signals sent to channel `key` = (rank, type, channel) and not yet waited for."""
        return len(self.signals.get(key, ()))

    def take_signal(self, key: tuple) -> Token:
        return self.signals[key].popleft()

    def post_signal(self, key: tuple, tok: Token) -> None:
        self.signals.setdefault(key, deque()).append(tok)

    def port_put(self, t, op, src_ref, dst_ref, c, offset, unit, packets) -> None:
        if c is None:
            raise PlanError(f"{op.where}: a port-channel put needs a channel per destination")
        ch = self.plan.ranks[t.rank].channels["port"][c]
        if dst_ref.rank != ch.peer:
            raise BufferMisuse(f"{op.where}: puts into rank {dst_ref.rank}'s {dst_ref.buffer} through port "
                               f"channel {c}, which leads to rank {ch.peer}")
        if packets:
            s = self.pspan(t, op, src_ref)
            d = self.pspan(t, op, dst_ref, force_scratch=True, owner=dst_ref.rank)
        else:
            s = self.span(t, op, src_ref, offset, unit, scratch_half=False)
            d = self.span(t, op, dst_ref, offset, unit, scratch_half=False)
        if s is None or d is None:
            return
        self.proxies[(t.rank, c)].queue.append(("put", self.token(t), (s, d, op, packets, t.run)))

    def proxy_step(self, p: Thread) -> None:
        kind, tok, arg = p.queue.popleft()
        self.join(p, tok)
        p.run = arg[-1]       # the run of the block that queued it (put and signal both end with it)
        if self.timing:
            p.now += self.timing.proxy(self, p, kind, arg)
        if kind == "signal":
            ch = arg[0]
            out = self.token(p, delay=self.timing.signal_latency(self, p.rank, ch) if self.timing else 0.0)
            self.post_signal((ch.peer, "port", ch.pair), out)
            return
        s, d, op, packets, run = arg
        if packets:
            vals = self.load(p, s, op.where)
            self.store(p, d, vals, op.where, flag=run)
            self.write_packets(p, d, self.token(p), run=run)
        else:
            self.store(p, d, self.load(p, s, op.where), op.where)

    def flush_now(self, t: Thread, c: int) -> None:
        p = self.proxies[(t.rank, c)]
        while p.queue:
            self.proxy_step(p)
        self.join(t, self.token(p), deferred=True)


class Semaphore(deque):
    """A semaphore's releases, as tokens to acquire in order: first its initial value's worth of
    tokens that order nothing (counted, not made: a plan may start one at 2**32 - 1), then the
    tokens of the sem_release ops, each what its releaser knew."""

    def __init__(self, value: int):
        super().__init__()
        self.initial = value

    def __len__(self) -> int:
        return self.initial + super().__len__()

    def __bool__(self) -> bool:
        return len(self) > 0

    def __getitem__(self, i: int) -> Token:
        if i < self.initial:
            return Token(None, None)
        return super().__getitem__(i - self.initial)

    def popleft(self) -> Token:
        if self.initial:
            self.initial -= 1
            return Token(None, None)
        return super().popleft()


class BufferMisuse(PlanError):
    """An op reaches a buffer its channel cannot: a put through a channel to one rank into another's."""


def _merge(a: Token, b: Token) -> Token:
    if b.vc is None:
        return Token(a.vc, a.vis, max(a.time, b.time))
    if a.vc is None:
        return Token(b.vc.copy(), b.vis.copy(), max(a.time, b.time))
    return Token(np.maximum(a.vc, b.vc), np.maximum(a.vis, b.vis), max(a.time, b.time))
