"""The guard of `train --tune`: did a candidate train the same as the exact (default) run?

Every candidate runs the same network from the same seeded weights on the same batches
(train/nets.py) for the same steps as the default, so without a change to the arithmetic its
losses and parameters are the default's (2 ranks: bit for bit; a sum's order can move the last
bits with more). Two measures, both relative:
- the loss: the final step's, and the mean over the last LAST_STEPS steps, each as
  |candidate - exact| / |exact|; the larger is `loss_rel_diff`;
- the parameters: ||p_candidate - p_exact|| / ||p_exact - p_init|| after the last step, the
  difference over the distance training moved them (`param_drift`; train/shell.param_difference).
A candidate is within the tolerance when both are. What this does not show: that a change too
small to see in a few dozen steps stays small over a full training run (compression's error
adds up; PowerSGD's error feedback is built to pay it back later), nor anything about accuracy
on held-out data.
"""
from __future__ import annotations

LAST_STEPS = 5


def loss_rel_diff(exact: list[float], mine: list[float]) -> float:
    """The larger of the final loss's and the last steps' mean loss's relative difference; inf
    when the curves differ in length (they ran different steps) or one is missing."""
    if not exact or len(exact) != len(mine):
        return float("inf")
    k = min(LAST_STEPS, len(exact))
    tail_e, tail_m = sum(exact[-k:]) / k, sum(mine[-k:]) / k
    rel = lambda a, b: abs(b - a) / abs(a) if a else (0.0 if a == b else float("inf"))  # noqa: E731
    return max(rel(exact[-1], mine[-1]), rel(tail_e, tail_m))


def changed_by(rec: dict) -> float:
    """How much a candidate changed training: the larger of its two measures."""
    return max(rec.get("loss_rel_diff", float("inf")), rec.get("param_drift", float("inf")))


def within(rec: dict, tolerance: float) -> bool:
    return changed_by(rec) <= tolerance
