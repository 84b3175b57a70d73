"""`wirespeed plot RECORDS...`: re-plot saved records of any kind, several runs on one figure."""
from __future__ import annotations

from . import flags


def register(sub) -> None:
    p = sub.add_parser("plot", help="re-plot saved records (JSON lines or run directories)",
                       description="Plot records of every kind wirespeed writes (bench, compare, tune "
                       "and predicted ones against size: busbw, algbw and latency; model, batching "
                       "and objects in a row of their own), several runs on one figure.")
    p.add_argument("records", nargs="+", help="records.jsonl files or run directories")
    flags.output(p, "-o", "--output", twin=False, default="plot.png", help="PNG to write")
    p.add_argument("--title", default=None)
    p.set_defaults(func=main)


def main(args, argv) -> int:
    from ..report.plot import WORKLOAD_KINDS, plot_records
    from ..report.records import load
    records, notes = [], []
    for path in args.records:
        loaded = load([path], ("bench", *WORKLOAD_KINDS), "plot")
        for r in loaded.records:
            # Runs saved without a run id are told apart by their file.
            r.setdefault("run_id", str(path))
        records.extend(loaded.records)
        notes.append(loaded.note())
    drawn = plot_records(records, args.output, title=args.title)
    left = len(records) - sum(drawn.values())
    parts = ", ".join(f"{n} {k}" for k, n in drawn.items() if n)
    note = f"; {left} not plotted (barrier or size 0)" if left else ""
    print(f"wrote {args.output} ({len(records)} records: {parts}{note})")
    for line in filter(None, notes):
        print(line)
    return 0
