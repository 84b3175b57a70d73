"""`wirespeed train --trace out.json`: every timed step of every rank as a Chrome/Perfetto trace
(report/trace.py writes it): on each rank's "compute" track the forward pass, the backward pass and
the optimizer step; on its "comm" track every DDP bucket from the moment DDP hands it to the
communication (its gradients are ready) to the moment its result is back (train/timeline.py's
hook times both). FSDP2 has no buckets: its comm track holds each all-gather and reduce-scatter
it called, from the call to the completion of its Work, numbered in the step's order.

The ranks' spans travel to rank 0 as floats (the backend's allgather_floats, padded to the
longest), five per span. Clocks: each rank's perf_counter; rank 0 lines them up by the moment
every rank left one barrier after the timed steps (the barrier's own exit skew is the error:
microseconds on one host, a round trip's share across hosts).
"""
from __future__ import annotations

import time

from ..report.trace import Spans, merge
from .timeline import COMM_KINDS

_KINDS = ("forward", "backward", "optimizer") + COMM_KINDS


def local_rows(timeline) -> list[float]:
    """This rank's spans as floats: (kind, index, start us, end us, bytes) each; kind indexes
    _KINDS, index is a bucket's or a collective's number in its step."""
    out: list[float] = []
    us = 1e6
    for st in timeline.steps_raw:
        marks = [st["start"], st["forward"], st["backward"], st["optimizer"]]
        for k in range(3):
            if marks[k + 1] >= marks[k] > 0:
                out += [float(k), -1.0, marks[k] * us, marks[k + 1] * us, 0.0]
        for start, end, index, nbytes, kind in st["buckets"]:
            out += [float(_KINDS.index(kind)), float(index), start * us, end * us, float(nbytes)]
    return out


def gather(timeline, backend, rank: int) -> dict | None:
    """Every rank's spans, merged into one trace on rank 0 (None on the others). A collective:
    every rank calls it."""
    backend.barrier()
    left = time.perf_counter() * 1e6
    mine = local_rows(timeline)
    longest = int(max(row[0] for row in backend.allgather_floats([float(len(mine))])))
    rows = backend.allgather_floats([left] + mine + [0.0] * (longest - len(mine)) + [float(len(mine))])
    if rank != 0:
        return None
    parts, offsets = [], {}
    for r, row in enumerate(rows):
        offsets[r] = rows[0][0] - row[0]
        n = int(row[-1])
        spans = Spans(r)
        spans.tid("compute")
        spans.tid("comm")
        step = 0
        for i in range(1, 1 + n, 5):
            kind, index, start, end, nbytes = row[i:i + 5]
            if kind == 0:
                step += 1
            if kind < 3:
                spans.span(_KINDS[int(kind)], start, end, track="compute", step=step)
            elif _KINDS[int(kind)] == "bucket":
                spans.span(f"bucket {int(index)}", start, end, track="comm", step=step, gradient_bytes=int(nbytes))
            else:
                spans.span(f"{_KINDS[int(kind)]} {int(index)}", start, end, track="comm", step=step,
                           bytes=int(nbytes))
        parts.append(spans.as_data())
    return merge(parts, offsets)

