"""`wirespeed plot RECORDS...`: re-plot saved records of any kind, several runs on one figure."""
from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser("plot", help="re-plot saved records (JSON lines or run directories)",
                       description="Plot records of every kind wirespeed writes (bench, compare, tune "
                       "and predicted ones against size: busbw, algbw and latency; model, batching "
                       "and objects in a row of their own), several runs on one figure.")
    p.add_argument("records", nargs="+", help="records.jsonl files or run directories")
    p.add_argument("-o", "--output", default="plot.png", help="PNG to write")
    p.add_argument("--title", default=None)
    p.set_defaults(func=main)


def main(args, argv) -> int:
    from ..errors import UsageError
    from ..report.outputs import check_output_file
    from ..report.plot import WORKLOAD_KINDS, plot_records
    from ..report.records import kind, read_records
    check_output_file(args.output, "-o")
    records = []
    for path in args.records:
        rs = read_records(path)
        for r in rs:
            # Runs saved without a run id are told apart by their file.
            r.setdefault("run_id", str(path))
        records.extend(rs)
    if not any(kind(r) in ("bench", *WORKLOAD_KINDS) for r in records):
        raise UsageError(f"nothing to plot in {', '.join(map(str, args.records))}: no collective, "
                         "model, batching or objects records")
    drawn = plot_records(records, args.output, title=args.title)
    left = len(records) - sum(drawn.values())
    parts = ", ".join(f"{n} {k}" for k, n in drawn.items() if n)
    skipped = {kind(r) or r.get("schema", "?") for r in records} - set(k for k, n in drawn.items() if n)
    note = f"; {left} not plotted ({', '.join(sorted(skipped)) or 'barrier or size 0'})" if left else ""
    print(f"wrote {args.output} ({len(records)} records: {parts}{note})")
    return 0
