"""Races in a plan, by happens-before, not by timing luck.

Every thread (thread block, proxy, host) carries two vector clocks (interpret.Token): `vc`, the
order of execution that every sync gives, and `vis`, the order in which writes are known to be
visible, which a relaxed signal/wait does not carry. Two accesses to one word conflict when at
least one writes; they race when neither is ordered before the other:

- read after write (RAW): the reader must have the writer's epoch in `vis`, or it may read the
  old value (a chunk read before the signal that guards it);
- write after write (WAW): the same, or the two writes may land in either order;
- write after read (WAR): the writer must have the reader's epoch in `vc`, or it may overwrite a
  chunk the peer has not read yet (a put into a slot before the peer is done with it).

This is the FastTrack idea: per word the last write's epoch (thread, clock), and the reads since
it, kept as ranges. A write that is ordered after a read range it covers retires that range: any
later write ordered after this one is ordered after the read too, and one that is not races with
this write and is reported as such. Because the pairings that create the order are the same in
every schedule (interpret.py), a race found here exists in some real schedule, and a plan with
none here has none in any.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from .layout import Span

_RUN = re.compile(r"run \d+")


@dataclass
class Race:
    kind: str          # "read-after-write" | "write-after-write" | "write-after-read"
    rank: int          # whose memory
    words: tuple[int, int]
    first: str         # the earlier access (op)
    second: str        # the later one
    relaxed: bool = False   # ordered, but only through a relaxed signal: visibility not promised
    between_runs: bool = False   # the two accesses belong to different runs of the plan
    same_block: bool = False     # two ops of one thread block with no nop between them

    def __str__(self):
        what = {"read-after-write": "reads words that {first} wrote, with no signal/wait (or packet "
                "flag) ordering the write before it",
                "write-after-write": "writes words that {first} also writes, in no fixed order",
                "write-after-read": "overwrites words that {first} reads, which may not have read them yet"}
        if self.same_block:
            return (f"race ({self.kind}) in rank {self.rank}'s memory, words {self.words[0]}.."
                    f"{self.words[1] - 1}: {self.second} and {self.first} are ops of one thread block "
                    "with no nop (__syncthreads) between them: different GPU threads may run them in "
                    "either order")
        if self.between_runs:
            return (f"between runs ({self.kind}) in rank {self.rank}'s memory, words {self.words[0]}.."
                    f"{self.words[1] - 1}: {self.second} is not ordered after {self.first} of the "
                    "previous run: right for one call, unsafe back to back unless the caller separates "
                    "the runs (a flush or a final signal/wait in the plan fixes it)")
        if self.relaxed:
            return (f"relaxed ({self.kind}) in rank {self.rank}'s memory, words {self.words[0]}.."
                    f"{self.words[1] - 1}: {self.second} is ordered after {self.first} only through a "
                    "relaxed signal, which does not make the data visible (a full signal, or a fence)")
        return (f"race ({self.kind}) in rank {self.rank}'s memory, words {self.words[0]}..{self.words[1] - 1}: "
                f"{self.second} " + what[self.kind].format(first=self.first))


class HazardTracker:
    """The machine's observer: sees every access, keeps the shadow state, collects races."""

    def __init__(self, arena_words: list[int], limit: int = 20):
        self.w_tid = [np.full(n, -1, dtype=np.int64) for n in arena_words]
        self.w_clk = [np.zeros(n, dtype=np.int64) for n in arena_words]
        self.w_where: list[dict[int, str]] = [dict() for _ in arena_words]   # tid*2**32+clk -> op
        self.reads: list[list] = [[] for _ in arena_words]   # per rank: [start, end, tid, clk, where]
        self.races: list[Race] = []
        self.relaxed: list[Race] = []   # ordered only through relaxed signals: warnings
        self.between: list[Race] = []   # unordered across two runs: warnings
        self.w_run = [np.zeros(n, dtype=np.int64) for n in arena_words]
        self.seen: set = set()
        self.limit = limit

    def report(self, kind, rank, lo, hi, first, second, relaxed=False, between=False, nop=False):
        # One line per pair of ops, whichever run met it (the host's accesses name their run).
        key = (kind, _RUN.sub("run", first), _RUN.sub("run", second))
        into = self.between if between else self.relaxed if relaxed else self.races
        if key in self.seen or len(into) >= self.limit:
            return
        self.seen.add(key)
        into.append(Race(kind, rank, (lo, hi), first, second, relaxed and not between, between, nop))

    def access(self, t, span: Span, write: bool, where: str) -> None:
        r, lo, hi = span.rank, span.start, span.end
        if hi <= lo:
            return
        wt = self.w_tid[r][lo:hi]
        wc = self.w_clk[r][lo:hi]
        cur = int(t.vc[t.tid])
        # A packet read waited for its packets' flags: the write it reads is ordered before it.
        mask = (wt >= 0) if (write or not span.packets) else np.zeros(len(wt), dtype=bool)
        # The same thread block's earlier op in the same segment (no nop between) is not ordered
        # before this one: different GPU threads may do the two.
        own = mask & (wt == t.tid)
        if own.any():
            same_seg = own & (wc >= t.seg_start) & (wc != cur) & (wc > t.self_known)
            if same_seg.any():
                i = int(np.argmax(same_seg))
                first = self.w_where[r].get(int(wt[i]) * 2**32 + int(wc[i]), "an earlier op")
                self.report("write-after-write" if write else "read-after-write", r, lo + i,
                            lo + i + int(same_seg[i:].sum()), first, where, nop=True)
            mask = mask & (wt != t.tid)
        if mask.any():
            # Unordered with the last write: t's visibility clock has not reached it.
            idx = np.where(mask, wt, 0)
            bad = mask & (t.vis[idx] < wc)
            if bad.any():
                i = int(np.argmax(bad))
                first = self.w_where[r].get(int(wt[i]) * 2**32 + int(wc[i]), "an earlier write")
                self.report("write-after-write" if write else "read-after-write", r, lo + i,
                            lo + i + int(bad[i:].sum()), first, where,
                            relaxed=bool(t.vc[int(wt[i])] >= wc[i]),
                            between=int(self.w_run[r][lo + i]) != t.run)
        if write:
            keep = []
            for rec in self.reads[r]:
                s, e, tid, clk, rwhere, rrun = rec
                if e <= lo or s >= hi:
                    keep.append(rec)
                    continue
                if tid == t.tid:
                    if t.seg_start <= clk != cur and clk > t.self_known:
                        self.report("write-after-read", r, max(s, lo), min(e, hi), rwhere, where, nop=True)
                    keep.append(rec)
                    continue
                if t.vc[tid] < clk:
                    self.report("write-after-read", r, max(s, lo), min(e, hi), rwhere, where,
                                between=rrun != t.run)
                    keep.append(rec)
                elif not (s >= lo and e <= hi):
                    keep.append(rec)
            self.reads[r] = keep
            clk = int(t.vc[t.tid])
            self.w_tid[r][lo:hi] = t.tid
            self.w_clk[r][lo:hi] = clk
            self.w_run[r][lo:hi] = t.run
            self.w_where[r][t.tid * 2**32 + clk] = where
        else:
            self.reads[r].append([lo, hi, t.tid, int(t.vc[t.tid]), where, t.run])
