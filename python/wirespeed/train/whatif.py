"""A training step's bounds on a network, and what it would do on another (docs/train.md, "Bounds
and what-if").

- **Wire time**: the bytes each host must move across its link per step, at the link's rate. A
  collective of S bytes on H hosts puts at least its bus-bandwidth factor times S on every host's
  link (2(H-1)/H S for an all_reduce, (H-1)/H S for an all_gather or reduce_scatter: what a
  bandwidth-optimal algorithm sends; nccl-tests' busbw is this figure per second), so no backend
  finishes a step's communication faster. The **lower limit** of the step is max(compute, wire
  time): what perfect overlap would reach.
- **What-if**: the step's own collectives, benched in the same processes after the timed steps
  (checked, as every timed collective is), are fitted with `predict`'s latency/bandwidth model
  (explain/predict.py). The step is then modelled as compute plus the communication that compute
  does not hide: step = C + max(0, T - O), where T is the step's communication time alone and O
  the part of it the measured step hid under its compute, O = C + T - step, at most C. O below 0
  means communication and compute slowed each other (a CPU backend's threads taking cores from
  the backward pass): that cost scales with T, as the traffic that causes it does. At another
  layout or link rate, T scales as the model says, C stays and so does a hidden O: the same
  network on more hosts of the same kind, each with its own cores.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

from ..errors import UsageError
from ..explain import fields as F
from ..explain.costs import busbw_factor
from ..explain.predict import fit_all, predict_time
from ..report.records import record

# Calls per size in the what-if's bench of the step's collectives (plus one warm-up).
WHATIF_ITERS = 5


@dataclass
class WhatIf:
    """The what-if flags, parsed: host counts, link rates (bit/s), the measured link's rate."""
    hosts: list[int]
    rates: list[int]
    measured_bps: int | None

# torch.distributed functions (the ones train.CallCounter wraps) -> the collective bench calls it.
COLLECTIVE_OF = {"all_gather_single": "all_gather", "all_gather_into_tensor": "all_gather",
                 "reduce_scatter_single": "reduce_scatter", "reduce_scatter_tensor": "reduce_scatter",
                 "all_reduce": "all_reduce", "broadcast": "broadcast"}
# Exposed communication above this share of the step is "network-bound" (the threshold).
NETWORK_BOUND_SHARE = 0.10
# The smallest call the what-if bench adds below the step's own sizes, so the fit sees latency.
ANCHOR_BYTES = 64 << 10


def wire_bytes(calls: list[tuple[str, int]], hosts: int) -> float:
    """The bytes per step each host's link must carry one way, at least, for these calls."""
    if hosts < 2:
        return 0.0
    return sum(busbw_factor(c, hosts) * n for c, n in calls)


def wire_time_us(wire_bytes: float, rate_bps: float) -> float:
    """How long a link of rate_bps takes to carry wire_bytes, in us."""
    return wire_bytes * 8 / rate_bps * 1e6


def step_over_limit(step_us: float, compute_us: float, wire_us: float | None) -> tuple[float, float | None]:
    """The lower limit max(compute, wire) perfect overlap would reach, and the step over it
    (None where the limit is 0)."""
    limit = max(compute_us, wire_us or 0.0)
    return limit, (step_us / limit if limit > 0 else None)


def fair_bound(step_us: float, compute_us: float, first_ready_us: float,
               wire_us: float) -> tuple[float, float | None]:
    """The fairer lower limit of a DDP step: no bucket can leave before DDP hands over the first
    (its gradients ready, `first_ready_us` into the step), and then all the step's bytes must
    cross the link, so the step cannot beat max(compute, first ready + wire). Returns the limit
    and the step over it (None where the limit is 0)."""
    limit = max(compute_us, first_ready_us + wire_us)
    return limit, (step_us / limit if limit > 0 else None)


