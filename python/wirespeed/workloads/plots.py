"""Plots of workload records (matplotlib, no display needed)."""
from __future__ import annotations

from pathlib import Path


def plot_batching(records: list[dict], fit: tuple[float, float] | None, total: int, path: str) -> None:
    """Total time against the number of calls (log-log), measured points and the fitted k*a + b*total."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ks = [r["chunks"] for r in records]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot(ks, [r["time_us"] / 1e3 for r in records], "o", label="measured (median, slowest rank)")
    if fit:
        a, b = fit
        lo, hi = min(ks), max(ks)
        xs = [lo * (hi / lo) ** (i / 100) for i in range(101)] if hi > lo else [lo]
        ax.plot(xs, [(k * a + b * total) * 1e3 for k in xs], "-",
                label=f"fit: k x {a * 1e6:.1f} us + total / "
                      f"{(1 / b / 1e9 if b > 0 else float('inf')):.2f} GB/s")
    r0 = records[0]
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("calls (chunks of equal size)")
    ax.set_ylabel("total time (ms)")
    ax.set_title(f"all_reduce of {total / (1 << 20):g} MiB as k calls ({r0['backend']}, "
                 f"{r0['device']}, {r0['world_size']} ranks)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
