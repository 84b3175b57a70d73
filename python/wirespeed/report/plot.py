"""PNG plots of records: busbw and algbw against size (log x), one line per series."""
from __future__ import annotations

from pathlib import Path

from .table import human_bytes


def series_label(r: dict, with_run: bool) -> str:
    parts = [r["collective"], r["backend"], r["dtype"]]
    if r.get("op"):
        parts.append(r["op"])
    parts.append(f"n={r['world_size']}")
    parts.append("in-place" if r["inplace"] else "out-of-place")
    if r.get("predicted"):
        parts.append("(predicted)")
    if with_run and r.get("run_id"):
        parts.insert(0, f"[{r['run_id']}]")
    return " ".join(parts)


def plot_records(records, path, title: str | None = None) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = [r for r in records if r["collective"] != "barrier" and r["bytes"] > 0]
    runs = {r.get("run_id") for r in data}
    lines: dict[str, list[dict]] = {}
    for r in data:
        lines.setdefault(series_label(r, len(runs) > 1), []).append(r)
    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    for ax, key, name in ((axes[0], "busbw_gbps", "bus bandwidth"), (axes[1], "algbw_gbps", "algorithm bandwidth")):
        for label, rs in lines.items():
            rs = sorted(rs, key=lambda r: r["bytes"])
            style = "--" if rs[0].get("predicted") else "-"  # predictions dashed, measurements solid
            ax.plot([r["bytes"] for r in rs], [r[key] for r in rs], style, marker="o", markersize=3,
                    label=label)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("size (bytes, as nccl-tests counts it)")
        ax.set_ylabel(f"{name} (GB/s, 1e9 B/s)")
        ax.grid(True, which="both", alpha=0.3)
        ticks = sorted({r["bytes"] for r in data})
        if ticks:
            step = max(1, len(ticks) // 8)
            ax.set_xticks(ticks[::step])
            ax.set_xticklabels([human_bytes(t) for t in ticks[::step]], rotation=30, fontsize=8)
        ax.set_title(name)
    if lines:
        axes[0].legend(fontsize=7, loc="upper left")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