def bounds(step_us: float, compute_us: float, calls: list[tuple[str, int]], hosts: int,
           rate_bps: float | None) -> dict:
    """The record's bound fields: wire time, the lower limit max(compute, wire) and the step as a
    multiple of it. Without a known link rate (a job on one host, or a real cluster whose rate
    was not given) the wire time is unknown and the limit is the compute alone."""
    out = {"hosts": hosts, "wire_bytes_per_step": wire_bytes(calls, hosts)}
    wire = None
    if hosts > 1 and rate_bps:
        wire = wire_time_us(out["wire_bytes_per_step"], rate_bps)
        out["link_rate_gbps"] = rate_bps / 1e9
    out["wire_us"] = wire
    out["lower_limit_us"], out["step_vs_limit"] = step_over_limit(step_us, compute_us, wire)
    return out


def bench_sizes(calls: list[tuple[str, int]]) -> dict[str, list[int]]:
    """collective -> the sizes to bench: every size the step used, and one small anchor."""
    out: dict[str, set[int]] = {}
    for c, n in calls:
        out.setdefault(c, set()).add(int(n))
    return {c: sorted(s | {min(ANCHOR_BYTES, min(s))}) for c, s in out.items()}


class StepModel:
    """The step as compute + the communication compute does not hide, from one measured run and
    the bench of its collectives (module docstring)."""

    def __init__(self, rec: dict, calls: list[tuple[str, int]], bench_records: list[dict],
                 measured_rate_bps: float | None = None):
        self.rec = rec
        self.calls = calls
        # fit_all prices records without a link rate of their own at the measured one.
        self.fits = {sf.collective: sf
                     for sf in fit_all(bench_records, measured_rate_bps=measured_rate_bps)}
        measured = [r for r in bench_records if not F.is_predicted(r)]
        if not measured:
            raise UsageError("the what-if needs the step's collectives benched: none were")
        self.layout = F.layout_of(measured[0])
        self.rate_bps = F.link_rate_bps(measured[0]) or measured_rate_bps
        if self.layout.hosts < 2 or not self.rate_bps:
            raise UsageError("the what-if needs a run across hosts with a known link rate: run on "
                             "the emulated cluster (--cluster) or give --measured-link-rate")
        # T: the step's calls timed alone, each at its own size (the bench ran every one).
        by = {(r["collective"], int(r["bytes"])): F.time_us(r) for r in measured}
        self.comm_us = sum(self._measured_time(by, c, n) for c, n in calls)
        self.model_us = self.comm_time(self.layout, None)
        c, s = rec["compute_us"], rec["step_us"]
        # At most the whole compute hides; below 0 the two slowed each other down (a CPU
        # backend's threads taking cores from the backward pass): a cost step_at scales with T.
        self.hidden_us = min(c + self.comm_us - s, c)

    @staticmethod
    def _measured_time(by: dict, coll: str, nbytes: int) -> float:
        # The bench's case may round a size to whole elements per rank; the nearest one is it.
        near = min((k for k in by if k[0] == coll), key=lambda k: abs(k[1] - nbytes))
        return by[near]

    def comm_time(self, layout: F.Layout, rate_bps: float | None) -> float:
        return sum(predict_time(self.fits[c], layout, n, rate_bps)[0] for c, n in self.calls)

    def step_at(self, layout: F.Layout, rate_bps: float | None) -> tuple[float, float]:
        """(step us, communication alone us) on `layout` at `rate_bps` (None: the measured rate)."""
        scale = self.comm_time(layout, rate_bps) / self.model_us if self.model_us > 0 else 0.0
        comm = self.comm_us * scale
        # What compute hid stays; a slowdown of the two by each other grows with the traffic.
        hidden = self.hidden_us if self.hidden_us >= 0 else self.hidden_us * scale
        return self.rec["compute_us"] + max(0.0, comm - hidden), comm

    def network_bound_below(self, layout: F.Layout) -> float | None:
        """The link rate (bit/s) below which exposed communication passes NETWORK_BOUND_SHARE of
        the step on `layout`; 0 when no rate gets it there, inf when no rate keeps it under (the
        latency alone exposes more)."""
        def exposed(rate):
            step, _ = self.step_at(layout, rate)
            return (step - self.rec["compute_us"]) / step if step > 0 else 0.0
        return rate_below(exposed)

    def predicted(self, hosts: list[int], rates: list[float | None]) -> list[dict]:
        """Train records marked `"predicted": true`, one per host count x link rate, with the same
        ranks per host as the measured run."""
        out = []
        per_host = self.layout.per_host
        run_id = "what-if-" + time.strftime("%Y%m%d-%H%M%S")
        for h in hosts:
            layout = F.Layout.blocks(h, per_host)
            bound = self.network_bound_below(layout)
            for rate in rates:
                step, comm = self.step_at(layout, rate)
                r = rate or self.rate_bps
                world = layout.world
                per_rank = self.rec["batch_size"] / (step * 1e-6)
                keep = {k: self.rec[k] for k in ("backend", "device", "model", "parallel",
                                                  "batch_size", "unit", "optimizer") if k in self.rec}
                c = self.rec["compute_us"]
                out.append(record("train", {
                    **keep, "run_id": run_id, "predicted": True, "world_size": world, "hosts": h,
                    "ranks_per_host": per_host, "link_rate_gbps": r / 1e9, "step_us": step,
                    "compute_us": c, "comm_us": comm,
                    "exposed_pct": 100.0 * max(0.0, step - c) / step,
                    "samples_per_s": per_rank * world, "samples_per_s_per_rank": per_rank,
                    "wire_us": wire_time_us(wire_bytes(self.calls, h), r),
                    # null: no link rate keeps exposed communication under the threshold.
                    "network_bound_below_gbps": None if math.isinf(bound) else bound / 1e9,
                    "fitted_on": {"hosts": self.layout.hosts, "ranks_per_host": per_host,
                                  "link_rate_gbps": self.rate_bps / 1e9,
                                  "comm_us": self.comm_us, "hidden_us": self.hidden_us},
                    # Required by the schema; a prediction trains no model.
                    "bytes_per_step": self.rec["bytes_per_step"], "state_digest": ""}))
        return out


