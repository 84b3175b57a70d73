"""`bench --trace F.json`: every timed call of the run as a span, one track per rank, in the
Chrome/Perfetto format report/trace.py writes (docs/records.md, "Trace file").

While the loops run, each rank only appends clock readings to a list (time.perf_counter, the
harness's clock: CLOCK_MONOTONIC, which every process of a machine shares): per loop its start
and end, per call the moments it was entered and returned; per single call its start and the end
of its device sync. Without --trace the harness runs its loops as before and nothing is read
(harness.py keeps a loop without the readings); with it, each timed call also pays two clock
reads inside the loop (0.27-0.35 us a call on the 2-core development VM, by timeit), which the
loop times include. Each case's readings travel to rank 0 in the gather the harness makes anyway
at the end of the case (every rank has the same number of them: the loop count is agreed, the
iterations are the same), and rank 0 turns them into spans (report/trace.Spans) and writes the
merged file at the end.

Ranks on another machine (another boot id, so another monotonic clock) are shifted by the offset
measured once at the start: the median over a few barriers of rank 0's reading minus theirs,
which is as good as the barrier's exit skew. Ranks on rank 0's machine,
including emulated hosts, share its clock and are not shifted.

wirespeed's engine does not time the phases of an op (shared-memory stages, streams), and timing
them would put clock reads inside its hot path: the spans are calls, not phases.
"""
from __future__ import annotations

import statistics

from ..report.trace import Spans, merge, now_us, write

TRACK = "collectives"
OFFSET_ROUNDS = 5


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


class Trace:
    """One rank's side of a traced run; on rank 0 also every rank's spans."""

    def __init__(self, backend, rank: int, world: int, path: str):
        self.rank, self.world, self.path = rank, world, path
        self.spans = [Spans(r) for r in range(world)] if rank == 0 else []
        self.offset_us = self._offsets(backend)

    def _offsets(self, backend) -> dict[int, float]:
        """Rank -> microseconds to add to its readings to put them on rank 0's clock."""
        boots = backend.allgather_text(_boot_id())
        diffs = []
        for _ in range(OFFSET_ROUNDS):
            backend.barrier()
            diffs.append(now_us())
        rows = backend.allgather_floats(diffs)    # us, as Spans and merge take them
        return {r: (0.0 if boots[r] == boots[0] and boots[0] else
                    statistics.median(a - b for a, b in zip(rows[0], rows[r])))
                for r in range(self.world)}

    def add_case(self, rows: list[list[float]], loops: int, iters: int, singles: int, **args) -> None:
        """One case's readings of every rank (each row: `readings` floats, s) as spans, kept on
        rank 0. `args`: what every span of the case carries (collective, bytes, dtype, ...)."""
        if self.rank != 0:
            return
        args = {k: v for k, v in args.items() if v is not None}
        name = args["collective"]
        for r, row in enumerate(rows):
            sp = self.spans[r]
            us = [x * 1e6 for x in row]
            at = 0
            for k in range(loops):
                sp.span(f"{name} loop {k + 1}", us[at], us[at + 1 + 2 * iters], track=TRACK, cat="loop",
                        **args, loop=k + 1, calls=iters)
                at += 1
                for i in range(iters):
                    sp.span(name, us[at], us[at + 1], track=TRACK, cat="call", **args, loop=k + 1,
                            iteration=i + 1)
                    at += 2
                at += 1
            for i in range(singles):
                sp.span(name, us[at], us[at + 1], track=TRACK, cat="single call", **args, iteration=i + 1)
                at += 2

    def finish(self) -> int:
        """Rank 0: write the file; the number of spans in it."""
        trace = merge([s.as_data() for s in self.spans], self.offset_us)
        write(self.path, trace)
        return sum(1 for e in trace["traceEvents"] if e["ph"] == "X")
