"""PNG plots of records of every kind wirespeed writes.

Collective records (bench, compare, tune, and `"predicted": true` ones from predict) fill a row of
three panels against size: bus bandwidth, algorithm bandwidth and latency (time, log-log), one line
per series; predictions are dashed, measurements solid. Workload records get a row of their own:
model (time per step per strategy), batching (total time against the number of calls) and objects
(time per call against world size). A record of a kind this version does not know is skipped.
"""
from __future__ import annotations

from pathlib import Path

from .records import kind
from ..sizes import human_bytes

# The panels of the collective row: (record field, title, y label, log y).
SIZE_PANELS = (("busbw_gbps", "bus bandwidth", "busbw (GB/s, 1e9 B/s)", False),
               ("algbw_gbps", "algorithm bandwidth", "algbw (GB/s, 1e9 B/s)", False),
               ("time_us", "latency", "time (us; loop, slowest rank)", True))
WORKLOAD_KINDS = ("model", "batching", "objects")


def series_label(r: dict, with_run: bool) -> str:
    parts = [r["collective"], r["backend"], r["dtype"]]
    if r.get("plan"):
        parts.insert(2, f"plan {r['plan']}")   # bench --plan: the plan, beside the library's own
    if r.get("op"):
        parts.append(r["op"])
    parts.append(f"n={r['world_size']}")
    parts.append("in-place" if r["inplace"] else "out-of-place")
    if r.get("setting_label"):
        parts.append(f"[{r['setting_label']}]")  # a tune run's knob setting
    if r.get("predicted"):
        parts.append("(predicted)")
    if with_run and r.get("run_id"):
        parts.insert(0, f"[{r['run_id']}]")
    return " ".join(parts)


def _size_axis(ax, sizes) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xlabel("size (bytes, as nccl-tests counts it)")
    ax.grid(True, which="both", alpha=0.3)
    ticks = sorted(sizes)
    if ticks:
        step = max(1, len(ticks) // 8)
        ax.set_xticks(ticks[::step])
        ax.set_xticklabels([human_bytes(t) for t in ticks[::step]], rotation=30, fontsize=8)


def _collective_row(axes, data: list[dict]) -> None:
    runs = {r.get("run_id") for r in data}
    lines: dict[str, list[dict]] = {}
    for r in data:
        lines.setdefault(series_label(r, len(runs) > 1), []).append(r)
    for ax, (key, name, ylabel, logy) in zip(axes, SIZE_PANELS):
        for label, rs in lines.items():
            rs = sorted((r for r in rs if r.get(key) is not None and (not logy or r[key] > 0)),
                        key=lambda r: r["bytes"])
            style = "--" if rs and rs[0].get("predicted") else "-"  # predictions dashed
            ax.plot([r["bytes"] for r in rs], [r[key] for r in rs], style, marker="o", markersize=3,
                    label=label)
        _size_axis(ax, {r["bytes"] for r in data})
        if logy:
            ax.set_yscale("log")
        ax.set_ylabel(ylabel)
        ax.set_title(name)
    if lines:
        axes[0].legend(fontsize=7, loc="upper left")


def _model_panel(ax, recs: list[dict]) -> None:
    groups: dict[str, list[dict]] = {}
    for r in recs:
        groups.setdefault(f"{r['model']} {r['backend']} n={r['world_size']} [{r.get('run_id', '')}]",
                          []).append(r)
    strategies = list(dict.fromkeys(r["strategy"] for r in recs))
    width = 0.8 / max(len(groups), 1)
    for i, (label, rs) in enumerate(groups.items()):
        by = {r["strategy"]: r["time_us"] / 1e3 for r in rs}
        xs = [j + i * width for j, s in enumerate(strategies) if s in by]
        ax.bar(xs, [by[s] for s in strategies if s in by], width=width, label=label)
    ax.set_xticks([j + width * (len(groups) - 1) / 2 for j in range(len(strategies))])
    ax.set_xticklabels(strategies, rotation=20, fontsize=8)
    ax.set_ylabel("time per step (ms)")
    ax.set_title("model: gradient sync per step")
    ax.legend(fontsize=7)


def _finish(ax, xlabel: str, ylabel: str, title: str) -> None:
    """A log-scaled time panel's labels, grid and legend."""
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)


def _batching_panel(ax, recs: list[dict]) -> None:
    lines: dict[str, list[dict]] = {}
    for r in recs:
        total = human_bytes(r["total_bytes"])
        lines.setdefault(f"{r['backend']} {total} n={r['world_size']} [{r.get('run_id', '')}]",
                         []).append(r)
    for label, rs in lines.items():
        rs = sorted(rs, key=lambda r: r["chunks"])
        ax.plot([r["chunks"] for r in rs], [r["time_us"] / 1e3 for r in rs], marker="o",
                markersize=3, label=label)
    ax.set_xscale("log")
    _finish(ax, "calls (the same total in k chunks)", "total time (ms)", "batching: one buffer in k calls")


