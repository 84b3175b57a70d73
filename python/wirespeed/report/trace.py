"""Chrome/Perfetto trace files: the one format `bench --trace` and `train --trace` write.

The JSON object format of the Trace Event Format (what chrome://tracing, Perfetto's UI and
torch.profiler's export_chrome_trace read): {"traceEvents": [...], "displayTimeUnit": "ms"}, each
span a complete event {"ph": "X", "name", "cat", "ts", "dur", "pid", "tid", "args"} with times in
microseconds. One process track per rank (pid = rank, named "rank N" by a metadata event) and one
thread track per kind of work inside it (tid: a small number, named by a metadata event), so a
viewer shows the ranks stacked and each rank's compute and communication on separate rows.

Ranks collect their spans locally (Spans) with times from one clock every rank of a host shares
(time.perf_counter_ns is CLOCK_MONOTONIC on Linux); rank 0 merges the lists (merge) after
shifting each rank by the offset it measured against rank 0 (`offset_us`, 0 on one host).
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field


def now_us() -> float:
    """Microseconds on the clock every process of this host shares."""
    return time.perf_counter_ns() / 1000.0


@dataclass
class Spans:
    """One rank's spans: append with `span` (a finished interval) or `begin`/`end` pairs."""
    rank: int
    threads: dict[str, int] = field(default_factory=dict)   # track name -> tid
    events: list[dict] = field(default_factory=list)

    def tid(self, track: str) -> int:
        if track not in self.threads:
            self.threads[track] = len(self.threads)
        return self.threads[track]

    def span(self, name: str, start_us: float, end_us: float, track: str = "main", cat: str = "",
             **args) -> None:
        ev = {"ph": "X", "name": name, "cat": cat or track, "ts": round(start_us, 3),
              "dur": round(max(0.0, end_us - start_us), 3), "pid": self.rank, "tid": self.tid(track)}
        if args:
            ev["args"] = args
        self.events.append(ev)

    def as_data(self) -> dict:
        """A plain dict to send to rank 0 (through the store or a gather of objects)."""
        return {"rank": self.rank, "threads": self.threads, "events": self.events}


def merge(parts: list[dict], offset_us: dict[int, float] | None = None) -> dict:
    """One trace from every rank's `Spans.as_data()`, times shifted by each rank's offset and
    started at 0, with the metadata events that name each rank's process and thread tracks."""
    offset_us = offset_us or {}
    events: list[dict] = []
    for part in sorted(parts, key=lambda p: p["rank"]):
        rank = part["rank"]
        events.append({"ph": "M", "name": "process_name", "pid": rank, "tid": 0,
                       "args": {"name": f"rank {rank}"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0,
                       "args": {"sort_index": rank}})
        for track, tid in part["threads"].items():
            events.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": tid,
                           "args": {"name": track}})
        shift = offset_us.get(rank, 0.0)
        for ev in part["events"]:
            events.append(dict(ev, ts=ev["ts"] + shift))
    spans = [e for e in events if e["ph"] == "X"]
    t0 = min((e["ts"] for e in spans), default=0.0)
    for e in spans:
        e["ts"] = round(e["ts"] - t0, 3)
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def write(path: str, trace: dict) -> None:
    """Write the trace atomically (a viewer never opens half a file)."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(trace, f)
    os.replace(tmp, path)


def check_schema(trace: dict) -> list[str]:
    """What a viewer would reject in `trace`, as messages (empty: it loads)."""
    problems = []
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        return ["no traceEvents list"]
    for i, ev in enumerate(trace["traceEvents"]):
        ph = ev.get("ph")
        if ph not in ("X", "M", "i", "B", "E", "C"):
            problems.append(f"event {i}: ph {ph!r}")
            continue
        for key in ("name", "pid", "tid") + (("ts", "dur") if ph == "X" else ()):
            if key not in ev:
                problems.append(f"event {i}: no {key}")
        if ph == "X" and (not isinstance(ev.get("dur"), (int, float)) or ev["dur"] < 0):
            problems.append(f"event {i}: dur {ev.get('dur')!r}")
    return problems
