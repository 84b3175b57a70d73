"""MSCCL++ execution plans as wirespeed reads them (docs/plans.md).

An execution plan is the JSON that MSCCL++'s Python DSL emits and its executor runs: per rank
("gpu") the chunk counts of its input, output and scratch buffers, its channels to peers
(memory, port, switch), the remote buffers it reaches through them, its semaphores, and its
thread blocks, each a list of operations. This module turns that JSON into plain objects and
refuses, with one line that names the place, anything it does not know: an unknown operation or
field is an error, never skipped, because a skipped `wait` is a race nobody would see.

Every index is resolved here, once: an op's `channel_ids` become the rank-level channel numbers
(through its thread block's channel list), its remote `buffer_id`s become (rank, buffer) pairs
(through the thread block's remote-buffer refs and the rank's remote buffers), and each channel
learns which channel of its peer it pairs with (the k-th channel of one type from r to p pairs
with the k-th of that type from p to r, as the executor sets up their semaphores). Later stages
(interpret, check, simulate, execute) never look at the JSON.
"""
from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass, field

from ..errors import UsageError

COLLECTIVES = ("allreduce", "allgather", "reducescatter", "alltoall", "sendrecv", "broadcast", "test")
BUFFERS = {"i": "input", "o": "output", "s": "scratch"}
CHANNEL_TYPES = ("memory", "port", "switch", "none")

# Every operation the executor knows (its JSON name), with what it means; docs/plans.md explains
# each. "pkt" ops use the LL protocol: data travels with a flag in packets, a packet read waits
# for its flag, so those reads need no signal.
OPS = {
    "nop": "thread-block sync (no effect across blocks)",
    "barrier": "sync of num_threadblocks blocks of one rank",
    "signal": "signal peers (data written before it is visible after the matching wait)",
    "wait": "wait for one signal per channel",
    "rlxsignal": "relaxed signal: orders execution, not data",
    "rlxwait": "relaxed wait",
    "flush": "wait until the port channel's proxy has sent every put",
    "put": "copy local chunks into remote buffers",
    "pws": "put, then signal (port channel)",
    "pwsf": "put, signal, flush (port channel)",
    "get": "copy remote chunks into local buffers",
    "copy": "local copy",
    "re": "reduce local chunks into dst",
    "res": "reduce local chunks, write the result locally and into remote buffers",
    "rre": "read remote chunks and reduce them with a local one",
    "rres": "read-reduce, then write the result into remote buffers too",
    "ppkt": "put chunks as packets into remote scratch",
    "rppkt": "read packets from local scratch, put them into remote scratch",
    "respkt": "reduce packets from scratch with a local chunk, send result as packets",
    "repkt": "reduce packets from scratch with a local chunk",
    "recpkt": "reduce packets, write the result and a packet copy locally",
    "recspkt": "reduce packets, write result + packet copy locally, send packets",
    "cpkt": "copy a local chunk into packets",
    "upkt": "unpack packets from scratch into a buffer",
    "glres": "switch: load-reduce over the group, store to every member",
    "gstore": "switch: store a local chunk to every member",
    "gstorepkt": "switch: store packets to every member",
    "sem_acquire": "acquire semaphores of this rank",
    "sem_release": "release semaphores of this rank",
    "pipeline": "run the inner ops over the chunks in units of unit_size bytes",
}

_TOP_FIELDS = {"name", "collective", "protocol", "inplace", "reuse_resources", "gpus",
               "num_threads_per_block", "use_double_scratch_buffer", "buffer_alignment",
               "min_message_size", "max_message_size"}
_GPU_FIELDS = {"id", "input_chunks", "output_chunks", "scratch_chunks", "threadblocks", "channels",
               "remote_buffers", "semaphores"}
_TB_FIELDS = {"id", "ops", "channels", "remote_buffer_refs"}
_OP_FIELDS = {"name", "channel_ids", "channel_type", "src_buff", "dst_buff", "reduce_op",
              "barrier_id", "num_threadblocks", "semaphore_ids", "tbg_info", "iter_context", "ops",
              # glre (the DSL's older multimem form): fields listed so its error names the op
              "buffer_offset", "buffer_type", "dst_chunk", "size"}
_BUFF_FIELDS = {"type", "index", "size", "buffer_id", "switch_channel_id", "rank"}

# MSCCL++'s executor's fixed tables (src/core/include/execution_common.hpp at 1f5f065d): ops per
# thread block (pipeline bodies included), channels and remote buffers per type per block,
# channels, local + remote buffers and semaphores per op, barriers per rank.
EXECUTOR_LIMITS = {"ops": 64, "channels": 16, "op_channels": 8, "op_buffers": 10, "semaphores": 16,
                   "barriers": 16}
REDUCE_OPS = ("sum",)

