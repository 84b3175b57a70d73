"""Tables: nccl-tests' layout (out-of-place and in-place side by side) and a compact markdown one."""
from __future__ import annotations

from collections import OrderedDict

from ..sizes import human_bytes

_SHORT = {"float32": "float", "float16": "half", "float64": "double"}
# The left half of the header (size .. root) and the width of each cell of a variant's block.
_LEFT = "#{:>11} {:>12} {:>8} {:>6} {:>5}"
_CELL_W = {"time": 9, "p50": 9, "p99": 9, "algbw": 8, "busbw": 8, "#wrong": 8}
_UNITS = {"time": "(us)", "p50": "(us)", "p99": "(us)", "algbw": "(GB/s)", "busbw": "(GB/s)", "#wrong": ""}


def series_key(r: dict) -> tuple:
    # An execution plan's records (bench --plan) are a series of their own beside the library's.
    return (r["collective"], r["backend"], r["device"], r["world_size"], r["dtype"], r.get("op"),
            r.get("root", -1), r.get("plan"))


def group(records) -> "OrderedDict[tuple, dict[int, dict[bool, dict]]]":
    """series -> size -> inplace -> record, in the order the records came."""
    out: OrderedDict = OrderedDict()
    for r in records:
        out.setdefault(series_key(r), OrderedDict()).setdefault(r["bytes"], {})[bool(r["inplace"])] = r
    return out


def _columns(per_op: bool) -> tuple[str, ...]:
    return ("time", "p50", "p99", "algbw", "busbw", "#wrong") if per_op else ("time", "algbw", "busbw", "#wrong")


def _us(r: dict, key: str) -> str:
    return f"{r[key]:.2f}" if r.get(key) is not None else "-"


def _cells(r: dict | None, per_op: bool = False) -> list[str]:
    cols = _columns(per_op)
    if r is None:
        return ["n/a"] + [""] * (len(cols) - 1)
    wrong = str(r["wrong"]) if r.get("checked", True) else "N/A"
    bw = ["-", "-"] if r["collective"] == "barrier" else [f"{r['algbw_gbps']:.3f}", f"{r['busbw_gbps']:.3f}"]
    ops = [_us(r, "time_p50_us"), _us(r, "time_p99_us")] if per_op else []
    return [f"{r['time_us']:.2f}", *ops, *bw, wrong]


def _block(cells: list[str], per_op: bool) -> str:
    return " ".join(f"{c:>{_CELL_W[k]}}" for c, k in zip(cells, _columns(per_op)))


def _head(per_op: bool) -> str:
    cols = _columns(per_op)
    width = len(_block(list(cols), per_op))
    left = [_LEFT.format("", "", "", "", ""), _LEFT.format("size", "count", "type", "redop", "root"),
            _LEFT.format("(B)", "(elements)", "", "", "")]
    mid = [f"{'out-of-place':>{width}}   {'in-place':>{width}}",
           _block(list(cols), per_op) + "   " + _block(list(cols), per_op),
           _block([_UNITS[c] for c in cols], per_op) + "   " + _block([_UNITS[c] for c in cols], per_op)]
    return "\n".join(f"{a}   {b}" for a, b in zip(left, mid))


def nccl_table(records, per_op: bool = False) -> str:
    """The nccl-tests table: one block per collective/backend/world, one row per dtype/op/size.
    per_op adds the p50 and p99 of single calls beside the loop time."""
    lines = []
    blocks: OrderedDict = OrderedDict()
    for key, sizes in group(records).items():
        blocks.setdefault(key[:4] + key[7:], []).append((key, sizes))
    for (coll, backend, device, world, plan), series in blocks.items():
        via = f" | plan {plan}" if plan else ""
        lines.append(f"# {coll} | backend {backend}{via} | device {device} | {world} ranks")
        lines.append(_head(per_op))
        for key, sizes in series:
            dtype, op, root = key[4], key[5], key[6]
            for nbytes, variants in sizes.items():
                any_r = next(iter(variants.values()))
                row = [f"{nbytes:>12}", f"{any_r['count']:>12}", f"{_SHORT.get(dtype, dtype):>8}",
                       f"{op or 'none':>6}", f"{root:>5}"]
                oop, inp = _cells(variants.get(False), per_op), _cells(variants.get(True), per_op)
                lines.append(" ".join(row) + "   " + _block(oop, per_op) + "   " + _block(inp, per_op))
        lines.append("")
    return "\n".join(lines)


