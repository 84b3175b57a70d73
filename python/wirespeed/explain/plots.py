"""PNGs of the explain commands: measured points with predicted curves (predict), and the pairwise
bandwidth and latency heatmaps (links)."""
from __future__ import annotations

from pathlib import Path

from ..sizes import human_bytes
from . import fields as F


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def plot_prediction(measured: list[dict], predicted: list[dict], path: str, title: str | None = None) -> None:
    """busbw and time against size: measured records as points, predicted records as lines,
    one colour per series and world size."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    keys: dict = {}

    def colour(r):
        k = (F.series_key(r), F.world_size(r))
        return colours[keys.setdefault(k, len(keys)) % len(colours)]

    def label(r, what):
        return f"{r['collective']} {r['backend']} n={r['world_size']} {what}"

    for data, measured_style in ((measured, True), (predicted, False)):
        lines: dict = {}
        for r in data:
            if r["bytes"] > 0:
                lines.setdefault((F.series_key(r), F.world_size(r), F.layout_of(r).describe()), []).append(r)
        for rs in lines.values():
            rs.sort(key=F.size_bytes)
            c = colour(rs[0])
            x = [F.size_bytes(r) for r in rs]
            for ax, ys in ((axes[0], [r["busbw_gbps"] for r in rs]), (axes[1], [F.time_us(r) for r in rs])):
                if measured_style:
                    ax.plot(x, ys, "o", color=c, markersize=5, label=label(rs[0], "measured"))
                else:
                    ax.plot(x, ys, "--", color=c, label=label(rs[0], "predicted"))
    ticks = sorted({F.size_bytes(r) for r in measured + predicted if r["bytes"] > 0})
    for ax, name in ((axes[0], "bus bandwidth (GB/s, 1e9 B/s)"), (axes[1], "time per call (us)")):
        ax.set_xscale("log", base=2)
        if ax is axes[1]:
            ax.set_yscale("log")
        ax.set_xlabel("size (bytes, as nccl-tests counts it)")
        ax.set_ylabel(name)
        ax.grid(True, which="both", alpha=0.3)
        if ticks:
            step = max(1, len(ticks) // 8)
            ax.set_xticks(ticks[::step])
            ax.set_xticklabels([human_bytes(t) for t in ticks[::step]], rotation=30, fontsize=8)
    axes[0].legend(fontsize=7, loc="best")
    fig.suptitle(title or "wirespeed predict: measured (points) and predicted (dashed)")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_heatmaps(names: list[str], gbps, lat_us, path: str, title: str) -> None:
    """Two heatmaps (sender rows, receiver columns): GB/s and microseconds; the diagonal is empty."""
    import numpy as np
    plt = _pyplot()
    n = len(names)
    fig, axes = plt.subplots(1, 2, figsize=(6 + 0.5 * n, 3 + 0.25 * n))
    for ax, data, name, cmap in ((axes[0], gbps, "bandwidth (GB/s)", "viridis"),
                                 (axes[1], lat_us, "latency (us)", "magma_r")):
        m = np.array([[np.nan if v is None else v for v in row] for row in data], dtype=float)
        im = ax.imshow(m, cmap=cmap)
        fig.colorbar(im, ax=ax, fraction=0.046)
        ax.set_xticks(range(n))
        ax.set_yticks(range(n))
        ax.set_xticklabels(names, rotation=45, fontsize=8)
        ax.set_yticklabels(names, fontsize=8)
        ax.set_xlabel("to")
        ax.set_ylabel("from")
        ax.set_title(name)
        if n <= 16:
            mid = (np.nanmin(m) + np.nanmax(m)) / 2 if np.any(~np.isnan(m)) else 0.0
            for i in range(n):
                for j in range(n):
                    if not np.isnan(m[i, j]):
                        # Dark text on the light end of each colour map, white on the dark end.
                        light = m[i, j] > mid if cmap == "viridis" else m[i, j] < mid
                        ax.text(j, i, f"{m[i, j]:.3g}", ha="center", va="center", fontsize=7,
                                color="k" if light else "w")
    fig.suptitle(title)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
