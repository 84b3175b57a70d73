"""Execute a plan for real: one process per rank, each running only its own thread blocks.

`Machine` (interpret.py) holds the ops' meaning; `ProcessMachine` keeps it and moves the places
where ranks meet out of the process:

Memory. Each rank's arena (input, output and scratch, aliased as layout.py lays them out) is a
file in /dev/shm named after the job, the size's epoch and the rank, so concurrent jobs and the
sizes of one sweep never meet. Ranks on one host map each other's files, so memory channels (put,
get, the reductions that read or write a peer) and switch channels (glres, gstore: the group's
arenas read and written directly) work on the peer's memory itself. A file is unlinked as soon as
every peer has mapped it: a killed job leaves nothing behind. Data are float32 words; an LL
packet's flag, the odd word of each pair, is written and read as a uint32 holding the run number
(never reset within an epoch, so a flag of an earlier run never reads as this run's).

Signals. Behind the arena, one 8-byte counter per incoming memory and port channel, counting the
signals ever sent to it. Each has a single writer: the owner of the paired channel (memory), or
this rank's receiver thread for the sending rank (port). A writer keeps its own count and stores
the new total with one aligned 8-byte store; a waiter compares the counter with the signals it has
taken. Memory ordering (x86-64 only, which is checked): under x86-TSO a core's stores become
visible to others in the order it issued them, and loads are not reordered with older loads. The
data an op writes (numpy copies, separate C calls the compiler cannot move across) are issued
before the counter store, so a waiter that reads the new count and then reads the data sees it.
LL packets follow the same argument with the flags in the role of the counter: a writer stores
every data word of a range before any of its flags, a reader checks every flag before it reads.

Port channels go over wirespeed's own engine (`_native.Group`). The engine runs a group's ops in
order and a receive blocks its group until a message comes, so a group in which a rank both sends
and receives could stall its own sends behind a receive that waits for them. Each ordered pair
(s, r) that a port channel joins therefore has a group of its own, in which s only sends and r
only receives (one per pair, not per sender, so puts to different peers cross side by side):
rank s's proxy sends a 40-byte header (kind, epoch, where, words, run) and, for a put, the words
in pieces of at most 1 MiB, each behind a header of its own; one receiver thread per sending
rank receives headers in order and writes a put's words into the arena (straight from the wire, or data then flags for packets) before it bumps
the channel's counter for a signal, so a signal sent after a put is seen after its data (the
engine's completion of the receive orders the words, whichever of its threads wrote them, before
the receiver thread's later counter store; x86 stores are seen in one order by all cores). The
proxy reads a put's source when it runs (as MSCCL++'s proxy does), into buffers the engine
keeps until the receiver took them; `flush` waits for the proxy's queue, which empties each round.

Thread blocks run cooperatively in one Python thread, round-robin as Machine.run does; a round
in which nothing could move sleeps, 10 us growing to 1 ms, so oversubscribed ranks leave each
other the cores. No progress within the timeout is a PeerTimeout naming the op that waits.
Semaphores and barriers stay Machine's own: they never leave a rank.
"""
from __future__ import annotations

import hashlib
import mmap
import os
import platform
import secrets
import threading
import time
from collections import deque
from datetime import timedelta

import numpy as np

from ..errors import PeerLost, PeerTimeout, UsageError
from .format import Plan, PlanError
from .interpret import Machine, Thread, Token
from .layout import WORD, Layout, Span

SHM_DIR = "/dev/shm"
TAG = 0x57535050           # "WSPP": the port-channel messages' tag
PUT, PUT_PACKETS, SIGNAL, FIN = 1, 2, 3, 4
HEADER = 5                 # uint64 words: kind, epoch, where (word or channel), words, run
# Port groups wait on their peers without a limit of their own: the executor's and the bench
# watchdog's timeouts bound every wait, and a receiver idles between the sizes of a sweep.
PORT_GROUP_TIMEOUT_S = 7 * 24 * 3600.0
IDLE_FIRST_S, IDLE_MOST_S = 10e-6, 1e-3
# A put crosses in pieces of at most this many words (1 MiB): each piece's copy overlaps the
# wire time of the ones before it; larger pieces hide less, smaller ones pay more per-message
# cost (two engine sends and two receiver wake-ups each, tens of us in Python).
PIECE_WORDS = (1 << 20) // 4
# TCP streams per port-channel pair, unless WIRESPEED_NSTREAMS says otherwise. The engine's
# default (12) is for one group carrying a whole collective over a link whose flows are capped
# one by one; a plan has a group per pair already, and a piece (1 MiB) is two of the engine's
# 512 KiB chunks, so 2 streams carry every piece whole. With 12, each stream may hold up to
# tcp_limit_output_bytes (4 MiB here) in the host's egress queue: on the emulated cluster (a
# 2.5 MB queue per link) 4-host runs dropped 40-1,100 segments per 10 calls, and a loop caught
# a ~200 ms retransmission stall (alltoall 16 MiB on 4 hosts 256 ms a call; 2 streams 141 ms,
# no drops; benchmarks/README.md, plan_fidelity.py).
PORT_STREAMS = 2


