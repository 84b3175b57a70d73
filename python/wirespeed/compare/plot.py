"""Plots in the style of the MLBench backend study: time against size on log-log axes, one panel per
world size, one colour per backend, dtypes as line styles (devices as markers); with repeats, the
band between the fastest and slowest repeat is shaded, so noise is visible as width, not as a win.
"""
from __future__ import annotations

from pathlib import Path

from ..sizes import human_bytes
from .stats import fold

_STYLES = {"float32": "-", "float16": "--", "bfloat16": ":", "float64": "-.", "int8": (0, (1, 1)),
           "uint8": (0, (1, 1)), "int32": (0, (5, 1)), "int64": (0, (3, 1, 1, 1))}
_MARKERS = {"cpu": "o", "cuda": "s"}


def plot_compare(records, out_dir, variant: str = "best") -> list[str]:
    """One PNG per (collective, op) in out_dir; returns the paths written."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folded = fold([r for r in records if r["collective"] != "barrier" and r["bytes"] > 0], variant)
    figs: dict = {}
    for (coll, op, device, world), cols in folded.items():
        figs.setdefault((coll, op), {}).setdefault(world, []).append((device, cols))
    backends = sorted({b for blocks in figs.values() for ws in blocks.values()
                       for _, cols in ws for b, _ in cols})
    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    colour = {b: palette[i % len(palette)] for i, b in enumerate(backends)}
    written = []
    for (coll, op), worlds in sorted(figs.items(), key=lambda kv: (kv[0][0], str(kv[0][1]))):
        ws = sorted(worlds)
        fig, axes = plt.subplots(1, len(ws), figsize=(5.2 * len(ws), 4.4), squeeze=False, sharey=True)
        for ax, world in zip(axes[0], ws):
            for device, cols in sorted(worlds[world]):
                for (backend, dtype), sizes in sorted(cols.items()):
                    xs = sorted(sizes)
                    ys = [sizes[x].time_us for x in xs]
                    ax.plot(xs, ys, color=colour[backend], linestyle=_STYLES.get(dtype, "-"),
                            marker=_MARKERS.get(device, "o"), markersize=3,
                            label=f"{backend} {dtype} {device}")
                    if any(sizes[x].repeats > 1 for x in xs):
                        ax.fill_between(xs, [sizes[x].time_lo_us for x in xs],
                                        [sizes[x].time_hi_us for x in xs], color=colour[backend],
                                        alpha=0.15, linewidth=0)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(f"{world} rank{'s' if world != 1 else ''}")
            ax.set_xlabel("size (bytes)")
            ax.grid(True, which="both", alpha=0.3)
            ticks = sorted({x for _, cols in worlds[world] for s in cols.values() for x in s})
            if ticks:
                step = max(1, len(ticks) // 6)
                ax.set_xticks(ticks[::step])
                ax.set_xticklabels([human_bytes(t) for t in ticks[::step]], rotation=30, fontsize=8)
            ax.legend(fontsize=7, loc="upper left")
        axes[0][0].set_ylabel("time (us, loop, slowest rank)")
        fig.suptitle(f"{coll}{' (' + op + ')' if op else ''}: time against size, per world size")
        fig.tight_layout()
        path = Path(out_dir) / f"compare_{coll}{'_' + op if op else ''}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(str(path))
    return written
