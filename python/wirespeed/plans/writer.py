"""A small builder for MSCCL++ execution plans (the JSON the MSCCL++ executor loads).

The plan format is index-heavy: a thread block names channels by its own local list, which
points into the rank's channel list, and names remote buffers by another local list, which
points into the rank's remote-buffer list. Getting those indices (and the pairing of channels
between two ranks) right by hand is where plans go wrong, so this module keeps all of it:
an algorithm says "put this chunk into rank 3's scratch slot 2 over a port channel" and the
builder finds or creates every list entry that needs.

    b = PlanBuilder("x", "allreduce", nranks=2)
    b.chunks(input=2, output=2, scratch=1)
    tb = b.threadblock(0)
    ch = b.channel(0, 1, "port")
    tb.put(I(0), Remote(1, "s", 0), ch, signal=True)
    plan = b.to_json()

Buffer references are chunk ranges: `I(index, size)`, `O(...)`, `S(...)` for this rank's
input, output and scratch, `Remote(peer, type, index, size)` for a peer's buffer.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

BUFFER_TYPES = ("i", "o", "s")
CHANNEL_TYPES = ("memory", "port")
COLLECTIVES = ("allreduce", "allgather", "reducescatter", "alltoall", "sendrecv", "test")
# Ops that move no data: the executor runs them on a few threads only, so a data op next to
# one of them needs a __syncthreads (a "nop") in between, see `_with_nops`.
SYNC_OPS = {"signal", "wait", "rlxsignal", "rlxwait", "flush", "sem_acquire", "sem_release"}
WAITING_OPS = {"wait", "rlxwait", "flush", "sem_acquire"}
NO_MAX = 2**64 - 1  # what MSCCL++ writes for "no upper bound" on the message size
# The executor's fixed-size tables (execution_common.hpp): a plan past them is refused when the
# executor sets it up (too many ops) or overruns a table (the rest), so the writer refuses it.
MAX_OPS_PER_BLOCK = 64  # nops and a pipeline's inner ops count
MAX_CHANNELS_PER_BLOCK = 16  # per channel type; the same for remote buffers per access type
MAX_CHANNELS_PER_OP = 8
MAX_REFS_PER_OP = 10  # 2 local buffers + 8 reached through channels
MAX_BARRIERS = 16
MAX_SEMAPHORES = 16


@dataclass(frozen=True)
class Local:
    """Chunks [index, index+size) of this rank's buffer `type` (i, o or s)."""
    type: str
    index: int
    size: int = 1

    def __post_init__(self):
        if self.type not in BUFFER_TYPES:
            raise ValueError(f"buffer type {self.type!r} is not one of {BUFFER_TYPES}")


def I(index: int, size: int = 1) -> Local:  # noqa: E743 (the format's own letter)
    return Local("i", index, size)


def O(index: int, size: int = 1) -> Local:  # noqa: E743
    return Local("o", index, size)


def S(index: int, size: int = 1) -> Local:
    return Local("s", index, size)


@dataclass(frozen=True)
class Remote:
    """Chunks [index, index+size) of buffer `type` on rank `peer`."""
    peer: int
    type: str
    index: int
    size: int = 1


@dataclass(frozen=True)
class Channel:
    """The k-th channel of `type` from `rank` to `peer`; `index` is its place in the rank's list
    of channels of that type. It pairs with the k-th channel of `peer` to `rank`."""
    rank: int
    peer: int
    type: str
    k: int
    index: int


