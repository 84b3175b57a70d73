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


def read_json(path: str, label: str, what: str = "file", error=None):
    """The JSON object in `path`; a missing file, bad JSON or an unreadable one is one line
    (`error`, a PlanError unless given) starting with `label`."""
    error = error or PlanError
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        raise error(f"{label}: no such {what}") from None
    except json.JSONDecodeError as e:
        raise error(f"{label}: not JSON ({e.msg} at line {e.lineno})") from None
    except OSError as e:
        raise error(f"{label}: cannot read it ({e.strerror})") from None


def load(path: str) -> Plan:
    """Read a plan file; a missing file, bad JSON or a plan wirespeed cannot read is a PlanError."""
    return parse(read_json(path, path, "plan file"), source=path)


def parse(obj, source: str = "plan") -> Plan:
    """A Plan from the JSON object, every field known and every index resolved."""
    return _Reader(source).plan(obj)


class _Reader:
    def __init__(self, source: str):
        self.source = source

    def fail(self, where: str, msg: str):
        raise PlanError(f"{self.source}: {where}: {msg}")

    def fields(self, obj, allowed: set, where: str, required=()):
        if not isinstance(obj, dict):
            self.fail(where, f"expected an object, got {type(obj).__name__}")
        for k in obj:
            if k not in allowed:
                self.fail(where, f"unknown field {k!r} (wirespeed reads: {', '.join(sorted(allowed))}); "
                          "a newer MSCCL++ format? see docs/plans.md")
        for k in required:
            if k not in obj:
                self.fail(where, f"missing field {k!r}")

    def integer(self, obj, key, where, minimum=0, default=None):
        v = obj.get(key, default)
        if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
            self.fail(where, f"{key} must be a whole number >= {minimum}, got {v!r}")
        return v

    def plan(self, obj) -> Plan:
        self.fields(obj, _TOP_FIELDS, "top level", required=("name", "collective", "protocol", "gpus"))
        coll = obj["collective"]
        if coll not in COLLECTIVES:
            self.fail("collective", f"unknown collective {coll!r} (known: {', '.join(COLLECTIVES)})")
        proto = obj["protocol"]
        if proto not in ("Simple", "LL"):
            self.fail("protocol", f"unknown protocol {proto!r} (Simple or LL)")
        gpus = obj["gpus"]
        if not isinstance(gpus, list) or not gpus:
            self.fail("gpus", "must be a non-empty list")
        for r, g in enumerate(gpus):
            if not isinstance(g, dict) or g.get("id") != r:
                self.fail(f"gpus[{r}]", f"id must be {r} (gpus are listed in rank order)")
        plan = Plan(name=str(obj["name"]), collective=coll, protocol=proto,
                    inplace=bool(obj.get("inplace", False)), ranks=[],
                    alignment=self.integer(obj, "buffer_alignment", "buffer_alignment", 1, 16),
                    double_scratch=bool(obj.get("use_double_scratch_buffer", False)),
                    reuse_resources=bool(obj.get("reuse_resources", False)),
                    min_size=self.integer(obj, "min_message_size", "min_message_size", 0, 0),
                    max_size=self.integer(obj, "max_message_size", "max_message_size", 0, 2**64 - 1),
                    source=self.source)
        if plan.alignment % 4:
            self.fail("buffer_alignment", f"{plan.alignment} is not a multiple of 4 bytes")
        # Channels and remote buffers of every rank first: ops refer to other ranks' channels
        # (pairs) and a remote buffer names its owner.
        self.remote = []
        for r, g in enumerate(gpus):
            self.fields(g, _GPU_FIELDS, f"gpus[{r}]", required=("input_chunks", "output_chunks",
                                                                "scratch_chunks", "threadblocks"))
            rp = RankPlan(id=r, input_chunks=self.integer(g, "input_chunks", f"gpus[{r}]"),
                          output_chunks=self.integer(g, "output_chunks", f"gpus[{r}]"),
                          scratch_chunks=self.integer(g, "scratch_chunks", f"gpus[{r}]"))
            self.channels(rp, g.get("channels", []), len(gpus))
            self.remote.append(self.remote_buffers(r, g.get("remote_buffers", []), len(gpus)))
            for i, s in enumerate(g.get("semaphores", [])):
                self.fields(s, {"init_value"}, f"gpus[{r}].semaphores[{i}]")
                rp.semaphores.append(self.integer(s, "init_value", f"gpus[{r}].semaphores[{i}]", 0, 0))

            plan.ranks.append(rp)
        self.pair_channels(plan)
        for r, g in enumerate(gpus):
            tbs = g["threadblocks"]
            if not isinstance(tbs, list):
                self.fail(f"gpus[{r}].threadblocks", "must be a list")
            for t, tb in enumerate(tbs):
                if not isinstance(tb, dict) or tb.get("id") != t:
                    self.fail(f"gpus[{r}].threadblocks[{t}]", f"id must be {t}")
                plan.ranks[r].threadblocks.append(self.threadblock(plan, r, t, tb))
        return plan

    def channels(self, rp: RankPlan, chans, nranks: int):
        for i, c in enumerate(chans):
            where = f"gpus[{rp.id}].channels[{i}]"
            ctype = c.get("channel_type") if isinstance(c, dict) else None
            if ctype == "switch":
                self.fields(c, {"channel_type", "buffer_type", "rank_groups"}, where,
                            required=("buffer_type", "rank_groups"))
                buf = self.buffer_name(c["buffer_type"], where)
                for j, grp in enumerate(c["rank_groups"]):
                    self.fields(grp, {"size", "ranks"}, f"{where}.rank_groups[{j}]", required=("ranks",))
                    ranks = tuple(grp["ranks"])
                    for p in ranks:
                        if not isinstance(p, int) or not 0 <= p < nranks:
                            self.fail(where, f"switch group names rank {p!r}: the plan has {nranks} ranks")
                    if rp.id not in ranks:
                        self.fail(where, f"switch group {list(ranks)} does not include its own rank {rp.id}")
                    rp.switches.append(SwitchGroup(buf, ranks, int(grp.get("size", len(ranks)))))
            elif ctype in ("memory", "port"):
                self.fields(c, {"channel_type", "connected_to"}, where, required=("connected_to",))
                for p in c["connected_to"]:
                    if not isinstance(p, int) or not 0 <= p < nranks or p == rp.id:
                        self.fail(where, f"connected_to names rank {p!r}: a peer must be another of the "
                                  f"plan's {nranks} ranks")
                    lst = rp.channels[ctype]
                    lst.append(Channel(ctype, p, len(lst)))
            else:
                self.fail(where, f"unknown channel_type {ctype!r} (memory, port or switch)")

    def buffer_name(self, code, where) -> str:
        if code not in BUFFERS:
            self.fail(where, f"unknown buffer type {code!r} (i, o or s)")
        return BUFFERS[code]

    def remote_buffers(self, r, bufs, nranks):
        out = []
        for i, b in enumerate(bufs):
            where = f"gpus[{r}].remote_buffers[{i}]"
            self.fields(b, {"rank", "type", "access_channel_types"}, where, required=("rank", "type"))
            owner = b["rank"]
            if not isinstance(owner, int) or not 0 <= owner < nranks or owner == r:
                self.fail(where, f"rank {owner!r} is not another of the plan's {nranks} ranks")
            access = tuple(b.get("access_channel_types", ()))
            for a in access:
                if a not in ("memory", "port"):
                    self.fail(where, f"unknown access channel type {a!r} (memory or port)")
            out.append((owner, self.buffer_name(b["type"], where), access))
        return out

    def pair_channels(self, plan: Plan):
        """The k-th channel of a type from r to p pairs with the k-th from p to r. Where p lists
        fewer, the executor makes the missing ones on p (unused by p's ops): so does this, and a
        signal into one is simply never waited for, while a wait on one can never end (a deadlock
        the checker names)."""
        for rp in plan.ranks:
            for ctype in ("memory", "port"):
                seen: dict[int, int] = {}
                for ch in list(rp.channels[ctype]):
                    if ch.implicit:
                        continue
                    k = seen.get(ch.peer, 0)
                    seen[ch.peer] = k + 1
                    peer = plan.ranks[ch.peer].channels[ctype]
                    theirs = [c for c in peer if c.peer == rp.id]
                    if k >= len(theirs):
                        peer.append(Channel(ctype, rp.id, len(peer), implicit=True))
                        theirs.append(peer[-1])
                    ch.pair = theirs[k].number
                    theirs[k].pair = ch.number

    def threadblock(self, plan: Plan, r: int, t: int, tb) -> list[Op]:
        where = f"gpus[{r}].threadblocks[{t}]"
        self.fields(tb, _TB_FIELDS, where, required=("ops",))
        local = {"memory": [], "port": [], "switch": []}
        for i, c in enumerate(tb.get("channels", [])):
            self.fields(c, {"channel_type", "channel_ids", "buff"}, f"{where}.channels[{i}]",
                        required=("channel_type", "channel_ids"))
            ctype = c["channel_type"]
            if ctype not in local:
                self.fail(f"{where}.channels[{i}]", f"unknown channel_type {ctype!r}")
            have = len(plan.ranks[r].switches) if ctype == "switch" else len(plan.ranks[r].channels[ctype])
            for cid in c["channel_ids"]:
                if not isinstance(cid, int) or not 0 <= cid < have:
                    self.fail(f"{where}.channels[{i}]", f"{ctype} channel {cid!r} does not exist "
                              f"(rank {r} has {have})")
                local[ctype].append(cid)
        refs = {"memory": [], "port": []}
        for i, rb in enumerate(tb.get("remote_buffer_refs", [])):
            self.fields(rb, {"access_channel_type", "remote_buffer_ids"}, f"{where}.remote_buffer_refs[{i}]",
                        required=("access_channel_type", "remote_buffer_ids"))
            a = rb["access_channel_type"]
            if a not in refs:
                self.fail(f"{where}.remote_buffer_refs[{i}]", f"unknown access channel type {a!r}")
            for bid in rb["remote_buffer_ids"]:
                if not isinstance(bid, int) or not 0 <= bid < len(self.remote[r]):
                    self.fail(f"{where}.remote_buffer_refs[{i}]", f"remote buffer {bid!r} does not exist "
                              f"(rank {r} lists {len(self.remote[r])})")
                refs[a].append(self.remote[r][bid])
        ctx = (plan, r, t, local, refs)
        ops = tb["ops"]
        if not isinstance(ops, list):
            self.fail(where, "ops must be a list")
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
        if name not in OPS:
            self.fail(where, f"unknown operation {name!r} (rank {r}, tb {t}, op {i}); wirespeed knows: "
                      f"{', '.join(OPS)}")
        label = f"rank {r}, tb {t}, op {i} ({name})"
        ctype = o.get("channel_type", "none")
        if ctype not in CHANNEL_TYPES:
            self.fail(where, f"unknown channel_type {ctype!r}")
        chans = ()
        if "channel_ids" in o:
            if ctype not in ("memory", "port"):
                self.fail(where, f"{label}: channel_ids need a memory or port channel_type, got {ctype!r}")
            ids = o["channel_ids"]
            for c in ids:
                if not isinstance(c, int) or not 0 <= c < len(local[ctype]):
                    self.fail(where, f"{label}: {ctype} channel {c!r} is not among the thread block's "
                              f"{len(local[ctype])}")
            chans = tuple(local[ctype][c] for c in ids)
        elif ctype == "port" and name in ("put", "pws", "pwsf", "ppkt", "rppkt") and local["port"]:
            # The executor zero-fills an op's channel indexes: without channel_ids every
            # destination goes through the thread block's first port channel.
            chans = (local["port"][0],) * max(1, len(o.get("dst_buff", ())))
        tbg = (0, 1)
        if "tbg_info" in o:
            g = o["tbg_info"]
            self.fields(g, {"tb_id", "tbg_size"}, where, required=("tb_id", "tbg_size"))
            tbg = (self.integer(g, "tb_id", where), self.integer(g, "tbg_size", where, 1))
            if tbg[0] >= tbg[1]:
                self.fail(where, f"{label}: tbg_info tb_id {tbg[0]} is not below tbg_size {tbg[1]}")
        if o.get("reduce_op", "sum") not in REDUCE_OPS:
            self.fail(where, f"{label}: reduce_op {o['reduce_op']!r} is not supported (sum)")
        src = tuple(self.ref(ctx, b, ctype, f"{where}.src_buff[{k}]", label) for k, b in enumerate(o.get("src_buff", ())))
        dst = tuple(self.ref(ctx, b, ctype, f"{where}.dst_buff[{k}]", label) for k, b in enumerate(o.get("dst_buff", ())))
        kw = {}
        if name == "barrier":
            kw["barrier_id"] = self.integer(o, "barrier_id", where)
            kw["barrier_count"] = self.integer(o, "num_threadblocks", where, 1)
        if name in ("sem_acquire", "sem_release"):
            ids = o.get("semaphore_ids", [])
            for s in ids:
                if not isinstance(s, int) or not 0 <= s < len(plan.ranks[r].semaphores):
                    self.fail(where, f"{label}: semaphore {s!r} does not exist (rank {r} has "
                              f"{len(plan.ranks[r].semaphores)})")
            kw["semaphores"] = tuple(ids)
        if name == "pipeline":
            if in_pipeline:
                self.fail(where, f"{label}: a pipeline inside a pipeline")
            it = o.get("iter_context")
            self.fields(it, {"unit_size", "num_chunks"}, where + ".iter_context",
                        required=("unit_size", "num_chunks"))
            kw["unit_size"] = self.integer(it, "unit_size", where, 1)
            kw["pipeline_chunks"] = self.integer(it, "num_chunks", where, 1)
            kw["inner"] = tuple(self.op(ctx, i, inner, f"{where}.ops[{j}]", True)
                                for j, inner in enumerate(o.get("ops", [])))
            if not kw["inner"]:
                self.fail(where, f"{label}: an empty pipeline")
        op = Op(name=name, where=label if not in_pipeline else label.replace(")", ", in a pipeline)"),
                rank=r, tb=t, index=i, channel_type=ctype, channels=chans, src=src, dst=dst, tbg=tbg, **kw)
        self.shape(op, where)
        return op

    def ref(self, ctx, b, ctype, where, label) -> Ref:
        plan, r, t, local, refs = ctx
        self.fields(b, _BUFF_FIELDS, where, required=("index", "size"))
        index = self.integer(b, "index", where)
        count = self.integer(b, "size", where, 1)
        if "switch_channel_id" in b:
            sid = b["switch_channel_id"]
            if not isinstance(sid, int) or not 0 <= sid < len(local["switch"]):
                self.fail(where, f"{label}: switch channel {sid!r} is not among the thread block's "
                          f"{len(local['switch'])}")
            grp = plan.ranks[r].switches[local["switch"][sid]]
            return Ref(r, grp.buffer, index, count, "switch", grp.ranks)
        if "buffer_id" in b:
            if ctype not in ("memory", "port"):
                self.fail(where, f"{label}: a remote buffer_id needs a memory or port channel_type")
            bid = b["buffer_id"]
            if not isinstance(bid, int) or not 0 <= bid < len(refs[ctype]):
                self.fail(where, f"{label}: remote buffer {bid!r} is not among the thread block's "
                          f"{len(refs[ctype])} reached by {ctype} channels")
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
            self.fail(where, f"{label}: a local buffer of rank {b['rank']!r} in rank {r}'s op")
        return Ref(r, self.buffer_name(b["type"], where), index, count)

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
