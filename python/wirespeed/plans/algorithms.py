"""wirespeed's own collective algorithms, written as MSCCL++ execution plans (see writer.py).

Each function returns a plan dict for `nranks` ranks. The single-host ones use memory channels
(a rank reads and writes its peers' buffers itself); the ones named `_port` use port channels
(a proxy moves the data, as across hosts) and take `ranks_per_host`, which only sets how the
ring is laid out (ranks numbered host by host, so a ring crosses hosts once per host) and the
name. All are in place, laid out as MSCCL++'s executor test lays them out; where they can, they
write the output through `o` references, so the same ops are also right out of place.

Conventions every plan keeps, because the checker (and a real GPU) needs them:
- no rank writes into a peer's buffer before that peer has entered this run (a handshake
  signal/wait first): the peer may still be reading the last run's data there;
- data written in the kernel is read remotely only after a full signal -> wait;
- a rank reading its peers' buffers tells them when it is done (signal), so none leaves the
  kernel, and lets its caller reuse the buffer, while a peer still reads it;
- a port-channel put's source is not overwritten, nor the kernel left, before a flush. The
  flush rides on the last put of each channel (pwsf: put, signal, flush, which covers every
  earlier put on the channel), never a standalone `flush` op: MSCCL++'s executor (at the
  version read) takes a flush op's channel count from its outputs, which a flush has none of,
  so on a GPU a standalone flush does nothing;
- each scratch slot is written at most once per run, so no slot is overwritten while read.

`python -m wirespeed.plans.algorithms --out DIR` writes the test fixtures.
"""
from __future__ import annotations

import argparse
import json
import os

from .writer import I, O, S, PlanBuilder, Remote


def _peers(r: int, n: int) -> list[int]:
    return [p for p in range(n) if p != r]


def _slot(src: int, at: int) -> int:
    """Where rank `src`'s data lands in rank `at`'s scratch, one slot per peer (no slot for
    itself)."""
    return src if src < at else src - 1


def _name(base: str, nranks: int, ranks_per_host: int | None) -> str:
    if ranks_per_host is None:
        return f"{base}_{nranks}r"
    return f"{base}_{nranks}r_{nranks // ranks_per_host}h"


def _check_hosts(nranks: int, ranks_per_host: int):
    if nranks < 2 or ranks_per_host < 1 or nranks % ranks_per_host:
        raise ValueError(f"{nranks} ranks do not split into hosts of {ranks_per_host}")


# -- allreduce ---------------------------------------------------------------------------


def _ring_block(b: PlanBuilder, r: int, n: int):
    """Rank r's thread block of a port-channel ring, past its handshake: port channels to the
    next and previous ranks; it signals prev (r is in this run, so prev may put into it) and waits
    for next's signal (next is in, so r may put into it). Returns (next rank, block, channel to
    next, channel to prev)."""
    nxt, prv = (r + 1) % n, (r - 1) % n
    tb = b.threadblock(r)
    cn, cp = b.channel(r, nxt, "port"), b.channel(r, prv, "port")
    tb.signal(cp)
    tb.wait(cn)
    return nxt, tb, cn, cp


def allreduce_oneshot(nranks: int) -> dict:
    """One-shot allreduce on one host over memory channels (Simple protocol).

    Each rank has one thread block per peer p, and
    1. signals p and waits for p (relaxed): p has entered this run, so its scratch slot for us
       is no longer read by the last run;
    2. puts its whole input into p's scratch slot for it;
    3. signals p, then waits for p's signal: p's input now sits in our scratch;
    4. meets its sibling blocks at a barrier (every peer's data is in);
    5. reduces its input and the n-1 scratch slots into the output, each block one share of
       the chunk (thread-block group).
    """
    n = nranks
    b = PlanBuilder(_name("allreduce_oneshot", n, None), "allreduce", n)
    b.chunks(input=1, output=1, scratch=n - 1)
    for r in range(n):
        peers = _peers(r, n)
        for j, p in enumerate(peers):
            tb, ch = b.threadblock(r), b.channel(r, p, "memory")
            tb.signal(ch, relaxed=True)
            tb.wait(ch, relaxed=True)
            tb.put(I(0), Remote(p, "s", _slot(r, p)), ch)
            tb.signal(ch)
            tb.wait(ch)
            if len(peers) > 1:
                tb.barrier(0, len(peers))
            tb.reduce([I(0)] + [S(k) for k in range(n - 1)], O(0), tbg=(j, len(peers)))
    return b.to_json()


