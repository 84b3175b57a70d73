"""Fold records into comparable cells: one per (collective, op, device, world size) x (backend,
dtype) x size, with the median over repeats and the spread (min..max of the repeats' medians).

Which variant: a backend may offer only in-place (torch's all_reduce) or only out-of-place (MPI's
broadcast is in place, its reduce_scatter in-place has another layout), so by default each cell
takes whichever variant of that backend is faster at that size (its median over repeats), as a user
choosing a backend would. `--variant in-place|out-of-place` pins one instead.
"""
from __future__ import annotations

from dataclasses import dataclass

VARIANTS = ("best", "in-place", "out-of-place")


@dataclass(frozen=True)
class Cell:
    time_us: float          # median over repeats of the run's time (bench's loop time)
    time_lo_us: float       # fastest repeat
    time_hi_us: float       # slowest repeat
    busbw_gbps: float       # at the median time
    repeats: int
    wrong: int              # summed over every record behind the cell, both variants
    inplace: bool

    @property
    def spread(self) -> float:
        """(slowest - fastest repeat) / median: 0 with one repeat."""
        return (self.time_hi_us - self.time_lo_us) / self.time_us if self.time_us > 0 else 0.0


def median(vals: list[float]) -> float:
    s = sorted(vals)
    n = len(s)
    return (s[(n - 1) // 2] + s[n // 2]) / 2


Block = tuple  # (collective, op, device, world_size)
Column = tuple  # (backend, dtype)


def fold(records, variant: str = "best") -> dict[Block, dict[Column, dict[int, Cell]]]:
    """block -> column -> size -> Cell. Blocks hold what is comparable: the same job on the same
    kind of device and number of ranks; columns are what the user compares inside it."""
    if variant not in VARIANTS:
        raise ValueError(variant)
    raw: dict = {}
    for r in records:
        block = (r["collective"], r.get("op"), r["device"], r["world_size"])
        # A prediction (`wirespeed predict`) is its own column, never a repeat of the measured one.
        col = (r["backend"] + (" predicted" if r.get("predicted") else ""), r["dtype"])
        raw.setdefault(block, {}).setdefault(col, {}).setdefault(r["bytes"], []).append(r)
    out: dict = {}
    for block, cols in raw.items():
        for col, sizes in cols.items():
            for nbytes, rs in sizes.items():
                cell = _cell(rs, variant)
                if cell is not None:
                    out.setdefault(block, {}).setdefault(col, {})[nbytes] = cell
    return out


def _cell(rs: list[dict], variant: str) -> Cell | None:
    wrong = sum(int(r["wrong"]) for r in rs)
    best = None
    for inplace in (False, True):
        if variant != "best" and inplace != (variant == "in-place"):
            continue
        runs = [r for r in rs if bool(r["inplace"]) == inplace]
        if not runs:
            continue
        times = [float(r["time_us"]) for r in runs]
        med = median(times)
        if best is None or med < best[0]:
            best = (med, min(times), max(times), runs, inplace)
    if best is None:
        return None
    med, lo, hi, runs, inplace = best
    r0 = runs[0]
    factor = float(r0.get("busbw_factor", 0.0) or 0.0)
    busbw = r0["bytes"] / (med * 1e-6) / 1e9 * factor if med > 0 else 0.0
    return Cell(med, lo, hi, busbw, len(runs), wrong, inplace)


def ranking(cols: dict[Column, dict[int, Cell]], nbytes: int) -> list[tuple[Column, Cell]]:
    """Columns with a correct result at this size, fastest first (wrong data never wins)."""
    have = [(c, sizes[nbytes]) for c, sizes in cols.items() if nbytes in sizes and sizes[nbytes].wrong == 0]
    return sorted(have, key=lambda x: x[1].time_us)


def contested(first: Cell, second: Cell) -> bool:
    """The runner-up's fastest repeat beat the winner's slowest: the order is within the noise."""
    return first.repeats > 1 and second.repeats > 1 and second.time_lo_us <= first.time_hi_us
