"""From a tune's records to its verdict: per series (collective, op, dtype) a table of every
setting's time at every size, the best setting per size range with its gain over the defaults,
the best single setting over the whole sweep, and the `export` lines. Pure functions of records.

Gain = the defaults' time / the setting's time (bench's loop time, the median over repeats), so
2.00x means twice as fast. A setting with wrong elements at a size never wins there; a winner whose
slowest repeat was slower than the defaults' fastest is marked as within the noise.
"""
from __future__ import annotations

import math

from ..compare.render import fmt_time
from ..compare.stats import Cell, contested, fold, ranking
from ..sizes import human_bytes
from .sweep import DEFAULT
from ..report.records import record

DEFAULT_LABEL = DEFAULT.label


def by_series(records) -> dict[tuple, dict[str, dict[int, Cell]]]:
    """(collective, op, device, world, dtype) -> setting label -> size -> Cell (median over repeats,
    the faster variant)."""
    pseudo = [{**r, "backend": r["setting_label"]} for r in records]
    out: dict = {}
    for block, cols in fold(pseudo, "best").items():
        for (label, dtype), sizes in cols.items():
            out.setdefault((*block, dtype), {})[label] = sizes
    return out


def gains(cols: dict[str, dict[int, Cell]], label: str) -> dict[int, float]:
    """Size -> the defaults' time / this setting's time, where both are correct."""
    base, mine = cols.get(DEFAULT_LABEL, {}), cols.get(label, {})
    return {n: base[n].time_us / mine[n].time_us for n in base
            if n in mine and base[n].wrong == 0 and mine[n].wrong == 0 and mine[n].time_us > 0}


def geo_mean(vals) -> float:
    vals = list(vals)
    return math.exp(sum(math.log(v) for v in vals) / len(vals)) if vals else float("nan")


def overall_best(cols: dict[str, dict[int, Cell]]) -> tuple[str, float]:
    """The setting with the best geometric-mean gain over every size the defaults ran (a setting
    missing a size or wrong at one does not qualify), and that gain."""
    sizes = {n for n, c in cols.get(DEFAULT_LABEL, {}).items() if c.wrong == 0}
    best = (DEFAULT_LABEL, 1.0)
    for label in cols:
        g = gains(cols, label)
        if label != DEFAULT_LABEL and sizes and set(g) == sizes and geo_mean(g.values()) > best[1]:
            best = (label, geo_mean(g.values()))
    return best


def ranges(cols: dict[str, dict[int, Cell]]) -> list[dict]:
    """Consecutive sizes with the same fastest correct setting: winner, sizes, gains, and at how
    many of them the win over the defaults is within the spread of the repeats."""
    sizes = sorted(n for n, c in cols.get(DEFAULT_LABEL, {}).items() if c.wrong == 0)
    winners = []
    for n in sizes:
        ranked = ranking(cols, n)
        winners.append(ranked[0][0] if ranked else DEFAULT_LABEL)
    out = []
    start = 0
    for i in range(1, len(sizes) + 1):
        if i == len(sizes) or winners[i] != winners[start]:
            label = winners[start]
            span = sizes[start:i]
            g = [gains(cols, label)[n] for n in span]
            noisy = sum(contested(cols[label][n], cols[DEFAULT_LABEL][n]) for n in span) \
                if label != DEFAULT_LABEL else 0
            out.append({"setting_label": label, "min_bytes": span[0], "max_bytes": span[-1],
                        "sizes": len(span), "gain": geo_mean(g), "gain_min": min(g), "gain_max": max(g),
                        "within_noise": noisy})
            start = i
    return out


def _span(r: dict) -> str:
    lo, hi = human_bytes(r["min_bytes"]), human_bytes(r["max_bytes"])
    return lo if lo == hi else f"{lo} .. {hi}"


def _gain_text(r: dict) -> str:
    lo, hi = r["gain_min"], r["gain_max"]
    return f"{lo:.2f}x" if abs(hi - lo) < 0.005 else f"{lo:.2f}x to {hi:.2f}x"


def render(records, repeats: int) -> tuple[str, list[dict]]:
    """The text verdict and the `wirespeed.tune/1` records (one per series and size range)."""
    lines, summary = [], []
    for key, cols in by_series(records).items():
        coll, op, device, world, dtype = key
        if DEFAULT_LABEL not in cols:
            lines.append(f"# {coll} {dtype}: the defaults gave no correct result, nothing to compare against")
            continue
        sizes = sorted({n for c in cols.values() for n in c})
        # the sweep's order (records come in it), the defaults first
        order = list(dict.fromkeys(r["setting_label"] for r in records))
        labels = [DEFAULT_LABEL] + [label for label in order if label in cols and label != DEFAULT_LABEL]
        width = max(9, *(len(label) for label in labels))
        lines.append(f"# {coll}{' (' + op + ')' if op else ''} {dtype} | {device} | {world} ranks: "
                     f"time (bench's loop time, median over {repeats} repeat{'s' if repeats != 1 else ''})"
                     " per setting and size; * fastest correct at that size; gain = the defaults' "
                     "time / the setting's, geometric mean over sizes")
        lines.append(f"# {'setting':<{width - 2}}" + "".join(f"{human_bytes(n):>10}  " for n in sizes)
                     + f"{'gain':>9}")
        fastest = {n: (ranking(cols, n) or [(None, None)])[0][0] for n in sizes}
        for label in labels:
            row = f"{label:<{width}}"
            for n in sizes:
                c = cols[label].get(n)
                cell = "-" if c is None else ("WRONG" if c.wrong else fmt_time(c.time_us))
                row += f"{cell + (' *' if fastest[n] == label else '  '):>12}"
            g = gains(cols, label)
            row += f"{geo_mean(g.values()):>8.2f}x" if g else f"{'-':>9}"
            lines.append(row)
        lines.append("# best per size range:")
        for r in ranges(cols):
            if r["setting_label"] == DEFAULT_LABEL:
                text = f"  {_span(r)}: the defaults"
            else:
                text = f"  {_span(r)}: {r['setting_label']}, {_gain_text(r)} the defaults' speed"
                if r["within_noise"]:
                    text += (f" (at {r['within_noise']} of {r['sizes']} size{'s' if r['sizes'] > 1 else ''} "
                             "within the spread of the repeats: not a clear win there)")
            lines.append(text)
            summary.append(record("tune", {"collective": coll, "op": op, "device": device,
                            "world_size": world, "dtype": dtype, **r,
                            "setting": dict(kv.split("=", 1) for kv in r["setting_label"].split())
                            if r["setting_label"] != DEFAULT_LABEL else {}}))
        label, g = overall_best(cols)
        if label == DEFAULT_LABEL:
            lines.append("# over the whole sweep no setting beats the defaults: nothing to export")
        else:
            lines.append(f"# over the whole sweep: {label}, {g:.2f}x the defaults' speed (geometric "
                         "mean over sizes)" + ("; one run per setting, so use --repeat 3 to tell a gain "
                                               "from noise" if repeats < 2 else "") + "; to use it:")
            lines += [f"export {kv}" for kv in label.split()]
        if len({r["setting_label"] for r in ranges(cols)}) > 1:
            lines.append("# or, for one size range only:")
            for r in ranges(cols):
                if r["setting_label"] != DEFAULT_LABEL:
                    lines.append(f"#   {_span(r)}: " + "; ".join(f"export {kv}" for kv in r["setting_label"].split()))
        lines.append("")
    return "\n".join(lines), summary