def allreduce_oneshot_ll(nranks: int) -> dict:
    """One-shot allreduce on one host with LL packets (no signals at all).

    Each rank, in one thread block,
    1. writes its input as packets into every peer's scratch slot for it (each packet carries
       this run's flag, and the double scratch buffer keeps the last run's packets apart);
    2. reduces its input with the n-1 packet slots of its own scratch into the output, each
       packet read waiting for its flag.
    """
    n = nranks
    b = PlanBuilder(_name("allreduce_oneshot_ll", n, None), "allreduce", n, protocol="LL")
    b.chunks(input=1, output=1, scratch=n - 1)
    for r in range(n):
        peers = _peers(r, n)
        tb = b.threadblock(r)
        for p in peers:
            b.channel(r, p, "memory")  # the packets go over it; the op names only the buffer
        tb.put_packets([I(0)] * len(peers), [Remote(p, "s", _slot(r, p)) for p in peers])
        tb.reduce_packets(I(0), [S(k) for k in range(n - 1)], O(0))
    return b.to_json()


def allreduce_rsag(nranks: int) -> dict:
    """Reduce-scatter + all-gather allreduce on one host over memory channels.

    The buffer is n chunks; rank r owns chunk r. Each rank has one thread block per peer p:
    1. relaxed signal/wait with p: p's input (written before the kernel) is there to read;
    2. barrier: every peer is in;
    3. reads chunk r of every peer and reduces it with its own chunk r into output chunk r
       (rre, split among the blocks);
    4. barrier: chunk r is complete;
    5. puts chunk r into p's output chunk r (only rank r ever reads or writes chunk r of a
       peer, and it read it in step 3), then signals p and waits for p's signal: p's chunk p
       is in our output, and p has done reading our input.
    """
    n = nranks
    b = PlanBuilder(_name("allreduce_rsag", n, None), "allreduce", n)
    b.chunks(input=n, output=n)
    for r, p, tb, ch in _read_reduce_own_chunk(b, n, out=O):
        tb.put(O(r), Remote(p, "o", r), ch)
        tb.signal(ch)
        tb.wait(ch)
    return b.to_json()


def _read_reduce_own_chunk(b: PlanBuilder, n: int, out):
    """Steps 1-4 of the one-host reduce-scatter both allreduce_rsag and reducescatter_direct
    start with: per rank r one thread block per peer p, a relaxed handshake with p, then chunk r
    of every peer's input read and reduced with r's own into `out(r)` (the blocks split it), a
    barrier on each side. Yields (r, p, block, channel) for the steps each plan adds after."""
    for r in range(n):
        peers = _peers(r, n)
        m = len(peers)
        for j, p in enumerate(peers):
            tb, ch = b.threadblock(r), b.channel(r, p, "memory")
            tb.signal(ch, relaxed=True)
            tb.wait(ch, relaxed=True)
            if m > 1:
                tb.barrier(0, m)
            tb.read_reduce(I(r), [Remote(q, "i", r) for q in peers], out(r), tbg=(j, m))
            if m > 1:
                tb.barrier(1, m)
            yield r, p, tb, ch