class ThreadBlock:
    """One thread block of one rank: a list of ops, plus the local channel and remote-buffer
    lists those ops index into (built on first use)."""

    def __init__(self, builder: "PlanBuilder", rank: int, tb_id: int):
        self.b, self.rank, self.id = builder, rank, tb_id
        self.ops: list[dict] = []
        self._stack = [self.ops]  # pipeline bodies nest
        self._channels = {t: [] for t in CHANNEL_TYPES}  # rank-level channel indices
        self._rbufs = {t: [] for t in CHANNEL_TYPES}  # gpu remote_buffers ids, per access type

    # -- bookkeeping -------------------------------------------------------------------
    def _chan(self, ch: Channel) -> int:
        if ch.rank != self.rank:
            raise ValueError(f"channel of rank {ch.rank} used by a thread block of rank {self.rank}")
        lst = self._channels[ch.type]
        if ch.index not in lst:
            lst.append(ch.index)
        return lst.index(ch.index)

    def _ref(self, ref, access: str | None) -> dict:
        if isinstance(ref, Local):
            return {"type": ref.type, "index": ref.index, "size": ref.size}
        if not isinstance(ref, Remote):
            raise TypeError(f"not a buffer reference: {ref!r}")
        if access is None:
            raise ValueError("a remote buffer needs a channel type to reach it")
        if ref.peer == self.rank:
            raise ValueError("a remote reference to the rank itself; use I/O/S")
        gid = self.b._remote_buffer(self.rank, ref.peer, ref.type, access)
        lst = self._rbufs[access]
        if gid not in lst:
            lst.append(gid)
        return {"buffer_id": lst.index(gid), "index": ref.index, "size": ref.size}

    def _refs(self, refs, access=None) -> list[dict]:
        return [self._ref(r, access) for r in _as_list(refs)]

    def _emit(self, op: dict, tbg: tuple[int, int] | None = None) -> dict:
        if tbg is not None:
            op["tbg_info"] = {"tb_id": tbg[0], "tbg_size": tbg[1]}
        self._stack[-1].append(op)
        return op

    def _sync(self, name: str, channels) -> dict:
        chans = _as_list(channels)
        ctype = _one_type(chans)
        return self._emit({"name": name, "channel_ids": [self._chan(c) for c in chans], "channel_type": ctype})

    # -- synchronisation ---------------------------------------------------------------
    def nop(self):
        return self._emit({"name": "nop"})

    def barrier(self, barrier_id: int, num_threadblocks: int):
        """All `num_threadblocks` blocks of this rank that reach barrier `barrier_id` meet here."""
        return self._emit({"name": "barrier", "barrier_id": barrier_id, "num_threadblocks": num_threadblocks})

    def signal(self, channels, relaxed: bool = False):
        """Bump the peer's semaphore on each channel; `relaxed` skips the memory fence, so it
        only orders data that was in place before the kernel started."""
        return self._sync("rlxsignal" if relaxed else "signal", channels)

    def wait(self, channels, relaxed: bool = False):
        return self._sync("rlxwait" if relaxed else "wait", channels)

    def flush(self, channels):
        """Port channels: wait until the proxy has read every source put so far. (MSCCL++'s
        executor, at the version read, runs a standalone flush on no channel: it counts a
        flush's channels by its outputs. A put with flush=True, pwsf, does flush.)"""
        return self._sync("flush", channels)

    def sem_acquire(self, ids):
        return self._emit({"name": "sem_acquire", "semaphore_ids": _as_list(ids)})

    def sem_release(self, ids):
        return self._emit({"name": "sem_release", "semaphore_ids": _as_list(ids)})

    @contextmanager
    def pipeline(self, unit_size: int, num_chunks: int):
        """Ops added inside run repeatedly over `unit_size`-byte pieces of `num_chunks` chunks."""
        body: list[dict] = []
        self._emit({"name": "pipeline", "iter_context": {"unit_size": unit_size, "num_chunks": num_chunks},
                    "ops": body})
        self._stack.append(body)
        try:
            yield self
        finally:
            self._stack.pop()

    # -- data movement -----------------------------------------------------------------
    def put(self, src, dst, channels, signal: bool = False, flush: bool = False, tbg=None):
        """Copy local chunks into peers' buffers, one src per dst. Over memory channels the
        copy is done by this block (and `signal`/`flush` must be separate ops); over port
        channels a proxy does it, optionally followed by a signal (pws) and a flush (pwsf)."""
        srcs, dsts, chans = _as_list(src), _as_list(dst), _as_list(channels)
        _check_lengths(srcs, dsts, chans)
        ctype = _one_type(chans)
        _check_peers(dsts, chans)
        if ctype == "memory":
            if signal or flush:
                raise ValueError("memory-channel put has no signal/flush form: add signal() after it")
            return self._emit({"name": "put", "src_buff": self._refs(srcs), "dst_buff": self._refs(dsts, ctype),
                               "channel_type": ctype}, tbg)
        if flush and not signal:
            raise ValueError("the format has put+signal+flush but no put+flush")
        name = "pwsf" if flush else "pws" if signal else "put"
        return self._emit({"name": name, "src_buff": self._refs(srcs), "dst_buff": self._refs(dsts, ctype),
                           "channel_ids": [self._chan(c) for c in chans], "channel_type": ctype}, tbg)

    def get(self, src, dst, channels, tbg=None):
        """Copy peers' chunks (memory channels) into local chunks."""
        srcs, dsts, chans = _as_list(src), _as_list(dst), _as_list(channels)
        _check_lengths(dsts, srcs, chans)
        _check_peers(srcs, chans)
        return self._emit({"name": "get", "src_buff": self._refs(srcs, "memory"), "dst_buff": self._refs(dsts),
                           "channel_ids": [self._chan(c) for c in chans], "channel_type": "memory"}, tbg)

    def copy(self, src: Local, dst: Local, tbg=None):
        return self._emit({"name": "copy", "src_buff": self._refs(src), "dst_buff": self._refs(dst)}, tbg)

    def reduce(self, srcs, dst: Local, send_to=(), tbg=None):
        """dst = sum of local `srcs` (first one first); with `send_to`, the sum is also written
        into those peers' buffers over memory channels (res)."""
        send = _as_list(send_to)
        op = {"name": "res" if send else "re", "src_buff": self._refs(srcs),
              "dst_buff": self._refs([dst]) + self._refs(send, "memory")}
        if send:
            op["channel_type"] = "memory"
        op["reduce_op"] = "sum"
        return self._emit(op, tbg)

    def read_reduce(self, local: Local, remotes, dst: Local, send_to=(), tbg=None):
        """dst = local + the peers' chunks, read over memory channels (rre); with `send_to`
        the sum also goes into those peers' buffers (rres)."""
        send = _as_list(send_to)
        return self._emit({"name": "rres" if send else "rre",
                           "src_buff": self._refs([local]) + self._refs(remotes, "memory"),
                           "dst_buff": self._refs([dst]) + self._refs(send, "memory"),
                           "channel_type": "memory", "reduce_op": "sum"}, tbg)

    # -- LL packets: data travels with a flag, so the reader needs no signal ------------
    def put_packets(self, src, dst):
        """Write local chunks as packets into peers' scratch (memory channels), one src per dst."""
        srcs, dsts = _as_list(src), _as_list(dst)
        _check_lengths(srcs, dsts)
        _check_packet_dst(dsts)
        return self._emit({"name": "ppkt", "src_buff": self._refs(srcs), "dst_buff": self._refs(dsts, "memory"),
                           "channel_type": "memory"})

    def read_put_packets(self, src: Local, dst, channels=None):
        """Forward packets already in local scratch to peers' scratch once their flags are set;
        over port channels (pass `channels`) a proxy moves them."""
        dsts = _as_list(dst)
        _check_packet_dst(dsts)
        if channels is None:
            return self._emit({"name": "rppkt", "src_buff": self._refs(src), "dst_buff": self._refs(dsts, "memory"),
                               "channel_type": "memory"})
        chans = _as_list(channels)
        _check_lengths(dsts, chans)
        _check_peers(dsts, chans)
        ctype = _one_type(chans)
        return self._emit({"name": "rppkt", "src_buff": self._refs(src), "dst_buff": self._refs(dsts, ctype),
                           "channel_ids": [self._chan(c) for c in chans], "channel_type": ctype})

    def copy_packets(self, src: Local, dst: Local):
        """Local chunks into local scratch as packets."""
        return self._emit({"name": "cpkt", "src_buff": self._refs(src), "dst_buff": self._refs(dst)})

    def unpack_packets(self, src: Local, dst: Local):
        """Local scratch packets (waiting on each flag) into plain local chunks."""
        return self._emit({"name": "upkt", "src_buff": self._refs(src), "dst_buff": self._refs(dst)})

    def reduce_packets(self, local: Local, packets, dst: Local, send_to=(), copy_to: Local | None = None):
        """dst = local + the packet slots `packets` in local scratch. `copy_to` also writes the
        sum as packets into a local scratch slot (recpkt); `send_to` writes it as packets into
        peers' scratch over memory channels (respkt / recspkt)."""
        send = _as_list(send_to)
        _check_packet_dst(send)
        name = {(False, False): "repkt", (True, False): "respkt",
                (False, True): "recpkt", (True, True): "recspkt"}[(bool(send), copy_to is not None)]
        dsts = self._refs([dst] + ([copy_to] if copy_to is not None else [])) + self._refs(send, "memory")
        op = {"name": name, "src_buff": self._refs([local]) + self._refs(packets), "dst_buff": dsts}
        if send:
            op["channel_type"] = "memory"
        op["reduce_op"] = "sum"
        return self._emit(op)

    def to_json(self, nops: bool = True) -> dict:
        ops = _with_nops(self.ops) if nops else self.ops
        self._check_limits(ops)
        chans = [{"channel_type": t, "channel_ids": ids} for t, ids in self._channels.items() if ids]
        refs = [{"access_channel_type": t, "remote_buffer_ids": ids} for t, ids in self._rbufs.items() if ids]
        return {"id": self.id, "ops": ops, "channels": chans, "remote_buffer_refs": refs}

    def _check_limits(self, ops: list[dict]):
        where = f"rank {self.rank} thread block {self.id}"
        flat = [o for op in ops for o in [op] + op.get("ops", [])]
        if len(flat) > MAX_OPS_PER_BLOCK:
            raise ValueError(f"{where}: {len(flat)} ops, the executor takes {MAX_OPS_PER_BLOCK} a block")
        for t in CHANNEL_TYPES:
            if max(len(self._channels[t]), len(self._rbufs[t])) > MAX_CHANNELS_PER_BLOCK:
                raise ValueError(f"{where}: over {MAX_CHANNELS_PER_BLOCK} {t} channels or remote buffers")
        for op in flat:
            if len(op.get("channel_ids", ())) > MAX_CHANNELS_PER_OP or \
                    max(len(op.get("src_buff", ())), len(op.get("dst_buff", ()))) > MAX_REFS_PER_OP:
                raise ValueError(f"{where}: {op['name']} has more channels or buffers than the executor takes")
            if op.get("barrier_id", 0) >= MAX_BARRIERS:
                raise ValueError(f"{where}: barrier id {op['barrier_id']} (the executor has {MAX_BARRIERS})")


