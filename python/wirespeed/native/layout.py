"""The job's layout as one short text: which ranks share a host, every rank's open-file room and
job digest, as rank 0 publishes it in the store rendezvous (rendezvous.py) and every other rank
expands it.

Every rank needs the whole layout (the core computes the host groups and the stream count from
all of it, alike on every rank), so were every rank to read every rank's host record the job would
move N^2 records through the store (4 GB at 8,192 ranks). Instead rank 0 reads them once and
publishes this, whose size follows the layout's irregularity rather than the world size:

- hosts become labels (`h0`, `h1`, ... in order of each host's lowest rank: only equality
  matters to the core, hosts/layout.rs); their sequence is written as `["b", K]` when ranks fill
  hosts in blocks of K (the launchers' default), `["c", H]` when they are dealt round-robin over H
  hosts, else as runs `["r", [label, count, ...]]`;
- rooms and job digests become a table of the distinct values and the sequence of indices into
  it, as runs (one run when every rank publishes the same, the usual case).

So a blocked job's layout is ~100 bytes at any size; the worst (every rank different) is a few
bytes a rank.
"""
from __future__ import annotations

import json


def encode_seq(seq: list[int]) -> list:
    """`seq` (small ints) in the shortest of the three forms (see the module's opening)."""
    n = len(seq)
    runs: list[int] = []
    for v in seq:
        if runs and runs[-2] == v:
            runs[-1] += 1
        else:
            runs += [v, 1]
    labels, counts = runs[0::2], runs[1::2]
    if n and labels == list(range(len(labels))):
        k = counts[0]
        if all(c == k for c in counts[:-1]) and counts[-1] <= k:
            return ["b", k]
    distinct = max(seq) + 1 if seq else 0
    if 1 < distinct < n and all(v == r % distinct for r, v in enumerate(seq)):
        return ["c", distinct]
    return ["r", runs]


def decode_seq(enc: list, n: int) -> list[int]:
    kind, arg = enc
    if kind == "b":
        return [r // arg for r in range(n)]
    if kind == "c":
        return [r % arg for r in range(n)]
    if kind == "r":
        out: list[int] = []
        for v, c in zip(arg[0::2], arg[1::2]):
            out += [v] * c
        if len(out) != n:
            raise ValueError(f"a layout of {len(out)} ranks for a world of {n}")
        return out
    raise ValueError(f"not a layout sequence: {enc!r}")


def _indexed(values: list[str]) -> tuple[list[str], list[int]]:
    """The distinct values in order of first appearance, and each value's index among them."""
    table: dict[str, int] = {}
    idx = [table.setdefault(v, len(table)) for v in values]
    return list(table), idx


def encode(hosts: list[str], rooms: list[str], digests: list[str]) -> str:
    """The layout text for every rank's host id, room and job digest (each list one per rank)."""
    hosts_idx = _indexed(hosts)[1]
    rtab, ridx = _indexed(rooms)
    dtab, didx = _indexed(digests)
    return json.dumps({"n": len(hosts), "hosts": encode_seq(hosts_idx), "rooms": [rtab, encode_seq(ridx)],
                       "jobs": [dtab, encode_seq(didx)]}, separators=(",", ":"))


def decode(text: str, world: int) -> tuple[list[str], list[str], list[str]]:
    """(host labels, rooms, job digests), one per rank, from `encode`'s text."""
    d = json.loads(text)
    if d["n"] != world:
        raise ValueError(f"a layout for {d['n']} ranks in a world of {world}")
    hosts = [f"h{i}" for i in decode_seq(d["hosts"], world)]
    rtab, renc = d["rooms"]
    dtab, denc = d["jobs"]
    return hosts, [rtab[i] for i in decode_seq(renc, world)], [dtab[i] for i in decode_seq(denc, world)]