def _counter_offset(arena_words: int) -> int:
    return -(-arena_words * WORD // 64) * 64


class Segment:
    """One rank's arena and signal counters in a shared-memory file."""

    def __init__(self, path: str, words: int, counters: int, create: bool):
        self.path = path
        size = _counter_offset(words) + 8 * max(1, counters)
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        try:
            fd = os.open(path, flags, 0o600)
        except OSError as e:
            raise UsageError(f"cannot {'create' if create else 'open'} the plan's shared memory {path}: "
                             f"{e.strerror}") from None
        try:
            if create:
                # Reserved, not just sized: a tmpfs that runs out would otherwise kill the rank with
                # SIGBUS at the first touch of a missing page. Zero-filled: no flag or counter set.
                try:
                    os.posix_fallocate(fd, 0, size)
                except OSError as e:
                    os.unlink(path)
                    raise UsageError(f"{path}: {size} bytes of shared memory for the rank's arena: {e.strerror} "
                                     f"(df {SHM_DIR}; use smaller sizes, -e)") from None
            elif os.fstat(fd).st_size < size:
                raise UsageError(f"{path} holds {os.fstat(fd).st_size} bytes, the plan needs {size}: "
                                 "the ranks disagree about the plan or the size")
            self.map = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self.f32 = np.frombuffer(self.map, dtype=np.float32, count=words)
        self.u32 = np.frombuffer(self.map, dtype=np.uint32, count=words)
        self.counters = np.frombuffer(self.map, dtype=np.uint64, count=max(1, counters),
                                      offset=_counter_offset(words))
        self.address = np.frombuffer(self.map, dtype=np.uint8, count=1).ctypes.data


def counter_index(plan: Plan, rank: int, ctype: str, channel: int) -> int:
    """Where the counter of `rank`'s incoming `ctype` channel lies: memory channels, then port."""
    return channel if ctype == "memory" else len(plan.ranks[rank].channels["memory"]) + channel


def n_counters(plan: Plan, rank: int) -> int:
    return len(plan.ranks[rank].channels["memory"]) + len(plan.ranks[rank].channels["port"])


def port_knobs() -> dict[str, str]:
    """The core knobs of a port group, given to it as data: PORT_STREAMS streams (the engine reads
    it at setup and in the rank's fd room, on every rank alike) unless the user set
    WIRESPEED_NSTREAMS (rendezvous's knob_defaults)."""
    return {"WIRESPEED_NSTREAMS": str(PORT_STREAMS)}


class Target:
    """What a receiver thread writes into for one epoch: a rank's segment."""

    def __init__(self, plan: Plan, rank: int, seg: Segment):
        self.plan, self.rank, self.seg = plan, rank, seg


class PortLinks:
    """The job's port-channel traffic over native groups, one group per (sender, receiver) pair
    that a port channel joins: the sender only sends there, the receiver only receives.

    One group per pair, not one per sender: the engine runs a group's ops one after another, so
    a sender's puts to different peers in one group would cross the wire one peer at a time (an
    alltoall on 4 hosts ran 2.8x its wire time, every rank sending to the same peer first). Per
    pair they run side by side, as a NIC carries RDMA writes on different queue pairs."""

    def __init__(self, plan: Plan, rank: int, store, token: str):
        from ..native.rendezvous import rendezvous
        import torch.distributed as dist
        self.rank = rank
        self.targets: dict[int, Target] = {}
        self.lock = threading.Lock()
        # Set by a receiver after it wrote a counter or flags: the executor's idle wait ends at
        # once rather than at the end of its sleep (a port round trip is two such waits).
        self.wake = threading.Event()
        self.error: BaseException | None = None
        self.out: dict[int, object] = {}            # peer rank -> the group rank sends to it in
        self.sends: dict[int, deque] = {}           # peer rank -> ids of sends not yet seen complete
        self.inbound = []                           # (group, thread) per sending rank
        # Every rank meets its pairs in one global order (sender, then receiver), so no two
        # ranks wait on each other's rendezvous crosswise.
        for s, r in enumerate(plan.ranks):
            for p in sorted({ch.peer for ch in r.channels["port"] if not ch.implicit}):
                if rank not in (s, p):
                    continue
                sub = dist.PrefixStore(f"wirespeed-plan/{token}/port/{s}/{p}/", store)
                g = rendezvous(sub, 0 if rank == s else 1, 2, timedelta(seconds=PORT_GROUP_TIMEOUT_S),
                               knob_defaults=port_knobs())
                if s == rank:
                    self.out[p] = g
                    self.sends[p] = deque()
                else:
                    th = threading.Thread(target=self._receive, args=(g, s), daemon=True,
                                          name=f"wirespeed-plan-rx{s}")
                    self.inbound.append((g, th))
                    th.start()

    # ---- sending (the proxies, in the executor's thread) ----
    def send(self, peer: int, header: list[int], payload: np.ndarray | None = None, stride: int = 1) -> None:
        """A header, and for a put its words in pieces of at most PIECE_WORDS, each piece a
        message of its own (a put header for its share), so the proxy's copy of one piece, the
        wire and the receiver's write of the pieces before it overlap. `stride`: destination
        words per payload word (2 for LL packets, whose flags travel in the header's run)."""
        g, sends = self.out[peer], self.sends[peer]
        n = 0 if payload is None else payload.size
        first = 0
        while True:
            k = min(n - first, PIECE_WORDS)
            msg = np.empty(HEADER * 8 + k * WORD, dtype=np.uint8)
            h = list(header)
            if n:
                h[2], h[3] = header[2] + first * stride, k
            msg[:HEADER * 8].view(np.uint64)[:] = h
            if k:
                # The source, read now: the copy is the proxy's own, so a plan that overwrites a
                # put's source before its flush (tests/plans show such plans exist; the checker
                # warns of them) still sends what the put meant. It costs one memory copy per
                # byte, which the pieces hide behind the wire.
                msg[HEADER * 8:].view(np.float32)[:] = payload[first:first + k]
            ptr = msg.ctypes.data
            sends.append(g.send(1, (ptr, HEADER * 8), TAG, msg))
            if k:
                sends.append(g.send(1, (ptr + HEADER * 8, k * WORD), TAG, msg))
            first += k
            if first >= n:
                return

    def reap(self) -> None:
        """Forget completed sends, raising the error of one that failed."""
        for peer, sends in self.sends.items():
            g = self.out[peer]
            while sends and g.is_done(sends[0]):
                g.wait(sends.popleft())
        if self.error is not None:
            raise self.error

    # ---- receiving ----
    def _receive(self, g, sender: int) -> None:
        hdr = np.zeros(HEADER, dtype=np.uint64)
        hp = hdr.ctypes.data
        count: dict[tuple, int] = {}
        try:
            while True:
                g.recv(0, (hp, HEADER * 8), TAG, hdr, True)
                kind, epoch, where, words, run = (int(x) for x in hdr)
                if kind == FIN:
                    return
                with self.lock:
                    tgt = self.targets.get(epoch)
                if kind == SIGNAL:
                    if tgt is not None:
                        i = counter_index(tgt.plan, self.rank, "port", where)
                        # This thread is the counter's only writer: its own count, one store.
                        n = count.get((epoch, i), 0) + 1
                        count[(epoch, i)] = n
                        tgt.seg.counters[i] = n
                        self.wake.set()
                    continue
                if not words:
                    continue   # an empty share of a thread-block group: no words were sent
                if kind == PUT and tgt is not None:
                    # Straight into the arena: the engine writes the words before recv returns.
                    g.recv(0, (tgt.seg.address + where * WORD, words * WORD), TAG, tgt, True)
                    continue
                tmp = np.empty(words, dtype=np.float32)
                g.recv(0, (tmp.ctypes.data, words * WORD), TAG, tmp, True)
                if kind == PUT_PACKETS and tgt is not None:
                    tgt.seg.f32[where:where + 2 * words:2] = tmp          # data first,
                    tgt.seg.u32[where + 1:where + 2 * words:2] = run      # then the flags
                    self.wake.set()
        except BaseException as e:  # noqa: BLE001 (handed to the executor's thread, which raises it)
            self.error = e if isinstance(e, Exception) else PeerLost(f"rank {self.rank}: {e}")
            self.wake.set()

    def close(self) -> None:
        """End every receiver (a FIN after each sender's last message), then the groups."""
        fin = np.array([FIN, 0, 0, 0, 0], dtype=np.uint64)
        for peer, g in self.out.items():
            self.sends[peer].append(g.send(1, (fin.ctypes.data, HEADER * 8), TAG, fin))
        for g, th in self.inbound:
            th.join(timeout=30)
        for peer, g in self.out.items():
            for sid in self.sends[peer]:
                g.wait(sid)
            self.sends[peer].clear()
        for g, th in self.inbound:
            if not th.is_alive():
                g.close()
        for g in self.out.values():
            g.close()


class ProcessMachine(Machine):
    """One rank's side of a plan at one size: its thread blocks, over shared memory and ports."""

    def __init__(self, plan: Plan, layout: Layout, rank: int, segs: list, links: PortLinks | None,
                 epoch: int, timeout_s: float):
        # data=False: Machine would allocate every rank's arena; ours are the mapped segments.
        super().__init__(plan, layout, runs=1, data=False)
        self.data = True
        self.rank, self.segs, self.links, self.epoch = rank, segs, links, epoch
        self.timeout_s = timeout_s
        self.mem = [s.f32 if s is not None else None for s in segs]
        self.u32 = [s.u32 if s is not None else None for s in segs]
        self.posted: dict[tuple, int] = {}     # signals this rank sent into a peer's counter
        self.taken: dict[tuple, int] = {}      # signals this rank's waits consumed
        self.my_proxies = [p for (r, _), p in self.proxies.items() if r == rank]
        self.done = False

    # ---- one run ----
    def start_run(self, rank: int) -> None:
        # The harness has written the input already, in the arena itself. Threads are not kept
        # in self.threads (Machine's list for the race detector), which would grow every run.
        run = self.current_run[rank] + 1
        self.current_run[rank] = run
        for tb, steps in enumerate(self.steps[rank]):
            self.live.append(Thread(-1, "tb", rank, tb, run, steps))
        self.done = not self.steps[rank]

    def finish_run(self, rank: int, ended) -> None:
        self.done = True

    def execute_once(self) -> None:
        """Run this rank's thread blocks once, to their end."""
        self.start_run(self.rank)
        idle = IDLE_FIRST_S
        moved_at = time.monotonic()
        while not self.done:
            moved = False
            for t in list(self.live):
                while t.pc < len(t.steps) and self.step(t):
                    moved = True
                for p in self.my_proxies:
                    while p.queue:
                        self.proxy_step(p)
            if moved:
                idle, moved_at = IDLE_FIRST_S, time.monotonic()
                continue
            if self.links is not None and self.links.error is not None:
                raise self.links.error
            if time.monotonic() - moved_at > self.timeout_s:
                self.timed_out()
            if self.links is not None:
                self.links.wake.wait(idle)
                self.links.wake.clear()
            else:
                time.sleep(idle)
            idle = min(idle * 2, IDLE_MOST_S)
        if self.links is not None:
            self.links.reap()

    def timed_out(self):
        raise PeerTimeout(f"rank {self.rank}: plan {self.plan.name!r}: no progress for {self.timeout_s:g} s: "
                          + self.waiting(3))

    # ---- memory ----
    def load(self, t, span: Span, where) -> np.ndarray:
        m = self.mem[span.rank]
        return m[span.start:span.end:2] if span.packets else m[span.start:span.end]

    def store(self, t, span: Span, values, where, flag: int = 0) -> None:
        m = self.mem[span.rank]
        if span.packets:
            m[span.start:span.end:2] = values               # data first,
            self.u32[span.rank][span.start + 1:span.end:2] = flag  # then the flags
        else:
            m[span.start:span.end] = values

    def packets_ready(self, t, span: Span) -> bool:
        return bool((self.u32[span.rank][span.start + 1:span.end:2] == t.run).all())

    def write_packets(self, t, span, tok, run=None) -> None:
        pass   # the flags in memory are the record

    # ---- signals ----
    def pending_signals(self, key: tuple) -> int:
        rank, ctype, c = key
        got = int(self.segs[rank].counters[counter_index(self.plan, rank, ctype, c)])
        return got - self.taken.get(key, 0)

    def take_signal(self, key: tuple) -> Token:
        self.taken[key] = self.taken.get(key, 0) + 1
        return Token(None, None)

    def post_signal(self, key: tuple, tok: Token) -> None:
        # A memory channel's signal: this rank is the counter's only writer (module docstring).
        rank, ctype, c = key
        n = self.posted.get(key, 0) + 1
        self.posted[key] = n
        self.segs[rank].counters[counter_index(self.plan, rank, ctype, c)] = n

    # ---- port channels ----
    def proxy_step(self, p: Thread) -> None:
        kind, _, arg = p.queue.popleft()
        ch = self.plan.ranks[p.rank].channels["port"][p.tb]
        if kind == "signal":
            self.links.send(ch.peer, [SIGNAL, self.epoch, ch.pair, 0, 0])
            return
        s, d, op, packets, run = arg
        vals = self.load(p, s, op.where)
        self.links.send(ch.peer, [PUT_PACKETS if packets else PUT, self.epoch, d.start, d.words, run], vals,
                        stride=2 if packets else 1)


def host_key() -> str:
    """This rank's host as the native engine sees it (WIRESPEED_HOSTID, --host-per-rank)."""
    from .. import _native
    return hashlib.sha1(_native.host_id().encode()).hexdigest()[:16]


def cross_host_channel(plan: Plan, hosts: list[str]) -> str | None:
    """The first memory or switch channel between ranks on different hosts, as an error line."""
    for r in plan.ranks:
        for ch in r.channels["memory"]:
            if not ch.implicit and hosts[ch.peer] != hosts[r.id]:
                return (f"{plan.source}: rank {r.id}'s memory channel {ch.number} leads to rank {ch.peer} "
                        "on another host: memory channels need shared memory; the plan needs a port "
                        "channel there")
        for sw in r.switches:
            far = [p for p in sw.ranks if hosts[p] != hosts[r.id]]
            if far:
                return (f"{plan.source}: rank {r.id}'s switch channel over ranks {list(sw.ranks)} spans "
                        f"hosts (rank {far[0]} is on another): switch channels need shared memory")
    return None


class PlanJob:
    """One rank's executor of a plan across a job: set up once (`begin`), then per size a
    ProcessMachine over fresh segments (`prepare`), run as often as asked."""

    def __init__(self, plan: Plan, timeout_s: float):
        self.plan, self.timeout_s = plan, timeout_s
        self.links: PortLinks | None = None
        self.machine: ProcessMachine | None = None
        self.epoch = 0

    def begin(self, comm, rank: int, world: int, store) -> None:
        """`comm`: barrier() and allgather_text(str) over the job (the bench backend)."""
        plan = self.plan
        if world != plan.nranks:
            raise UsageError(f"{plan.source}: the plan is for {plan.nranks} ranks, the job has {world}: "
                             f"run it with -N {plan.nranks}")
        if platform.machine().lower() not in ("x86_64", "amd64"):
            raise UsageError(f"plans run on x86-64 only (their shared-memory signals rely on its store "
                             f"order); this is {platform.machine()}")
        self.comm, self.rank = comm, rank
        self.hosts = comm.allgather_text(host_key())
        bad = cross_host_channel(plan, self.hosts)
        if bad:
            raise UsageError(bad)
        self.token = comm.allgather_text(secrets.token_hex(8) if rank == 0 else "")[0]
        if any(ch for r in plan.ranks for ch in r.channels["port"] if not ch.implicit):
            self.links = PortLinks(plan, rank, store, self.token)

    def prepare(self, size: int) -> ProcessMachine:
        """Segments for `size` bytes, every same-host peer's mapped, and a machine over them."""
        self.release()
        self.epoch += 1
        plan, rank = self.plan, self.rank
        layout = Layout(plan, size)
        name = f"{SHM_DIR}/wirespeed-plan-{self.token}-{self.epoch}-r"
        mine = Segment(name + str(rank), layout.arena[rank], n_counters(plan, rank), create=True)
        try:
            if self.links is not None:
                with self.links.lock:
                    self.links.targets[self.epoch] = Target(plan, rank, mine)
            self.comm.barrier()
            segs = [mine if r == rank else
                    Segment(name + str(r), layout.arena[r], n_counters(plan, r), create=False)
                    if self.hosts[r] == self.hosts[rank] else None for r in range(plan.nranks)]
            self.comm.barrier()
        finally:
            os.unlink(mine.path)   # every peer has it mapped (or failed): nothing is left behind
        self.machine = ProcessMachine(plan, layout, rank, segs, self.links, self.epoch, self.timeout_s)
        return self.machine

    def release(self) -> None:
        if self.links is not None:
            with self.links.lock:
                self.links.targets.pop(self.epoch, None)
        self.machine = None

    def close(self) -> None:
        self.release()
        if self.links is not None:
            self.links.close()
            self.links = None


__all__ = ["PlanJob", "ProcessMachine", "PlanError"]
