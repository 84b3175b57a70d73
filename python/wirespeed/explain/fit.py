"""Fitting the latency/bandwidth model to measured records, and pricing counts with it.

Parameters, per link class: a latency a (us per step) and a per-byte cost b. Inside a host b is in
us per byte. Between hosts, when the records know their link rate, b is expressed against it:
net_bytes * 8 / rate is the time the bytes take at the full line rate, and b_net is how many times
longer they really take (1 / the share of the link the backend gets; TCP over Ethernet can get
at most 1448/1514 = 0.956). That is what lets `--link-rate` ask "and on a 10 Gbit/s network?":
the same share of a faster link. Records that do not know their rate fit b_net in us per byte.

The fit is least squares on relative error (each record's residual divided by its measured time),
so an 8-byte call and a 64 MiB call count alike, with every parameter kept non-negative: with four
parameters every subset of free parameters is tried and the best feasible one kept (exact
non-negative least squares, no solver needed).
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import numpy as np

from ..errors import UsageError
from . import fields as F
from .costs import Terms

PARAMS = ("a_shm", "b_shm", "a_net", "b_net")

# Above this rms relative error a fit is refused: its typical prediction of the very records it
# was fitted on is off by more than half the measured time, so the records do not follow
# latency + bytes / bandwidth (algorithm switches, a loaded machine, sizes too small for the bytes
# to show) and a prediction elsewhere would be a guess dressed as a number. Good fits here are
# within 5-25% (docs/predict.md, "How right it is").
MAX_FIT_RMS = 0.5


@dataclass
class Model:
    """Fitted parameters (None: no record exercised them) and how well they fit."""

    params: dict[str, float | None]
    per_rate: bool                      # b_net is relative to the link rate (see above)
    link_rate_bps: float | None         # the rate the records had (the first one seen)
    fit_rms: float = 0.0                # relative error over the fitted records
    fit_max: float = 0.0
    worst: dict = field(default_factory=dict)
    residuals: list[tuple[int, int, float]] = field(default_factory=list)  # (world, bytes, rel err)
    n_records: int = 0
    bytes_fitted: tuple[str, ...] = ()  # the per-byte parameters some record's bytes exercised

    def meaningless(self) -> str:
        """Why this fit must not be used to predict, or "" when it may be: a per-byte cost fitted
        to 0 where records moved bytes (infinite bandwidth: bytes explain none of the time), or
        an rms error above MAX_FIT_RMS."""
        why = [f"a zero cost per byte {where} (infinite bandwidth)"
               for key, where in (("b_shm", "inside a host"), ("b_net", "between hosts"))
               if key in self.bytes_fitted and not self.params[key]]
        if self.fit_rms > MAX_FIT_RMS:
            why.append(f"an rms fit error of {self.fit_rms:.0%} (refused above {MAX_FIT_RMS:.0%})")
        return " and ".join(why)

    def time_us(self, t: Terms, rate_bps: float | None = None) -> float:
        """The model's time for these counts; `rate_bps` is the link to price network bytes at."""
        p = self.params
        need = []
        if t.uses_shm and (p["a_shm"] is None or p["b_shm"] is None):
            need.append("shm")
        if t.uses_net and (p["a_net"] is None or p["b_net"] is None):
            need.append("net")
        if need:
            raise MissingClass(need)
        total = 0.0
        if t.uses_shm:
            total += t.shm_steps * p["a_shm"] + t.shm_bytes * p["b_shm"]
        if t.uses_net:
            total += t.net_steps * p["a_net"] + net_feature(t.net_bytes, self.per_rate,
                                                            rate_bps or self.link_rate_bps) * p["b_net"]
        return total


class MissingClass(Exception):
    """A prediction needs a link class that no fitted record exercised."""

    def __init__(self, classes):
        super().__init__(", ".join(classes))
        self.classes = classes


def net_feature(net_bytes: float, per_rate: bool, rate_bps: float | None) -> float:
    """What b_net multiplies: us at the line rate, or plain bytes."""
    if per_rate:
        return net_bytes * 8 / rate_bps * 1e6
    return net_bytes


def _row(t: Terms, per_rate: bool, rate_bps: float | None) -> list[float]:
    return [t.shm_steps, t.shm_bytes, t.net_steps,
            net_feature(t.net_bytes, per_rate, rate_bps) if t.net_bytes else 0.0]


def _nnls_small(A: np.ndarray, y: np.ndarray) -> np.ndarray:
    """min |A x - y| with x >= 0 for a handful of columns: try every support, keep the best
    feasible solution (the optimum is the unconstrained optimum on some support)."""
    m = A.shape[1]
    best, best_err = np.zeros(m), float(np.sum(y * y))
    for k in range(1, m + 1):
        for cols in itertools.combinations(range(m), k):
            sub = A[:, cols]
            x, *_ = np.linalg.lstsq(sub, y, rcond=None)
            if np.any(x < 0):
                continue
            err = float(np.sum((sub @ x - y) ** 2))
            if err < best_err - 1e-15:
                full = np.zeros(m)
                full[list(cols)] = x
                best, best_err = full, err
    return best


def fit(records: list[dict], terms_of) -> Model:
    """Fit one series' records. `terms_of(record)` gives the record's counts under its algorithm."""
    rows, y, meta = [], [], []
    rates = {F.link_rate_bps(r) for r in records if F.layout_of(r).hosts > 1}
    per_rate = bool(rates) and None not in rates
    first_rate = next((F.link_rate_bps(r) for r in records if F.link_rate_bps(r)), None)
    for r in records:
        t = F.time_us(r)
        if t <= 0 or not math.isfinite(t):
            continue
        terms = terms_of(r)
        rows.append(_row(terms, per_rate, F.link_rate_bps(r)))
        y.append(t)
        meta.append((F.world_size(r), F.size_bytes(r)))
    if not rows:
        raise UsageError("no usable measurement to fit (every record has a zero time)")
    A = np.array(rows, dtype=float)
    yv = np.array(y, dtype=float)
    used = [bool(np.any(A[:, j] > 0)) for j in range(len(PARAMS))]
    # Scale columns so the search is well conditioned; weight rows by 1/measured (relative error).
    scale = np.where(A.max(axis=0) > 0, A.max(axis=0), 1.0)
    W = (A / scale) / yv[:, None]
    x = _nnls_small(W[:, used], np.ones(len(yv)))
    full = np.zeros(len(PARAMS))
    full[np.array(used)] = x
    full = full / scale
    pred = A @ full
    rel = (pred - yv) / yv
    worst_i = int(np.argmax(np.abs(rel)))
    params = {name: (float(full[j]) if _class_used(name, used) else None) for j, name in enumerate(PARAMS)}
    return Model(params=params, per_rate=per_rate, link_rate_bps=first_rate,
                 fit_rms=float(np.sqrt(np.mean(rel ** 2))), fit_max=float(np.max(np.abs(rel))),
                 worst={"world_size": meta[worst_i][0], "bytes": meta[worst_i][1],
                        "rel_err": float(rel[worst_i])},
                 residuals=[(w, b, float(e)) for (w, b), e in zip(meta, rel)], n_records=len(rows),
                 bytes_fitted=tuple(name for j, name in enumerate(PARAMS) if name[0] == "b" and used[j]))


def _class_used(name: str, used: list[bool]) -> bool:
    """A class's two parameters are known when any record exercised that class at all (a class
    whose latency fitted to 0 still has a known latency: 0 is the best fit)."""
    return (used[0] or used[1]) if name.endswith("_shm") else (used[2] or used[3])
