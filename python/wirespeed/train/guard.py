"""The guard of `train --tune`: did a candidate train the same as the exact (default) run?

Every candidate runs the same network from the same seeded weights on the same batches
(train/nets.py) for the same steps as the default, so without a change to the arithmetic its
losses and parameters are the default's (2 ranks: bit for bit; a sum's order can move the last
bits with more). Two measures, both relative:
- the loss: the final step's, and the mean over the last LAST_STEPS steps, each as
  |candidate - exact| / |exact|; the larger is `loss_rel_diff`;
- the parameters: ||p_candidate - p_exact|| / ||p_exact - p_init|| after the last step, the
  difference over the distance training moved them (`param_drift`; train/shell.param_difference).

The noise floor. A short run of a network that amplifies rounding (BatchNorm over small maps: a
resnet at 32-64 px) moves far from the exact run on a change of nothing but the order of float
sums (resnet50 at 64 px: 93% of the distance trained after 7 steps from the thread count alone),
so a fixed tolerance there refuses every candidate that is not bit-exact. The search therefore
runs a rounding-only twin of the default first (twin_threads: the same configuration at another
torch thread count, which changes how the CPU kernels split and order their sums and nothing
else) and measures its two figures: the floor. A candidate is within when each measure is within
max(tolerance, FLOOR_FACTOR x the floor's): on a network whose twin lands on the same bits (floor
0) the fixed tolerance alone decides, as before.

What this does not show: that a change too small to see in a few dozen steps stays small over a
full training run (compression's error adds up; PowerSGD's error feedback is built to pay it back
later), nor anything about accuracy on held-out data. And a candidate within the floor but above
the tolerance is one this short run cannot tell from rounding: not shown harmful, not shown
harmless; a longer run or the user's own loss curve is what can.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

LAST_STEPS = 5
# A single twin is one sample of how far rounding carries a short chaotic run, and other
# rounding-sized changes land around it, not on it: measured, fp16/bf16 compression at 0.9-1.7x
# the twin's figures (resnet50 64 px: drift 83-89% vs 93%, loss 3.1-3.8% vs 2.4%; resnet18 32 px:
# drift 59% vs 38%, loss 33% vs 20%) while PowerSGD at rank 1, which bends the loss's fall, sat at
# 14x the twin's loss (284% vs 20%). 2x keeps the first inside and the second far outside.
FLOOR_FACTOR = 2.0


def loss_rel_diff(exact: list[float], mine: list[float]) -> float:
    """The larger of the final loss's and the last steps' mean loss's relative difference; inf
    when the curves differ in length (they ran different steps) or one is missing."""
    if not exact or len(exact) != len(mine):
        return float("inf")
    k = min(LAST_STEPS, len(exact))
    tail_e, tail_m = sum(exact[-k:]) / k, sum(mine[-k:]) / k
    rel = lambda a, b: abs(b - a) / abs(a) if a else (0.0 if a == b else float("inf"))  # noqa: E731
    return max(rel(exact[-1], mine[-1]), rel(tail_e, tail_m))


def twin_threads(default_threads: int) -> int:
    """The rounding-only twin's torch thread count: one fewer than the default ran with, or 2 when
    it ran with 1 (the twin's speed is not measured, so oversubscribing cores costs only time)."""
    return default_threads - 1 if default_threads > 1 else 2


@dataclass(frozen=True)
class Floor:
    """The rounding-only twin's figures against the exact run; source: the twin's label ("" when
    none was measured: then the tolerance alone decides)."""
    loss: float = 0.0
    drift: float = 0.0
    source: str = ""

    def measured(self) -> bool:
        return bool(self.source) and math.isfinite(self.loss) and math.isfinite(self.drift)

    def bounds(self, tolerance: float) -> tuple[float, float]:
        """(largest loss_rel_diff, largest param_drift) a candidate may have."""
        if not self.measured():
            return tolerance, tolerance
        return max(tolerance, FLOOR_FACTOR * self.loss), max(tolerance, FLOOR_FACTOR * self.drift)

    def record(self, tolerance: float) -> dict:
        lb, db = self.bounds(tolerance)
        return {"from": self.source or None, "loss_rel_diff": self.loss if self.measured() else None,
                "param_drift": self.drift if self.measured() else None, "factor": FLOOR_FACTOR,
                "loss_bound": lb, "drift_bound": db}


NO_FLOOR = Floor()


def _measure(rec: dict, key: str) -> float:
    """One of a record's two measures; unmeasured (absent, or null: a run stopped early) is never
    within any bound."""
    v = rec.get(key)
    return float("inf") if v is None else v


def changed_by(rec: dict) -> float:
    """How much a candidate changed training: the larger of its two measures."""
    return max(_measure(rec, "loss_rel_diff"), _measure(rec, "param_drift"))


def within(rec: dict, tolerance: float, floor: Floor = NO_FLOOR) -> bool:
    """Both measures within the tolerance, or within FLOOR_FACTOR x the noise floor's."""
    lb, db = floor.bounds(tolerance)
    return _measure(rec, "loss_rel_diff") <= lb and _measure(rec, "param_drift") <= db


def only_by_floor(rec: dict, tolerance: float, floor: Floor) -> bool:
    """Within only because of the floor: above the fixed tolerance, inside the floor's bounds."""
    return within(rec, tolerance, floor) and not within(rec, tolerance)