class PlanBuilder:
    """Collects ranks, channels, remote buffers and thread blocks; `to_json()` gives the plan."""

    def __init__(self, name: str, collective: str, nranks: int, protocol: str = "Simple", inplace: bool = True,
                 num_threads_per_block: int = 1024, min_message_size: int = 0, max_message_size: int = NO_MAX,
                 reuse_resources: bool = False, use_double_scratch_buffer: bool | None = None,
                 buffer_alignment: int = 16):
        if collective not in COLLECTIVES:
            raise ValueError(f"collective {collective!r} is not one of {COLLECTIVES}")
        if protocol not in ("Simple", "LL"):
            raise ValueError(f"protocol {protocol!r} is not Simple or LL")
        self.name, self.collective, self.nranks, self.protocol = name, collective, nranks, protocol
        self.inplace = inplace
        # LL plans alternate between two scratch halves (and flag values) from one run to the
        # next, so a packet slot of the last run is never mistaken for this run's.
        double = protocol == "LL" if use_double_scratch_buffer is None else use_double_scratch_buffer
        self.meta = {"num_threads_per_block": num_threads_per_block, "use_double_scratch_buffer": double,
                     "buffer_alignment": buffer_alignment, "min_message_size": min_message_size,
                     "max_message_size": max_message_size}
        self.reuse_resources = reuse_resources
        self._chunks = [{"input_chunks": 0, "output_chunks": 0, "scratch_chunks": 0} for _ in range(nranks)]
        self._tbs: list[list[ThreadBlock]] = [[] for _ in range(nranks)]
        # per rank and type: the peers in channel-index order (the gpu's `connected_to`)
        self._peers = [{t: [] for t in CHANNEL_TYPES} for _ in range(nranks)]
        self._rbufs: list[list[tuple[int, str, str]]] = [[] for _ in range(nranks)]
        self._sems: list[list[int]] = [[] for _ in range(nranks)]

    def chunks(self, input: int, output: int, scratch: int = 0, rank: int | None = None):
        """How many chunks each buffer holds (for one rank, or all). A chunk has one byte size
        on a rank for every buffer, scratch included."""
        for r in range(self.nranks) if rank is None else [rank]:
            self._chunks[r] = {"input_chunks": input, "output_chunks": output, "scratch_chunks": scratch}
        return self

    def channel(self, rank: int, peer: int, type: str, k: int = 0) -> Channel:
        """The k-th channel of `type` between `rank` and `peer`, created on both sides together
        (with channels 0..k-1) so the k-th of one side always pairs with the k-th of the other."""
        if type not in CHANNEL_TYPES:
            raise ValueError(f"channel type {type!r} is not one of {CHANNEL_TYPES}")
        if rank == peer or not (0 <= peer < self.nranks and 0 <= rank < self.nranks):
            raise ValueError(f"no channel from rank {rank} to {peer}")
        for a, bb in ((rank, peer), (peer, rank)):
            while self._peers[a][type].count(bb) <= k:
                self._peers[a][type].append(bb)
        return Channel(rank, peer, type, k, _nth(self._peers[rank][type], peer, k))

    def threadblock(self, rank: int) -> ThreadBlock:
        tb = ThreadBlock(self, rank, len(self._tbs[rank]))
        self._tbs[rank].append(tb)
        return tb

    def semaphore(self, rank: int, init_value: int = 0) -> int:
        """A device semaphore shared by the thread blocks of `rank`; returns its id."""
        if len(self._sems[rank]) == MAX_SEMAPHORES:
            raise ValueError(f"rank {rank}: the executor has {MAX_SEMAPHORES} semaphores")
        self._sems[rank].append(init_value)
        return len(self._sems[rank]) - 1

    def _remote_buffer(self, rank: int, peer: int, btype: str, access: str) -> int:
        if btype not in BUFFER_TYPES:
            raise ValueError(f"buffer type {btype!r} is not one of {BUFFER_TYPES}")
        key = (peer, btype, access)
        if key not in self._rbufs[rank]:
            self._rbufs[rank].append(key)
        return self._rbufs[rank].index(key)

    def to_json(self, nops: bool = True) -> dict:
        gpus = []
        for r in range(self.nranks):
            chans = [{"channel_type": t, "connected_to": peers} for t, peers in self._peers[r].items() if peers]
            gpus.append({
                "id": r, **self._chunks[r],
                "threadblocks": [tb.to_json(nops) for tb in self._tbs[r]],
                "channels": chans,
                "remote_buffers": [{"rank": p, "type": t, "access_channel_types": [a]} for p, t, a in self._rbufs[r]],
                "semaphores": [{"init_value": v} for v in self._sems[r]],
            })
        return {"name": self.name, "collective": self.collective, "protocol": self.protocol,
                "inplace": self.inplace, "reuse_resources": self.reuse_resources, "gpus": gpus, **self.meta}


