"""Text renderings of a comparison: one table per collective (a sub-table per device and world size,
since only runs of the same job compete), the fastest per size marked, and a summary naming, per
size range, which combination wins and by how much. Pure functions of records: no torch, no MPI.
"""
from __future__ import annotations

from collections import Counter

from ..sizes import human_bytes
from .stats import Cell, contested, fold, ranking

COL_W = 27


def fmt_time(us: float) -> str:
    if us >= 1e6:
        return f"{us / 1e6:.2f}s"
    if us >= 1e3:
        return f"{us / 1e3:.2f}ms"
    return f"{us:.1f}us"


def _title(block) -> str:
    coll, op, device, world = block
    return f"{coll}{' (' + op + ')' if op else ''} | {device} | {world} rank{'s' if world != 1 else ''}"


def _col_name(col) -> str:
    return f"{col[0]} {col[1]}"


def _cell_text(cell: Cell | None, mark: str) -> str:
    if cell is None:
        return f"{'-':>{COL_W}}"
    spread = "" if cell.repeats < 2 else (f"±{cell.spread * 100:.0f}%" if cell.spread < 9.995 else ">999%")
    bw = f"WRONG:{cell.wrong}" if cell.wrong else ("-" if cell.busbw_gbps == 0 else f"{cell.busbw_gbps:.3f}")
    text = f"{fmt_time(cell.time_us):>9} {spread:>5} {bw:>8} {mark:<2}"
    return f"{text:>{COL_W}}"


def _ordered(folded) -> list:
    """Blocks grouped by collective in the order the runs measured them (the harness's order),
    then by op, device and world size."""
    first: dict = {}
    for block in folded:
        first.setdefault(block[0], len(first))
    return sorted(folded, key=lambda b: (first[b[0]], str(b[1]), b[2], b[3]))


def tables(records, variant: str = "best") -> str:
    folded = fold(records, variant)
    lines = []
    for block in _ordered(folded):
        cols = folded[block]
        order = sorted(cols)
        lines.append(f"# {_title(block)}")
        lines.append(f"#{'size':>11}" + "".join(f"{_col_name(c):>{COL_W}}" for c in order))
        sub = f"{'time':>9} {'sprd':>5} {'busbw':>8}   "
        lines.append(f"#{'(B)':>11}" + "".join(f"{sub:>{COL_W}}" for _ in order))
        sizes = sorted({s for c in order for s in cols[c]})
        for nbytes in sizes:
            ranked = ranking(cols, nbytes)
            present = sum(1 for c in order if nbytes in cols[c])
            winner = ranked[0][0] if ranked and present > 1 else None  # wrong data is out of the race
            close = len(ranked) > 1 and contested(ranked[0][1], ranked[1][1])
            row = f"{nbytes:>12}"
            for c in order:
                mark = ("*~" if close else "*") if c == winner else ""
                row += _cell_text(cols[c].get(nbytes), mark)
            lines.append(row)
        lines.append("")
    if lines:
        lines.append("# time: bench's time (calls back to back, elapsed / calls, slowest rank, median loop; the "
                     "median over repeats with --repeat); sprd: (slowest - fastest repeat) / median; "
                     "busbw in GB/s (1e9 B/s); * fastest at that size; *~ fastest but within the "
                     "spread of the next")
    return "\n".join(lines)


def _ranges(sizes: list[int], winners: list) -> list[tuple[int, int]]:
    """Index ranges [i, j] of consecutive sizes with the same winner."""
    out = []
    start = 0
    for i in range(1, len(sizes) + 1):
        if i == len(sizes) or winners[i] != winners[start]:
            out.append((start, i - 1))
            start = i
    return out


def summary(records, variant: str = "best") -> str:
    folded = fold(records, variant)
    if not folded:
        return "no results to compare"
    lines = []
    for block in _ordered(folded):
        cols = folded[block]
        lines.append(f"{_title(block)}:")
        if len(cols) < 2:
            lines.append(f"  only {', '.join(_col_name(c) for c in cols)} ran: nothing to compare")
            continue
        sizes, wins = [], []
        for nbytes in sorted({s for c in cols.values() for s in c}):
            ranked = ranking(cols, nbytes)
            if len(ranked) >= 2:
                sizes.append(nbytes)
                wins.append(ranked)
        if not sizes:
            lines.append("  no size has two correct results to compare")
            continue
        for i, j in _ranges(sizes, [w[0][0] for w in wins]):
            winner = wins[i][0][0]
            ratios = [w[1][1].time_us / w[0][1].time_us for w in wins[i:j + 1]]
            nexts = Counter(_col_name(w[1][0]) for w in wins[i:j + 1]).most_common(1)[0][0]
            close = sum(contested(w[0][1], w[1][1]) for w in wins[i:j + 1])
            span = human_bytes(sizes[i]) if i == j else f"{human_bytes(sizes[i])} .. {human_bytes(sizes[j])}"
            lo, hi = min(ratios), max(ratios)
            by = f"{lo:.2f}x" if abs(hi - lo) < 0.005 else f"{lo:.2f}x to {hi:.2f}x"
            text = f"  {span}: {_col_name(winner)} fastest, {by} faster than the next ({nexts})"
            if close:
                text += (f"; at {close} of {j - i + 1} size{'s' if j > i else ''} within the spread "
                         "across repeats, so not a clear win there")
            lines.append(text)
    if not any(c.repeats > 1 for cols in folded.values() for col in cols.values() for c in col.values()):
        lines.append("(one run per combination: use --repeat 3 or more to tell a win from noise)")
    return "\n".join(lines)


def skipped_text(title: str, items: list[tuple[str, str]]) -> str:
    if not items:
        return ""
    return "\n".join([f"# {title}:"] + [f"#   {what}: {why}" for what, why in items])
