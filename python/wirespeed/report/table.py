"""Tables: nccl-tests' layout (out-of-place and in-place side by side) and a compact markdown one."""
from __future__ import annotations

from collections import OrderedDict

_SHORT = {"float32": "float", "float16": "half", "float64": "double"}
_HEAD = ("#{:>11} {:>12} {:>8} {:>6} {:>5}   {:>36}   {:>36}\n"
         "#{:>11} {:>12} {:>8} {:>6} {:>5}   {:>9} {:>8} {:>8} {:>8}   {:>9} {:>8} {:>8} {:>8}\n"
         "#{:>11} {:>12} {:>8} {:>6} {:>5}   {:>9} {:>8} {:>8} {:>8}   {:>9} {:>8} {:>8} {:>8}")


def series_key(r: dict) -> tuple:
    return (r["collective"], r["backend"], r["device"], r["world_size"], r["dtype"], r.get("op"),
            r.get("root", -1))


def group(records) -> "OrderedDict[tuple, dict[int, dict[bool, dict]]]":
    """series -> size -> inplace -> record, in the order the records came."""
    out: OrderedDict = OrderedDict()
    for r in records:
        out.setdefault(series_key(r), OrderedDict()).setdefault(r["bytes"], {})[bool(r["inplace"])] = r
    return out


def _cells(r: dict | None) -> list[str]:
    if r is None:
        return ["n/a", "", "", ""]
    wrong = str(r["wrong"]) if r.get("checked", True) else "N/A"
    if r["collective"] == "barrier":
        return [f"{r['time_us']:.2f}", "-", "-", wrong]
    return [f"{r['time_us']:.2f}", f"{r['algbw_gbps']:.3f}", f"{r['busbw_gbps']:.3f}", wrong]


def nccl_table(records) -> str:
    """The nccl-tests table: one block per collective/backend/world, one row per dtype/op/size."""
    lines = []
    blocks: OrderedDict = OrderedDict()
    for key, sizes in group(records).items():
        blocks.setdefault(key[:4], []).append((key, sizes))
    for (coll, backend, device, world), series in blocks.items():
        lines.append(f"# {coll} | backend {backend} | device {device} | {world} ranks")
        lines.append(_HEAD.format("", "", "", "", "", "out-of-place", "in-place",
                                  "size", "count", "type", "redop", "root", "time", "algbw", "busbw",
                                  "#wrong", "time", "algbw", "busbw", "#wrong",
                                  "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "",
                                  "(us)", "(GB/s)", "(GB/s)", ""))
        for key, sizes in series:
            dtype, op, root = key[4], key[5], key[6]
            for nbytes, variants in sizes.items():
                any_r = next(iter(variants.values()))
                row = [f"{nbytes:>12}", f"{any_r['count']:>12}", f"{_SHORT.get(dtype, dtype):>8}",
                       f"{op or 'none':>6}", f"{root:>5}"]
                oop, inp = _cells(variants.get(False)), _cells(variants.get(True))
                lines.append(" ".join(row) + "   " + "{:>9} {:>8} {:>8} {:>8}".format(*oop)
                             + "   " + "{:>9} {:>8} {:>8} {:>8}".format(*inp))
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


def human_bytes(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            v = n / scale
            return f"{v:.0f} {unit}" if v == int(v) else f"{v:.1f} {unit}"
    return f"{n} B"


def markdown_table(records) -> str:
    """`| payload | busbw | algbw |` per series, best variant (in- or out-of-place) per size."""
    out = []
    for key, sizes in group(records).items():
        coll, backend, device, world, dtype, op, _ = key
        out.append(f"**{coll}** {dtype}{' ' + op if op else ''}, {backend} on {device}, {world} ranks\n")
        out.append("| payload | busbw | algbw | time | #wrong |")
        out.append("|--------:|------:|------:|-----:|-------:|")
        for nbytes, variants in sizes.items():
            r = max(variants.values(), key=lambda x: x["busbw_gbps"])
            out.append(f"| {human_bytes(nbytes)} | {r['busbw_gbps']:.3f} GB/s | {r['algbw_gbps']:.3f} GB/s "
                       f"| {r['time_us']:.1f} us | {r['wrong']} |")
        out.append("")
    return "\n".join(out)