# What a plan may be and hold, so that no file makes wirespeed read, build or run without end. The
# largest plan the tests keep (fixtures/allreduce_rsag_8r.json) is 93 KB; plans nest 9 deep (11
# with a pipeline); a plan grows with ranks x thread blocks x ops, so one of hundreds of ranks is
# still a few MB. Past any of these a plan is refused in one line that names the limit, before
# anything is built from it.
MAX_PLAN_BYTES = 32 << 20         # a plan file (350 times the largest fixture)
MAX_NESTING = 32                  # arrays and objects within each other
MAX_RANKS = 1 << 16               # gpus
MAX_CHUNKS = 1 << 20              # chunks of one buffer; a reference's chunk index and count
MAX_ALIGNMENT = 1 << 16           # buffer_alignment, bytes
MAX_GROUP = 1 << 12               # a thread-block group (tbg_size), a barrier's blocks and its id
MAX_SEMAPHORE_VALUE = (1 << 32) - 1
MAX_MESSAGE_BYTES = 1 << 40       # the smallest message a plan splits into its chunks; a pipeline's unit


class PlanError(UsageError):
    """A plan wirespeed cannot read: the message names the file and the place in it."""


@dataclass(frozen=True)
class Ref:
    """One chunk range an op reads or writes: `count` chunks from `index` of `buffer` on `rank`.
    `via` says how it is reached: "local", "memory"/"port" (a remote buffer), or "switch" (the
    multicast view of `group` ranks' buffers)."""

    rank: int
    buffer: str           # "input" | "output" | "scratch"
    index: int
    count: int
    via: str = "local"
    group: tuple[int, ...] = ()


@dataclass(frozen=True)
class Op:
    """One operation of a thread block, its references resolved."""

    name: str
    where: str                        # "rank 1, tb 3, op 7 (put)": how errors name it
    rank: int
    tb: int
    index: int
    channel_type: str = "none"
    channels: tuple[int, ...] = ()    # rank-level channel numbers of channel_type
    src: tuple[Ref, ...] = ()
    dst: tuple[Ref, ...] = ()
    barrier_id: int = -1
    barrier_count: int = 0
    semaphores: tuple[int, ...] = ()
    tbg: tuple[int, int] = (0, 1)     # (this block's part, parts): the chunk split among a group
    unit_size: int = 0                # pipeline: bytes per iteration
    pipeline_chunks: int = 0          # pipeline: chunks the iterations cover
    inner: tuple["Op", ...] = ()      # pipeline body


@dataclass
class Channel:
    """A rank's channel to `peer`; `pair` is the number of the peer's channel it pairs with."""

    type: str
    peer: int
    number: int
    pair: int = -1
    implicit: bool = False   # made by the executor for a peer's channel this rank does not list


@dataclass
class SwitchGroup:
    buffer: str
    ranks: tuple[int, ...]
    chunks: int


@dataclass
class RankPlan:
    id: int
    input_chunks: int
    output_chunks: int
    scratch_chunks: int
    threadblocks: list[list[Op]] = field(default_factory=list)
    channels: dict[str, list[Channel]] = field(default_factory=lambda: {"memory": [], "port": []})
    switches: list[SwitchGroup] = field(default_factory=list)
    semaphores: list[int] = field(default_factory=list)   # initial values


@dataclass
class Plan:
    name: str
    collective: str
    protocol: str        # "Simple" | "LL"
    inplace: bool
    ranks: list[RankPlan]
    alignment: int = 16
    double_scratch: bool = False
    reuse_resources: bool = False
    min_size: int = 0
    max_size: int = 2**64 - 1
    source: str = ""
    # Where the plan exceeds what MSCCL++'s executor can load (its fixed per-block tables): it
    # runs here, but not there; `plan check` reports each.
    over_limits: list[str] = field(default_factory=list)

    @property
    def nranks(self) -> int:
        return len(self.ranks)

    @property
    def packets(self) -> bool:
        return self.protocol == "LL"

    def all_ops(self):
        """Every op, pipeline bodies included, in plan order."""
        for r in self.ranks:
            for ops in r.threadblocks:
                for op in ops:
                    yield op
                    yield from op.inner


# ---- reading a file ----

def read_bytes(path: str, label: str, what: str = "file", error=None, limit: int = MAX_PLAN_BYTES,
               limit_name: str = "MAX_PLAN_BYTES") -> bytes:
    """The bytes of the regular file `path`, at most `limit` of them; anything else (no such file,
    a directory, a device such as /dev/zero, a FIFO, a file over the limit) is one line (`error`,
    a PlanError unless given) starting with `label`. Nothing is read before the file is known to
    be a regular one, and never more than the limit."""
    error = error or PlanError
    try:
        # O_NONBLOCK: opening a FIFO with no writer must not wait for one.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise error(f"{label}: no such {what}") from None
    except (OSError, ValueError) as e:   # ValueError: a NUL in the path
        raise error(f"{label}: cannot read it ({getattr(e, 'strerror', None) or e})") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise error(f"{label}: not a regular file ({_file_kind(mode)}): give a {what} on disk")
        with open(fd, "rb", closefd=False) as f:
            data = f.read(limit + 1)
    except OSError as e:
        raise error(f"{label}: cannot read it ({e.strerror})") from None
    finally:
        os.close(fd)
    if len(data) > limit:
        raise error(f"{label}: more than {limit} bytes ({limit >> 20} MiB), the most a {what} may have "
                    f"({limit_name})")
    return data