def allreduce_ring_port(nranks: int, ranks_per_host: int = 1) -> dict:
    """Ring allreduce over port channels (across hosts): 2(n-1) steps.

    The buffer is n chunks. Scratch has n-1 slots for the reduce-scatter and n-1 for the
    all-gather, each written once, so the proxy's writes never land on data still in use.
    next = r+1, prev = r-1 (mod n). Two thread blocks per rank, one per phase, each with its
    own pair of channels to next and prev (the executor takes 64 ops a block, which one
    block doing both phases passes at 8 ranks).
    Reduce-scatter block:
    0. signal prev (our scratch is free for this run), wait for next's.
    For step s = 0..n-2:
    1. put+signal chunk (r-s) to next's RS slot s: our input chunk r at s=0, afterwards the
       partial sum that step s-1 left in our RS slot s-1;
    2. wait for prev's signal: its chunk (r-1-s) is in our RS slot s;
    3. add our input chunk (r-1-s) into that slot; at the last step the sum is complete and
       goes into output chunk (r+1) instead.
    4. barrier with the all-gather block.
    The last put flushes (pwsf): the all-gather overwrites input chunk r, read at step 0.
    All-gather block: barrier, then for step s = 0..n-2:
    5. put+signal chunk (r+1-s) to next's AG slot s: from our output at s=0, afterwards the
       AG slot received at step s-1;
    6. wait for prev: chunk (r-s) is in our AG slot s; copy it into output chunk (r-s).
    The last put flushes, so no source changes, nor is the kernel left, before the proxy has
    read it.
    """
    n = nranks
    _check_hosts(n, ranks_per_host)
    b = PlanBuilder(_name("allreduce_ring_port", n, ranks_per_host), "allreduce", n)
    b.chunks(input=n, output=n, scratch=2 * (n - 1))
    ag = n - 1  # first all-gather slot
    for r in range(n):
        nxt, prv = (r + 1) % n, (r - 1) % n
        rs, tb = b.threadblock(r), b.threadblock(r)
        cn, cp = b.channel(r, nxt, "port", k=0), b.channel(r, prv, "port", k=0)
        rs.signal(cp)
        rs.wait(cn)
        for s in range(n - 1):
            rs.put(I(r) if s == 0 else S(s - 1), Remote(nxt, "s", s), cn, signal=True, flush=s == n - 2)
            rs.wait(cp)
            c = (r - 1 - s) % n
            rs.reduce([I(c), S(s)], S(s) if s < n - 2 else O(c))
        rs.barrier(0, 2)
        cn, cp = b.channel(r, nxt, "port", k=1), b.channel(r, prv, "port", k=1)
        tb.barrier(0, 2)
        for s in range(n - 1):
            tb.put(O((r + 1) % n) if s == 0 else S(ag + s - 1), Remote(nxt, "s", ag + s), cn, signal=True,
                   flush=s == n - 2)
            tb.wait(cp)
            tb.copy(S(ag + s), O((r - s) % n))
    return b.to_json()


# -- allgather ---------------------------------------------------------------------------


def allgather_direct(nranks: int) -> dict:
    """Allgather on one host over memory channels, in place (the input is output chunk r).

    One thread block per peer p:
    1. relaxed signal/wait with p: p has entered this run, its output may be written;
    2. put our input into p's output chunk r;
    3. signal p, wait for p's signal: p's chunk is in our output chunk p.
    """
    n = nranks
    b = PlanBuilder(_name("allgather_direct", n, None), "allgather", n)
    b.chunks(input=1, output=n)
    for r in range(n):
        for p in _peers(r, n):
            tb, ch = b.threadblock(r), b.channel(r, p, "memory")
            tb.signal(ch, relaxed=True)
            tb.wait(ch, relaxed=True)
            tb.put(I(0), Remote(p, "o", r), ch)
            tb.signal(ch)
            tb.wait(ch)
    return b.to_json()


def allgather_ring_port(nranks: int, ranks_per_host: int = 1) -> dict:
    """Ring allgather over port channels, in place: n-1 steps, one thread block per rank.

    0. signal prev (our output may be written), wait for next's.
    Step s = 0..n-2:
    1. put+signal chunk (r-s) into next's output chunk (r-s): our input at s=0, afterwards the
       chunk received at step s-1 (next forwards a chunk only after receiving it, so it never
       reads the chunk we write);
    2. wait for prev: chunk (r-1-s) is in our output.
    The last put flushes (pwsf) before the kernel is left.
    """
    n = nranks
    _check_hosts(n, ranks_per_host)
    b = PlanBuilder(_name("allgather_ring_port", n, ranks_per_host), "allgather", n)
    b.chunks(input=1, output=n)
    for r in range(n):
        nxt, tb, cn, cp = _ring_block(b, r, n)
        for s in range(n - 1):
            c = (r - s) % n
            tb.put(I(0) if s == 0 else O(c), Remote(nxt, "o", c), cn, signal=True, flush=s == n - 2)
            tb.wait(cp)
    return b.to_json()


# -- reducescatter -----------------------------------------------------------------------