def rate_below(exposed, lo: float = 1e5, hi: float = 4e12) -> float:
    """The link rate (bit/s) below which `exposed(rate)`, the share of the step communication
    leaves exposed, passes NETWORK_BOUND_SHARE, bisected on a log scale between lo and hi: 0 when
    even lo keeps it under, inf when even hi does not."""
    if exposed(hi) > NETWORK_BOUND_SHARE:
        return math.inf
    if exposed(lo) <= NETWORK_BOUND_SHARE:
        return 0.0
    for _ in range(60):   # 2^-60 of the decades between lo and hi
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if exposed(mid) > NETWORK_BOUND_SHARE else (lo, mid)
    return hi


def bound_text(gbps: float | None) -> str:
    if gbps is None:
        return "always (latency alone exposes more than 10%)"
    if gbps == 0:
        return "never (even 100 kbit/s keeps it under 10%)"
    return f"{gbps:.3g} Gbit/s"


def whatif_table(preds: list[dict]) -> str:
    head = (f"{'backend':<10} {'hosts':>5} {'ranks':>5} {'link':>9} {'samples/s':>10} "
            f"{'step ms':>9} {'comm ms':>9} {'wire ms':>9} {'exposed':>8}  network-bound below")
    lines = [head]
    for p in preds:
        lines.append(f"{p['backend']:<10} {p['hosts']:>5} {p['world_size']:>5} "
                     f"{p['link_rate_gbps']:>5.3g} Gb/s {p['samples_per_s']:>10.2f} "
                     f"{p['step_us'] / 1e3:>9.1f} {p['comm_us'] / 1e3:>9.1f} "
                     f"{p['wire_us'] / 1e3:>9.1f} {p['exposed_pct']:>7.0f}%  "
                     f"{bound_text(p['network_bound_below_gbps'])}")
    return "\n".join(lines)