def _objects_panel(ax, recs: list[dict]) -> None:
    lines: dict[str, list[dict]] = {}
    for r in recs:
        lines.setdefault(f"{r['method']} {r['backend']} [{r.get('run_id', '')}]", []).append(r)
    for label, rs in lines.items():
        rs = sorted(rs, key=lambda r: r["world_size"])
        ax.plot([r["world_size"] for r in rs], [r["time_us"] for r in rs], marker="o", markersize=3,
                label=label)
    _finish(ax, "ranks", "time per call (us)", "objects: 'is every rank done?'")


_PANELS = {"model": _model_panel, "batching": _batching_panel, "objects": _objects_panel}


def _train_row(axes, recs: list[dict]) -> None:
    """train: samples/s and the exposed share per backend (measured runs), and the what-if's
    samples/s against hosts (predicted: dashed, the measured run a point on it)."""
    measured = [r for r in recs if not r.get("predicted")]
    predicted = [r for r in recs if r.get("predicted")]
    labels = [f"{r['backend']}\nn={r['world_size']}" for r in measured]
    xs = range(len(measured))
    bars = axes[0].bar(xs, [r["samples_per_s"] for r in measured])
    for b, r in zip(bars, measured):
        axes[0].annotate(f"{r['samples_per_s']:.1f}", (b.get_x() + b.get_width() / 2, b.get_height()),
                         ha="center", va="bottom", fontsize=8)
    axes[0].set_ylabel("samples/s (all ranks)")
    axes[1].bar(xs, [r["exposed_pct"] for r in measured], color="tab:red")
    axes[1].set_ylim(0, 100)
    axes[1].set_ylabel("exposed communication (% of the step)")
    for ax, what in ((axes[0], "samples/s"), (axes[1], "exposed communication")):
        ax.set_xticks(list(xs))
        ax.set_xticklabels(labels, fontsize=8)
        m = measured[0] if measured else {}
        ax.set_title(f"train {m.get('model', '')} {m.get('parallel', '')}: {what}")
    if not predicted:
        axes[2].set_visible(False)
        return
    lines: dict[tuple, list[dict]] = {}
    for r in predicted:
        lines.setdefault((r["backend"], r["link_rate_gbps"]), []).append(r)
    colours: dict[str, str] = {}
    cycle = ["tab:blue", "tab:orange", "tab:green", "tab:purple", "tab:brown", "tab:gray"]
    for (backend, rate), rs in lines.items():
        rs = sorted(rs, key=lambda r: r["hosts"])
        c = colours.setdefault(backend, cycle[len(colours) % len(cycle)])
        styles = ("--", ":", "-.")
        style = styles[sorted({k[1] for k in lines}).index(rate) % len(styles)]
        axes[2].plot([r["hosts"] for r in rs], [r["samples_per_s"] for r in rs], linestyle=style,
                     marker="x", color=c, label=f"{backend} at {rate:g} Gbit/s (predicted)")
    for r in measured:
        if r.get("hosts", 1) > 1 and r["backend"] in colours:
            axes[2].plot([r["hosts"]], [r["samples_per_s"]], marker="o", color=colours[r["backend"]],
                         linestyle="none", label=f"{r['backend']} measured")
    axes[2].set_xscale("log", base=2)
    axes[2].set_xlabel("hosts")
    axes[2].set_ylabel("samples/s (all ranks)")
    axes[2].set_title("what-if: samples/s against hosts")
    axes[2].grid(True, which="both", alpha=0.3)
    axes[2].legend(fontsize=7)


def plot_records(records, path, title: str | None = None) -> dict[str, int]:
    """Write one PNG of every plottable record; returns how many records of each kind it drew."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_kind: dict[str, list[dict]] = {}
    for r in records:
        by_kind.setdefault(kind(r), []).append(r)
    sized = [r for r in by_kind.get("bench", []) if r["collective"] != "barrier" and r["bytes"] > 0]
    workloads = [k for k in WORKLOAD_KINDS if by_kind.get(k)]
    train = by_kind.get("train", [])
    rows = (1 if sized or not (workloads or train) else 0) + (1 if workloads else 0) + (1 if train else 0)
    fig, axes = plt.subplots(rows, 3, figsize=(18, 5 * rows), squeeze=False)
    row = 0
    if sized or not (workloads or train):
        _collective_row(axes[0], sized)
        row = 1
    for i, k in enumerate(workloads):
        _PANELS[k](axes[row][i], by_kind[k])
    if workloads:
        for ax in axes[row][len(workloads):]:
            ax.set_visible(False)
        row += 1
    if train:
        _train_row(axes[row], train)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    drawn = {"bench": len(sized)}
    drawn.update({k: len(by_kind[k]) for k in workloads})
    if train:
        drawn["train"] = len(train)
    return drawn