def reducescatter_direct(nranks: int) -> dict:
    """Reduce-scatter on one host over memory channels, in place (output = input chunk r).

    One thread block per peer p:
    1. relaxed signal/wait with p: p's input is there to read;
    2. barrier: every peer is in;
    3. read chunk r of every peer, add our own, write the output (rre, split among blocks);
    4. barrier: every block is done reading;
    5. signal p, wait for p: neither leaves while the other still reads its input.
    """
    n = nranks
    b = PlanBuilder(_name("reducescatter_direct", n, None), "reducescatter", n)
    b.chunks(input=n, output=1)
    for _, _, tb, ch in _read_reduce_own_chunk(b, n, out=lambda r: O(0)):
        tb.signal(ch)
        tb.wait(ch)
    return b.to_json()


def reducescatter_ring_port(nranks: int, ranks_per_host: int = 1) -> dict:
    """Ring reduce-scatter over port channels: n-1 steps, one thread block per rank.

    Partial sums live in scratch (n-1 slots, one per step), so the input is only read.
    0. signal prev (our scratch is free), wait for next's.
    Step s = 0..n-2:
    1. put+signal chunk (r-1-s) into next's slot s: our input chunk at s=0, afterwards the
       partial sum in our slot s-1;
    2. wait for prev: its partial sum of chunk (r-2-s) is in our slot s;
    3. add our input chunk (r-2-s) into the slot; at the last step that chunk is r, and the
       sum goes to the output.
    The last put flushes (pwsf) before the kernel is left.
    """
    n = nranks
    _check_hosts(n, ranks_per_host)
    b = PlanBuilder(_name("reducescatter_ring_port", n, ranks_per_host), "reducescatter", n)
    b.chunks(input=n, output=1, scratch=n - 1)
    for r in range(n):
        nxt, tb, cn, cp = _ring_block(b, r, n)
        for s in range(n - 1):
            tb.put(I((r - 1) % n) if s == 0 else S(s - 1), Remote(nxt, "s", s), cn, signal=True,
                   flush=s == n - 2)
            tb.wait(cp)
            c = (r - 2 - s) % n
            tb.reduce([I(c), S(s)], S(s) if s < n - 2 else O(0))
    return b.to_json()


# -- alltoall ----------------------------------------------------------------------------


def alltoall_direct(nranks: int) -> dict:
    """Alltoall on one host over memory channels, in place (n chunks; chunk p goes to rank p).

    Incoming chunks land in scratch first (one slot per peer) because in place our chunk p is
    still to be sent when p's arrives. One thread block per peer p:
    1. relaxed signal/wait with p: p's scratch slot for us is free;
    2. put our chunk p into p's slot for us;
    3. signal p, wait for p: p's chunk r is in our slot for p;
    4. copy it into our output chunk p (we sent chunk p in step 2).
    """
    n = nranks
    b = PlanBuilder(_name("alltoall_direct", n, None), "alltoall", n)
    b.chunks(input=n, output=n, scratch=n - 1)
    for r in range(n):
        for p in _peers(r, n):
            tb, ch = b.threadblock(r), b.channel(r, p, "memory")
            tb.signal(ch, relaxed=True)
            tb.wait(ch, relaxed=True)
            tb.put(I(p), Remote(p, "s", _slot(r, p)), ch)
            tb.signal(ch)
            tb.wait(ch)
            tb.copy(S(_slot(p, r)), O(p))
    return b.to_json()


def alltoall_port(nranks: int, ranks_per_host: int = 1) -> dict:
    """Alltoall over port channels, in place; one thread block per peer p:

    1. signal p, wait for p: p's scratch slot for us is free;
    2. put+signal+flush our chunk p into p's slot for us (the flush: the proxy has read our
       chunk p, which step 4 overwrites);
    3. wait for p: its chunk r is in our slot for p;
    4. copy the slot into our output chunk p.
    """
    n = nranks
    _check_hosts(n, ranks_per_host)
    b = PlanBuilder(_name("alltoall_port", n, ranks_per_host), "alltoall", n)
    b.chunks(input=n, output=n, scratch=n - 1)
    for r in range(n):
        for p in _peers(r, n):
            tb, ch = b.threadblock(r), b.channel(r, p, "port")
            tb.signal(ch)
            tb.wait(ch)
            tb.put(I(p), Remote(p, "s", _slot(r, p)), ch, signal=True, flush=True)
            tb.wait(ch)
            tb.copy(S(_slot(p, r)), O(p))
    return b.to_json()


