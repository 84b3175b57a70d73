"""`wirespeed plot RECORDS...`: re-plot saved records, several runs on one figure for comparison."""
from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser("plot", help="re-plot saved records (JSON lines or run directories)")
    p.add_argument("records", nargs="+", help="records.jsonl files or run directories")
    p.add_argument("-o", "--output", default="plot.png", help="PNG to write")
    p.add_argument("--title", default=None)
    p.set_defaults(func=main)


def main(args, argv) -> int:
    from ..report.outputs import check_output_file
    from ..report.plot import plot_records
    from ..report.records import read_records
    check_output_file(args.output, "-o")
    records = []
    for path in args.records:
        rs = read_records(path)
        for r in rs:
            # Runs saved without a run id are told apart by their file.
            r.setdefault("run_id", str(path))
        records.extend(rs)
    plot_records(records, args.output, title=args.title)
    print(f"wrote {args.output} ({len(records)} records)")
    return 0