def _file_kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a plain file"


def loads(data: bytes, label: str, what: str = "file", error=None):
    """The JSON value of `data`, refused in one line (`error`, a PlanError unless given) when it
    is not UTF-8 text, nests deeper than MAX_NESTING (measured without recursion, before
    json.loads, which recurses, sees it) or is not JSON."""
    error = error or PlanError
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{label}: not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start}): a {what} "
                    "is JSON text") from None
    depth = nesting(data)
    if depth > MAX_NESTING:
        raise error(f"{label}: arrays and objects nested {depth} deep, more than the {MAX_NESTING} "
                    f"wirespeed reads (MAX_NESTING; a plan nests at most 11 deep)")
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise error(f"{label}: not JSON ({e.msg} at line {e.lineno})") from None
    except (ValueError, RecursionError) as e:   # a number of thousands of digits
        raise error(f"{label}: not JSON wirespeed reads ({str(e).split(';')[0]})") from None


_STEP = bytes(1 if c in b"[{" else 255 if c in b"]}" else 0 for c in range(256))


def nesting(data: bytes) -> int:
    """How deep arrays and objects nest in the JSON text `data`, in one pass without recursion:
    escapes (which occur only inside strings) are dropped, so every quote left opens or closes a
    string, and the brackets outside strings are counted, a block at a time."""
    import numpy as np
    data = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    codes = np.frombuffer(data, dtype=np.uint8)
    steps = np.frombuffer(_STEP, dtype=np.int8)
    deepest = level = quotes = 0
    block = 1 << 22
    for i in range(0, len(codes), block):
        c = codes[i:i + block]
        q = np.cumsum(c == 34, dtype=np.int64) + quotes   # quotes so far: odd inside a string
        quotes = int(q[-1])
        run = np.cumsum(np.where(q & 1, 0, steps[c]), dtype=np.int64) + level
        deepest = max(deepest, int(run.max()))
        level = int(run[-1])
    return deepest


def read_json(path: str, label: str, what: str = "file", error=None):
    """The JSON value in the file `path` (read_bytes, loads); whatever is wrong with it is one line
    (`error`, a PlanError unless given) starting with `label`."""
    return loads(read_bytes(path, label, what, error), label, what, error)


def load(path: str) -> Plan:
    """Read a plan file; a missing file, bad JSON or a plan wirespeed cannot read is a PlanError."""
    return parse(read_json(path, path, "plan file"), source=path)


def parse(obj, source: str = "plan") -> Plan:
    """A Plan from the JSON object, every field known and every index resolved."""
    return _Reader(source).plan(obj)


_MISSING = object()