# -- sendrecv ----------------------------------------------------------------------------


def sendrecv_ring_port(nranks: int, ranks_per_host: int = 1) -> dict:
    """Each rank sends its input to the next rank's output (a ring), over port channels.

    1. signal prev (our output may be written), wait for next's;
    2. put+signal+flush our input into next's output (the flush: the caller may change the
       input once the kernel is left);
    3. wait for prev: its input is in our output.
    """
    n = nranks
    _check_hosts(n, ranks_per_host)
    b = PlanBuilder(_name("sendrecv_ring_port", n, ranks_per_host), "sendrecv", n, inplace=False)
    b.chunks(input=1, output=1)
    for r in range(n):
        nxt, tb, cn, cp = _ring_block(b, r, n)
        tb.put(I(0), Remote(nxt, "o", 0), cn, signal=True, flush=True)
        tb.wait(cp)
    return b.to_json()


ONE_HOST = [allreduce_oneshot, allreduce_oneshot_ll, allreduce_rsag, allgather_direct, reducescatter_direct,
            alltoall_direct]
ACROSS_HOSTS = [allreduce_ring_port, allgather_ring_port, reducescatter_ring_port, alltoall_port,
                sendrecv_ring_port]


# The most ranks a built-in plan is written for: writing takes seconds at 128 ranks (alltoall_port's
# ops grow with the square of the ranks: 17 s at 256), and no check of more would fit in memory.
MAX_BUILTIN_RANKS = 128


def builtin(name: str, nranks: int, ranks_per_host: int | None = None) -> dict:
    """A plan of wirespeed's own by its function's name (`allreduce_ring_port`, or with dashes),
    for `plan check wirespeed:NAME --ranks N`; a ValueError names the choices."""
    funcs = {f.__name__: f for f in ONE_HOST + ACROSS_HOSTS}
    f = funcs.get(name.replace("-", "_"))
    if f is None:
        raise ValueError(f"no built-in plan {name!r}; built in: {', '.join(sorted(funcs))}")
    if nranks > MAX_BUILTIN_RANKS:
        raise ValueError(f"--ranks {nranks}: wirespeed's own plans are written for at most {MAX_BUILTIN_RANKS} "
                         "ranks (MAX_BUILTIN_RANKS)")
    if f in ACROSS_HOSTS:
        return f(nranks, ranks_per_host=ranks_per_host or 1)
    if ranks_per_host not in (None, nranks):
        raise ValueError(f"{f.__name__} is a one-host plan: --ranks-per-host must be --ranks or unset")
    return f(nranks)


def fixtures() -> dict[str, dict]:
    """Every plan the tests keep, by file name: one-host plans for 2, 4 and 8 ranks, port
    plans for 2 and 4 hosts of 1 and 2 ranks."""
    out = {}
    for f in ONE_HOST:
        for n in (2, 4, 8):
            plan = f(n)
            out[plan["name"] + ".json"] = plan
    for f in ACROSS_HOSTS:
        for hosts in (2, 4):
            for rph in (1, 2):
                plan = f(hosts * rph, ranks_per_host=rph)
                out[plan["name"] + ".json"] = plan
    return out


def dump(plan: dict, width: int = 120) -> str:
    """The text a fixture file holds: indented JSON, with any object or list that fits in
    `width` columns on one line (an op per line, so a diff of two plans reads op by op)."""
    def fmt(v, indent: int) -> str:
        flat = json.dumps(v)
        if not isinstance(v, (dict, list)) or indent + len(flat) <= width:
            return flat
        pad = " " * (indent + 1)
        if isinstance(v, dict):
            items = [f"{pad}{json.dumps(k)}: {fmt(x, indent + 1)}" for k, x in v.items()]
            return "{\n" + ",\n".join(items) + "\n" + " " * indent + "}"
        return "[\n" + ",\n".join(pad + fmt(x, indent + 1) for x in v) + "\n" + " " * indent + "]"
    return fmt(plan, 0) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="folder to write the plans into")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    for fname, plan in fixtures().items():
        with open(os.path.join(args.out, fname), "w") as f:
            f.write(dump(plan))
    print(f"wrote {len(fixtures())} plans to {args.out}")


if __name__ == "__main__":
    main()