def _kind(op: dict) -> str:
    """How the executor runs an op, for `_with_nops`: "quiet" ops synchronise the block
    themselves; "wait" and "signal" ops run on one thread per channel; a port-channel put
    ("trigger") hands work to the proxy from one thread per channel; "data" ops use every
    thread."""
    name = op["name"]
    if name in ("nop", "barrier"):
        return "quiet"
    if name in WAITING_OPS:
        return "wait"
    if name in SYNC_OPS:
        return "signal"
    if name in ("put", "pws", "pwsf") and op.get("channel_type") == "port":
        return "trigger"
    return "data"


def _needs_nop(prev: str, cur: str) -> bool:
    # After a data op every thread must be done before one signals or hands the data on;
    # after a wait, the wait must be over before anyone acts on it; after a port put, a
    # signal or flush must come after the put it covers. A wait may start early, and
    # nothing in the block depends on a signal having gone out.
    return prev in ("data", "wait", "trigger") and cur not in ("wait", "quiet")


def _with_nops(ops: list[dict]) -> list[dict]:
    """A __syncthreads ("nop") between two ops where the executor needs one: it runs a
    signal, wait or port put on one thread per channel and a data op on every thread, and
    syncs nothing between ops by itself. Each nop counts against the executor's 64 ops per
    block, so none goes where nothing depends on it."""
    out: list[dict] = []
    for op in ops:
        if op["name"] == "pipeline":
            op = {**op, "ops": _with_nops(op["ops"])}
        if out and _needs_nop(_kind(out[-1]), _kind(op)):  # a pipeline counts as a data op
            out.append({"name": "nop"})
        out.append(op)
    return out


def _as_list(x) -> list:
    return list(x) if isinstance(x, (list, tuple)) else [x]


def _one_type(chans: list[Channel]) -> str:
    types = {c.type for c in chans}
    if len(types) != 1:
        raise ValueError(f"one op, one channel type (got {sorted(types)})")
    return types.pop()


def _check_lengths(*lists):
    if len({len(x) for x in lists}) != 1:
        raise ValueError("sources, destinations and channels must pair up one to one")


def _check_peers(remotes: list[Remote], chans: list[Channel]):
    for r, c in zip(remotes, chans):
        if r.peer != c.peer:
            raise ValueError(f"buffer on rank {r.peer} reached through a channel to rank {c.peer}")


def _check_packet_dst(remotes: list[Remote]):
    for r in remotes:
        if r.type != "s":
            raise ValueError("packets can only land in a scratch buffer")


def _nth(seq: list, value, k: int) -> int:
    seen = -1
    for i, v in enumerate(seq):
        if v == value:
            seen += 1
            if seen == k:
                return i
    raise LookupError(value)