def _kind(v) -> str:
    """A JSON value's type, as an error names it."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, (int, float)):
        return "a number"
    if isinstance(v, str):
        return "a string"
    if isinstance(v, list):
        return "a list"
    if isinstance(v, dict):
        return "an object"
    return type(v).__name__


def _show(v) -> str:
    """A value for a one-line error: short, never a container's contents or a number's thousand digits."""
    if v is None or isinstance(v, bool):
        return json.dumps(v)
    if isinstance(v, int):
        return str(v) if v.bit_length() <= 128 else f"a {v.bit_length()}-bit number"
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, str):
        r = repr(v)
        return r if len(r) <= 40 else r[:36] + "...'"
    if isinstance(v, list):
        return f"a list of {len(v)}"
    return _kind(v)


def _index(v, n: int) -> bool:
    """Whether v is a whole number in 0..n-1 (not a boolean)."""
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < n


def _at(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


class _Reader:
    """Reads the JSON object field by field: every field's type and range checked before it is
    used, so a malformed plan is one PlanError naming the path to the field
    (`gpus[1].threadblocks[0].ops[3].src_buff: expected a list, got a number`), never a Python
    error, and no value makes it build or loop without bound (the MAX_* limits above)."""

    def __init__(self, source: str):
        self.source = source

    def fail(self, where: str, msg: str):
        raise PlanError(f"{self.source}: {where}: {msg}" if where else f"{self.source}: {msg}")

    def fields(self, obj, allowed: set, where: str, required=()):
        if not isinstance(obj, dict):
            self.fail(where, f"expected an object, got {_kind(obj)}")
        for k in obj:
            if k not in allowed:
                self.fail(where, f"unknown field {_show(k)} (wirespeed reads: {', '.join(sorted(allowed))}); "
                          "a newer MSCCL++ format? see docs/plans.md")
        for k in required:
            if k not in obj:
                self.fail(where, f"missing field {k!r}")

    def items(self, obj: dict, key: str, where: str, default=_MISSING) -> list:
        """obj[key], which must be a list; `default` where it is absent (required without one)."""
        v = obj.get(key, default)
        if v is _MISSING:
            self.fail(where, f"missing field {key!r}")
        if not isinstance(v, list):
            self.fail(_at(where, key), f"expected a list, got {_kind(v)}")
        return v

    def integer(self, obj: dict, key: str, where: str, minimum: int = 0, default=None,
                maximum: int = 2**64 - 1, limit: str = "") -> int:
        v = obj.get(key, default)
        at = _at(where, key)
        if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
            self.fail(at, f"must be a whole number >= {minimum}, got {_show(v)}")
        if v > maximum:
            self.fail(at, f"{_show(v)} is more than {maximum}, the most wirespeed allows"
                      + (f" ({limit})" if limit else ""))
        return v

    def boolean(self, obj: dict, key: str, where: str) -> bool:
        v = obj.get(key, False)
        if not isinstance(v, bool):
            self.fail(_at(where, key), f"expected true or false, got {_show(v)}")
        return v

    def word(self, v, where: str, choices, what: str) -> str:
        """v, which must be one of the strings `choices`."""
        if not isinstance(v, str) or v not in choices:
            self.fail(where, f"unknown {what} {_show(v)} ({', '.join(choices)})")
        return v

    def plan(self, obj) -> Plan:
        self.fields(obj, _TOP_FIELDS, "top level", required=("name", "collective", "protocol", "gpus"))
        if not isinstance(obj["name"], str):
            self.fail("name", f"expected a string, got {_kind(obj['name'])}")
        coll = obj["collective"]
        if not isinstance(coll, str) or coll not in COLLECTIVES:
            self.fail("collective", f"unknown collective {_show(coll)} (known: {', '.join(COLLECTIVES)})")
        proto = self.word(obj["protocol"], "protocol", ("Simple", "LL"), "protocol")
        gpus = self.items(obj, "gpus", "")
        if not gpus:
            self.fail("gpus", "must be a non-empty list")
        if len(gpus) > MAX_RANKS:
            self.fail("gpus", f"{len(gpus)} ranks, more than {MAX_RANKS}, the most wirespeed reads (MAX_RANKS)")
        for r, g in enumerate(gpus):
            if not isinstance(g, dict):
                self.fail(f"gpus[{r}]", f"expected an object, got {_kind(g)}")
            if g.get("id") != r or isinstance(g.get("id"), bool):
                self.fail(f"gpus[{r}]", f"id must be {r} (gpus are listed in rank order), got {_show(g.get('id'))}")
        plan = Plan(name=obj["name"], collective=coll, protocol=proto,
                    inplace=self.boolean(obj, "inplace", ""), ranks=[],
                    alignment=self.integer(obj, "buffer_alignment", "", 1, 16, MAX_ALIGNMENT, "MAX_ALIGNMENT"),
                    double_scratch=self.boolean(obj, "use_double_scratch_buffer", ""),
                    reuse_resources=self.boolean(obj, "reuse_resources", ""),
                    min_size=self.integer(obj, "min_message_size", "", 0, 0),
                    max_size=self.integer(obj, "max_message_size", "", 0, 2**64 - 1),
                    source=self.source)
        if "num_threads_per_block" in obj:
            self.integer(obj, "num_threads_per_block", "", 1, None, 1 << 16)
        if plan.alignment % 4:
            self.fail("buffer_alignment", f"{plan.alignment} is not a multiple of 4 bytes")
        # Channels and remote buffers of every rank first: ops refer to other ranks' channels
        # (pairs) and a remote buffer names its owner.
        self.remote = []
        for r, g in enumerate(gpus):
            where = f"gpus[{r}]"
            self.fields(g, _GPU_FIELDS, where, required=("input_chunks", "output_chunks",
                                                         "scratch_chunks", "threadblocks"))
            rp = RankPlan(id=r, **{k: self.integer(g, k, where, maximum=MAX_CHUNKS, limit="MAX_CHUNKS")
                                   for k in ("input_chunks", "output_chunks", "scratch_chunks")})
            self.channels(rp, self.items(g, "channels", where, []), len(gpus))
            self.remote.append(self.remote_buffers(r, self.items(g, "remote_buffers", where, []), len(gpus)))
            for i, s in enumerate(self.items(g, "semaphores", where, [])):
                self.fields(s, {"init_value"}, f"{where}.semaphores[{i}]")
                rp.semaphores.append(self.integer(s, "init_value", f"{where}.semaphores[{i}]", 0, 0,
                                                  MAX_SEMAPHORE_VALUE, "MAX_SEMAPHORE_VALUE"))
            plan.ranks.append(rp)
        self.pair_channels(plan)
        for r, g in enumerate(gpus):
            for t, tb in enumerate(self.items(g, "threadblocks", f"gpus[{r}]")):
                if not isinstance(tb, dict):
                    self.fail(f"gpus[{r}].threadblocks[{t}]", f"expected an object, got {_kind(tb)}")
                if tb.get("id") != t or isinstance(tb.get("id"), bool):
                    self.fail(f"gpus[{r}].threadblocks[{t}]", f"id must be {t}, got {_show(tb.get('id'))}")
                plan.ranks[r].threadblocks.append(self.threadblock(plan, r, t, tb))
        least = smallest_size(plan)
        if least > MAX_MESSAGE_BYTES:
            self.fail("gpus", f"the chunk counts split no message smaller than {_show(least)} bytes (the "
                      "alignment x thread-block groups x ranks x the least common multiple of the chunk "
                      f"counts), more than {MAX_MESSAGE_BYTES}, the most wirespeed runs (MAX_MESSAGE_BYTES)")
        return plan

    def channels(self, rp: RankPlan, chans: list, nranks: int):
        for i, c in enumerate(chans):
            where = f"gpus[{rp.id}].channels[{i}]"
            if not isinstance(c, dict):
                self.fail(where, f"expected an object, got {_kind(c)}")
            ctype = c.get("channel_type")
            if ctype == "switch":
                self.fields(c, {"channel_type", "buffer_type", "rank_groups"}, where,
                            required=("buffer_type", "rank_groups"))
                buf = self.buffer_name(c["buffer_type"], f"{where}.buffer_type")
                for j, grp in enumerate(self.items(c, "rank_groups", where)):
                    gw = f"{where}.rank_groups[{j}]"
                    self.fields(grp, {"size", "ranks"}, gw, required=("ranks",))
                    ranks = tuple(self.items(grp, "ranks", gw))
                    for p in ranks:
                        if not _index(p, nranks):
                            self.fail(gw, f"switch group names rank {_show(p)}: the plan has {nranks} ranks")
                    if rp.id not in ranks:
                        self.fail(gw, f"switch group {list(ranks)} does not include its own rank {rp.id}")
                    size = self.integer(grp, "size", gw, 1, len(ranks), MAX_RANKS, "MAX_RANKS")
                    rp.switches.append(SwitchGroup(buf, ranks, size))
            elif ctype in ("memory", "port"):
                self.fields(c, {"channel_type", "connected_to"}, where, required=("connected_to",))
                for p in self.items(c, "connected_to", where):
                    if not _index(p, nranks) or p == rp.id:
                        self.fail(f"{where}.connected_to", f"connected_to names rank {_show(p)}: a peer must "
                                  f"be another of the plan's {nranks} ranks")
                    lst = rp.channels[ctype]
                    lst.append(Channel(ctype, p, len(lst)))
            else:
                self.fail(f"{where}.channel_type", f"unknown channel_type {_show(ctype)} (memory, port or switch)")

    def buffer_name(self, code, where) -> str:
        return BUFFERS[self.word(code, where, BUFFERS, "buffer type")]

    def remote_buffers(self, r, bufs, nranks):
        out = []
        for i, b in enumerate(bufs):
            where = f"gpus[{r}].remote_buffers[{i}]"
            self.fields(b, {"rank", "type", "access_channel_types"}, where, required=("rank", "type"))
            owner = b["rank"]
            if not _index(owner, nranks) or owner == r:
                self.fail(f"{where}.rank", f"rank {_show(owner)} is not another of the plan's {nranks} ranks")
            access = tuple(self.items(b, "access_channel_types", where, []))
            for a in access:
                self.word(a, f"{where}.access_channel_types", ("memory", "port"), "access channel type")
            out.append((owner, self.buffer_name(b["type"], f"{where}.type"), access))
        return out

    def pair_channels(self, plan: Plan):
        """The k-th channel of a type from r to p pairs with the k-th from p to r. Where p lists
        fewer, the executor makes the missing ones on p (unused by p's ops): so does this, and a
        signal into one is simply never waited for, while a wait on one can never end (a deadlock
        the checker names)."""
        toward: dict[tuple, list[Channel]] = {}    # (rank, type, peer) -> its channels to the peer
        for rp in plan.ranks:
            for ctype in ("memory", "port"):
                for ch in rp.channels[ctype]:
                    toward.setdefault((rp.id, ctype, ch.peer), []).append(ch)
        for rp in plan.ranks:
            for ctype in ("memory", "port"):
                seen: dict[int, int] = {}
                for ch in list(rp.channels[ctype]):
                    if ch.implicit:
                        continue
                    k = seen.get(ch.peer, 0)
                    seen[ch.peer] = k + 1
                    peer = plan.ranks[ch.peer].channels[ctype]
                    theirs = toward.setdefault((ch.peer, ctype, rp.id), [])
                    if k >= len(theirs):
                        peer.append(Channel(ctype, rp.id, len(peer), implicit=True))
                        theirs.append(peer[-1])
                    ch.pair = theirs[k].number
                    theirs[k].pair = ch.number

    def threadblock(self, plan: Plan, r: int, t: int, tb) -> list[Op]:
        where = f"gpus[{r}].threadblocks[{t}]"
        self.fields(tb, _TB_FIELDS, where, required=("ops",))
        local = {"memory": [], "port": [], "switch": []}
        for i, c in enumerate(self.items(tb, "channels", where, [])):
            cw = f"{where}.channels[{i}]"
            self.fields(c, {"channel_type", "channel_ids", "buff"}, cw, required=("channel_type", "channel_ids"))
            ctype = self.word(c["channel_type"], f"{cw}.channel_type", tuple(local), "channel_type")
            have = len(plan.ranks[r].switches) if ctype == "switch" else len(plan.ranks[r].channels[ctype])
            for cid in self.items(c, "channel_ids", cw):
                if not _index(cid, have):
                    self.fail(f"{cw}.channel_ids", f"{ctype} channel {_show(cid)} does not exist (rank {r} has {have})")
                local[ctype].append(cid)
        refs = {"memory": [], "port": []}
        for i, rb in enumerate(self.items(tb, "remote_buffer_refs", where, [])):
            rw = f"{where}.remote_buffer_refs[{i}]"
            self.fields(rb, {"access_channel_type", "remote_buffer_ids"}, rw,
                        required=("access_channel_type", "remote_buffer_ids"))
            a = self.word(rb["access_channel_type"], f"{rw}.access_channel_type", tuple(refs), "access channel type")
            for bid in self.items(rb, "remote_buffer_ids", rw):
                if not _index(bid, len(self.remote[r])):
                    self.fail(f"{rw}.remote_buffer_ids", f"remote buffer {_show(bid)} does not exist "
                              f"(rank {r} lists {len(self.remote[r])})")
                refs[a].append(self.remote[r][bid])
        ctx = (plan, r, t, local, refs)
        ops = self.items(tb, "ops", where)
        if not ops:
            # The executor would run an empty block; no DSL writes one, and an op deleted by
            # mistake is the likelier story.
            self.fail(f"{where}.ops", "empty: a thread block needs at least one operation")
        out = [self.op(ctx, i, o, f"{where}.ops[{i}]") for i, o in enumerate(ops)]
        self.limits(plan, r, t, out, local, refs)
        return out

    def limits(self, plan, r, t, ops, local, refs):
        L, over = EXECUTOR_LIMITS, plan.over_limits
        n_ops = sum(1 + len(op.inner) for op in ops)
        if n_ops > L["ops"]:
            over.append(f"rank {r}, tb {t}: {n_ops} ops (pipeline bodies included), the executor "
                        f"holds {L['ops']} per thread block")
        for kind, lst in list(local.items()) + [(f"remote {k} buffer", v) for k, v in refs.items()]:
            if len(lst) > L["channels"]:
                over.append(f"rank {r}, tb {t}: {len(lst)} {kind} entries, the executor holds "
                            f"{L['channels']} per thread block")
        for op in ops:
            for o in (op, *op.inner):
                if len(o.channels) > L["op_channels"]:
                    over.append(f"{o.where}: {len(o.channels)} channels, the executor takes {L['op_channels']} per op")
                if max(len(o.src), len(o.dst)) > L["op_buffers"]:
                    over.append(f"{o.where}: {max(len(o.src), len(o.dst))} buffers on one side, the "
                                f"executor takes {L['op_buffers']} per op")
                if len(o.semaphores) > L["semaphores"]:
                    over.append(f"{o.where}: {len(o.semaphores)} semaphores, the executor takes "
                                f"{L['semaphores']} per op")
                if o.name == "barrier" and o.barrier_id >= L["barriers"]:
                    over.append(f"{o.where}: barrier {o.barrier_id}, the executor has {L['barriers']}")

    def op(self, ctx, i, o, where, in_pipeline=False) -> Op:
        plan, r, t, local, refs = ctx
        self.fields(o, _OP_FIELDS, where, required=("name",))
        name = o["name"]
        if not isinstance(name, str) or name not in OPS:
            self.fail(where, f"unknown operation {_show(name)} (rank {r}, tb {t}, op {i}); wirespeed knows: "
                      f"{', '.join(OPS)}")
        label = f"rank {r}, tb {t}, op {i} ({name})"
        ctype = self.word(o.get("channel_type", "none"), f"{where}.channel_type", CHANNEL_TYPES, "channel_type")
        src_list = self.items(o, "src_buff", where, [])
        dst_list = self.items(o, "dst_buff", where, [])
        chans = ()
        if "channel_ids" in o:
            if ctype not in ("memory", "port"):
                self.fail(where, f"{label}: channel_ids need a memory or port channel_type, got {ctype!r}")
            ids = self.items(o, "channel_ids", where)
            for c in ids:
                if not _index(c, len(local[ctype])):
                    self.fail(f"{where}.channel_ids", f"{label}: {ctype} channel {_show(c)} is not among the "
                              f"thread block's {len(local[ctype])}")
            chans = tuple(local[ctype][c] for c in ids)
        elif ctype == "port" and name in ("put", "pws", "pwsf", "ppkt", "rppkt") and local["port"]:
            # The executor zero-fills an op's channel indexes: without channel_ids every
            # destination goes through the thread block's first port channel.
            chans = (local["port"][0],) * max(1, len(dst_list))
        tbg = (0, 1)
        if "tbg_info" in o:
            g = o["tbg_info"]
            gw = f"{where}.tbg_info"
            self.fields(g, {"tb_id", "tbg_size"}, gw, required=("tb_id", "tbg_size"))
            tbg = (self.integer(g, "tb_id", gw, 0, None, MAX_GROUP, "MAX_GROUP"),
                   self.integer(g, "tbg_size", gw, 1, None, MAX_GROUP, "MAX_GROUP"))
            if tbg[0] >= tbg[1]:
                self.fail(gw, f"{label}: tbg_info tb_id {tbg[0]} is not below tbg_size {tbg[1]}")
        reduce_op = o.get("reduce_op", "sum")
        if not isinstance(reduce_op, str) or reduce_op not in REDUCE_OPS:
            self.fail(f"{where}.reduce_op", f"{label}: reduce_op {_show(reduce_op)} is not supported (sum)")
        src = tuple(self.ref(ctx, b, ctype, f"{where}.src_buff[{k}]", label) for k, b in enumerate(src_list))
        dst = tuple(self.ref(ctx, b, ctype, f"{where}.dst_buff[{k}]", label) for k, b in enumerate(dst_list))
        kw = {}
        if name == "barrier":
            kw["barrier_id"] = self.integer(o, "barrier_id", where, 0, None, MAX_GROUP, "MAX_GROUP")
            kw["barrier_count"] = self.integer(o, "num_threadblocks", where, 1, None, MAX_GROUP, "MAX_GROUP")
        if name in ("sem_acquire", "sem_release"):
            ids = self.items(o, "semaphore_ids", where, [])
            for s in ids:
                if not _index(s, len(plan.ranks[r].semaphores)):
                    self.fail(f"{where}.semaphore_ids", f"{label}: semaphore {_show(s)} does not exist (rank "
                              f"{r} has {len(plan.ranks[r].semaphores)})")
            kw["semaphores"] = tuple(ids)
        if name == "pipeline":
            if in_pipeline:
                self.fail(where, f"{label}: a pipeline inside a pipeline")
            if "iter_context" not in o:
                self.fail(where, f"{label}: missing field 'iter_context'")
            it = o["iter_context"]
            iw = f"{where}.iter_context"
            self.fields(it, {"unit_size", "num_chunks"}, iw, required=("unit_size", "num_chunks"))
            kw["unit_size"] = self.integer(it, "unit_size", iw, 1, None, MAX_MESSAGE_BYTES, "MAX_MESSAGE_BYTES")
            kw["pipeline_chunks"] = self.integer(it, "num_chunks", iw, 1, None, MAX_CHUNKS, "MAX_CHUNKS")
            kw["inner"] = tuple(self.op(ctx, i, inner, f"{where}.ops[{j}]", True)
                                for j, inner in enumerate(self.items(o, "ops", where, [])))
            if not kw["inner"]:
                self.fail(where, f"{label}: an empty pipeline")
        op = Op(name=name, where=label if not in_pipeline else label.replace(")", ", in a pipeline)"),
                rank=r, tb=t, index=i, channel_type=ctype, channels=chans, src=src, dst=dst, tbg=tbg, **kw)
        self.shape(op, where)
        return op

    def ref(self, ctx, b, ctype, where, label) -> Ref:
        plan, r, t, local, refs = ctx
        self.fields(b, _BUFF_FIELDS, where, required=("index", "size"))
        index = self.integer(b, "index", where, 0, None, MAX_CHUNKS, "MAX_CHUNKS")
        count = self.integer(b, "size", where, 1, None, MAX_CHUNKS, "MAX_CHUNKS")
        if "switch_channel_id" in b:
            sid = b["switch_channel_id"]
            if not _index(sid, len(local["switch"])):
                self.fail(f"{where}.switch_channel_id", f"{label}: switch channel {_show(sid)} is not among "
                          f"the thread block's {len(local['switch'])}")
            grp = plan.ranks[r].switches[local["switch"][sid]]
            return Ref(r, grp.buffer, index, count, "switch", grp.ranks)
        if "buffer_id" in b:
            if ctype not in ("memory", "port"):
                self.fail(where, f"{label}: a remote buffer_id needs a memory or port channel_type")
            bid = b["buffer_id"]
            if not _index(bid, len(refs[ctype])):
                self.fail(f"{where}.buffer_id", f"{label}: remote buffer {_show(bid)} is not among the thread "
                          f"block's {len(refs[ctype])} reached by {ctype} channels")
            owner, buf, access = refs[ctype][bid]
            if access and ctype not in access:
                self.fail(where, f"{label}: rank {owner}'s {buf} is not registered for {ctype} access")
            if not any(c.peer == owner for c in plan.ranks[r].channels[ctype]):
                self.fail(where, f"{label}: reaches rank {owner}'s {buf} over a {ctype} channel, but rank "
                          f"{r} has no {ctype} channel to rank {owner} (the executor registers remote "
                          "memory over a connection)")
            return Ref(owner, buf, index, count, ctype)
        if "type" not in b:
            self.fail(where, f"{label}: a buffer reference needs type, buffer_id or switch_channel_id")
        if b.get("rank", r) != r:
            self.fail(f"{where}.rank", f"{label}: a local buffer of rank {_show(b['rank'])} in rank {r}'s op")
        return Ref(r, self.buffer_name(b["type"], f"{where}.type"), index, count)

    def shape(self, op: Op, where: str):
        """The operand counts each op's semantics needs (docs/plans.md), so the interpreter can
        rely on them."""
        n, s, d = op.name, len(op.src), len(op.dst)
        remote = lambda refs: all(x.via in ("memory", "port") for x in refs)  # noqa: E731
        want = None
        if n in ("signal", "wait", "rlxsignal", "rlxwait", "flush") and not op.channels:
            want = "at least one channel"
        elif n in ("put", "pws", "pwsf", "ppkt") and (s != d or not s or not remote(op.dst)
                                                       or any(x.via != "local" for x in op.src)):
            want = "local sources and as many remote destinations"
        elif n in ("pws", "pwsf") and op.channel_type == "port" and len(op.channels) != d:
            want = "one channel per destination"
        elif n == "put" and op.channel_type == "port" and op.channels and len(op.channels) != d:
            want = "one channel per destination"
        elif n == "get" and (s != d or not s or not remote(op.src) or any(x.via != "local" for x in op.dst)):
            want = "remote sources and as many local destinations"
        elif n in ("copy", "cpkt", "upkt") and (s != 1 or d != 1 or op.src[0].via != "local"
                                               or op.dst[0].via != "local"):
            want = "one local source and one local destination"
        elif n in ("re", "repkt", "recpkt") and (s < 1 or d < 1 or op.dst[0].via != "local"
                                                or any(x.via != "local" for x in op.src)):
            want = "local sources and a local destination"
        elif n in ("res", "respkt", "recspkt") and (s < 1 or d < 1 or op.dst[0].via != "local"):
            want = "local sources, a local destination, then remote destinations"
        elif n in ("rre", "rres") and (s < 2 or d < 1 or op.src[0].via != "local" or not remote(op.src[1:])
                                       or op.dst[0].via != "local"):
            want = "a local source, remote sources, a local destination"
        elif n == "rppkt" and (s != 1 or d < 1 or op.src[0].via != "local" or not remote(op.dst)):
            want = "one local packet source and remote destinations"
        elif n == "glres" and (s != 1 or d != 1 or op.src[0].via != "switch" or op.dst[0].via != "switch"):
            want = "one switch source and one switch destination"
        elif n in ("gstore", "gstorepkt") and (s != 1 or d != 1 or op.src[0].via != "local"
                                               or op.dst[0].via != "switch"):
            want = "one local source and one switch destination"
        elif n in ("recpkt", "recspkt") and d < 2:
            want = "a destination for the result and one for its packet copy"
        if want:
            self.fail(where, f"{op.where}: expects {want} (has {s} source(s), {d} destination(s))")
        # One op moves one size: its references name as many chunks each (a packet reduction
        # reads and sends as many as its first source, whatever the others say).
        sized = op.src[:1] + op.dst[:1] if n in ("respkt", "repkt", "recpkt", "recspkt") else op.src + op.dst
        if len({x.count for x in sized}) > 1:
            self.fail(where, f"{op.where}: its buffers differ in size ({', '.join(str(x.count) for x in op.src)} "
                      f"source and {', '.join(str(x.count) for x in op.dst)} destination chunks): an op moves "
                      "one size")


def smallest_size(plan: Plan) -> int:
    """A message size every rank's chunk counts divide in whole alignment units, each chunk a
    whole number of units for every member of the largest thread-block group: the alignment x
    the group x the ranks x the least common multiple of the chunk counts (for a "test" plan,
    the bytes of one chunk)."""
    from math import lcm
    tbg = 1
    for op in plan.all_ops():
        tbg = lcm(tbg, op.tbg[1])
    unit = plan.alignment * tbg
    if plan.collective == "test":
        return unit
    m = 1
    for r in plan.ranks:
        for chunks in (r.input_chunks, r.output_chunks):
            if chunks:
                m = lcm(m, chunks)
    return unit * plan.nranks * m