def footer(records) -> str:
    wrong = sum(r["wrong"] for r in records)
    bw = [r["busbw_gbps"] for r in records if r["collective"] != "barrier"]
    lines = [f"# Out of bounds values : {wrong} {'OK' if wrong == 0 else 'FAILED'}"]
    if bw:
        lines.append(f"# Avg bus bandwidth    : {sum(bw) / len(bw):.4f} GB/s "
                     "(unweighted mean over sizes, as nccl-tests prints it)")
    return "\n".join(lines)


def markdown_table(records) -> str:
    """`| payload | busbw | algbw |` per series, best variant (in- or out-of-place) per size."""
    out = []
    for key, sizes in group(records).items():
        coll, backend, device, world, dtype, op, _, plan = key
        backend = f"{backend} plan {plan}" if plan else backend
        out.append(f"**{coll}** {dtype}{' ' + op if op else ''}, {backend} on {device}, {world} ranks\n")
        out.append("| payload | busbw | algbw | time | #wrong |")
        out.append("|--------:|------:|------:|-----:|-------:|")
        for nbytes, variants in sizes.items():
            r = max(variants.values(), key=lambda x: x["busbw_gbps"])
            out.append(f"| {human_bytes(nbytes)} | {r['busbw_gbps']:.3f} GB/s | {r['algbw_gbps']:.3f} GB/s "
                       f"| {r['time_us']:.1f} us | {r['wrong']} |")
        out.append("")
    return "\n".join(out)


def link_summary(records) -> str:
    """One line per series on the cluster: busbw next to the link rate, and their ratio.

    busbw is in GB/s (1e9 bytes), link rates in Gbit/s; busbw/link = busbw * 8 / link. For a
    bandwidth-bound collective on a ring it approaches (but cannot pass) the TCP goodput share of
    the link, about 0.956 (tc counts the Ethernet, IP and TCP headers too).
    """
    rows = [r for r in records if r.get("link_rate_gbps") and r["collective"] != "barrier"]
    if not rows:
        return ""
    link = rows[0]["link_rate_gbps"]
    lines = [f"# emulated link {link:g} Gbit/s per host each way"
             + (f", {rows[0]['flow_rate_gbps']:g} Gbit/s per TCP flow" if rows[0].get("flow_rate_gbps")
                else "") + "; busbw/link = busbw (GB/s) x 8 / link (Gbit/s)"]
    seen: dict = {}
    for r in rows:
        key = (r["collective"], r["dtype"], r.get("op"))
        best = seen.get(key, {}).get(r["bytes"])
        if best is None or r["busbw_gbps"] > best["busbw_gbps"]:
            seen.setdefault(key, {})[r["bytes"]] = r
    for (coll, dtype, op), by_size in seen.items():
        cells = " ".join(f"{n}:{r['busbw_gbps'] * 8 / link:.3f}" for n, r in by_size.items())
        lines.append(f"# busbw/link {coll} {dtype}{' ' + op if op else ''} (bytes:ratio) {cells}")
        if any(r["busbw_gbps"] * 8 > link for r in by_size.values()):
            # Several ranks per host: a hierarchical algorithm sends fewer bytes across hosts than
            # busbw's formula assumes, so busbw may pass the link; what crossed cannot.
            cells = " ".join(f"{n}:{r['link_sent_gbps'] * 8 / link:.3f}" for n, r in by_size.items()
                             if r.get("link_sent_gbps") is not None)
            lines.append(f"# sent/link  {coll} {dtype}{' ' + op if op else ''} (bytes:ratio) {cells}"
                         "   (what the busiest host really sent over its link: busbw above 1 "
                         "counts bytes a hierarchical algorithm never sent across hosts)")
    return "\n".join(lines)
