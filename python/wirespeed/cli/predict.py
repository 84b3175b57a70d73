"""`wirespeed predict`: fit a latency/bandwidth model to recorded runs and predict other world
sizes, hosts, sizes and link rates (docs/predict.md). Pure arithmetic on records: no ranks run."""
from __future__ import annotations

from ..errors import UsageError
from . import flags
from .common import add


def register(sub) -> None:
    p = sub.add_parser("predict", help="fit a latency/bandwidth model to recorded runs, predict "
                       "more ranks, hosts, sizes or another link rate",
                       description="Fit, per link class (shared memory inside a host, network "
                       "between hosts), a latency and a per-byte cost to bench records, combined "
                       "through the algorithm the backend uses; print the predicted table, the "
                       "fitted parameters and their fit error; write predicted records "
                       "(\"predicted\": true) that `plot` and `compare --from` render.")
    p.add_argument("--from", dest="from_paths", nargs="+", required=True, metavar="RUNS",
                   help="records.jsonl files or run directories to fit")
    add(p, "--nprocs", default=None, help="comma list of world sizes to predict")
    add(p, "--ranks-per-host", default=None, help="ranks per host of the predicted jobs (1)")
    add(p, "--hosts", default=None, help="comma list of host counts to predict (what-if)")
    add(p, "--sizes", default=None, help="comma list of sizes (default: the sizes fitted)")
    add(p, "--algo", default="auto", choices=("auto", "ring", "tree", "doubling", "hier", "direct"),
        twin="WIRESPEED_PREDICT_ALGO",
        help="the algorithm to model (auto: the one the backend uses)")
    add(p, "--link-rate", default=None,
        help="what-if: predict on links of this rate (1gbit, 10gbit, 400mbit)")
    add(p, "--measured-link-rate", default=None,
        help="the rate the fitted runs' links had, for records that do not carry it")
    add(p, "--against", nargs="+", default=None, metavar="RUNS",
        help="measured runs to hold the predictions against (their own ranks, hosts and sizes)")
    flags.output(p, "--json", default=None, help="write the predicted records (JSON lines) here")
    flags.output(p, "--plot", default=None, help="write a PNG of measured points and predicted curves here")
    p.set_defaults(func=main)


def _int_list(text, flag) -> list[int] | None:
    if text is None:
        return None
    out = []
    for part in str(text).split(","):
        part = part.strip()
        try:
            n = int(part) if part.isdecimal() else 0
        except ValueError:   # thousands of digits
            n = 0
        if n < 1:
            raise UsageError(f"{flag} takes whole numbers of 1 or more, comma separated; got {text!r}")
        out.append(n)
    return out


def main(args, argv) -> int:
    from ..netem.units import parse_rate
    from ..report.records import load, write_jsonl
    from ..sizes import parse_size
    from ..explain import predict as P
    nprocs = _int_list(args.nprocs, "--nprocs")
    hosts = _int_list(args.hosts, "--hosts")
    k = _int_list(args.ranks_per_host, "--ranks-per-host")
    if k and len(k) > 1:
        raise UsageError(f"--ranks-per-host takes one number, got {args.ranks_per_host!r}")
    sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()] if args.sizes else None
    rate = parse_rate(args.link_rate, "--link-rate") if args.link_rate else None
    measured_rate = parse_rate(args.measured_link_rate, "--measured-link-rate") \
        if args.measured_link_rate else None
    fitted = load(args.from_paths, ("bench",), "predict", "--from")
    checked = load(args.against, ("bench",), "predict", "--against") if args.against else None
    records, against = fitted.records, checked.records if checked else []
    if not nprocs and not hosts and not against:
        raise UsageError("say what to predict: --nprocs N (and --ranks-per-host K), --hosts H, "
                         "or --against RUNS")
    if against and rate:
        raise UsageError("--against compares with runs at their own link rate: leave out --link-rate")
    layouts = P.layouts_from_flags(nprocs, hosts, k[0] if k else None) if nprocs or hosts else []
    if any(l.world < 2 for l in layouts):
        raise UsageError("predict jobs of 2 ranks or more (one rank does not communicate)")
    fits, unfit = P.usable_fits(P.fit_all(records, args.algo, measured_rate))
    if layouts:
        P.check_work(fits, layouts, sizes)
    print(f"# wirespeed predict: {len(fits)} series fitted on {sum(f.model.n_records for f in fits)} "
          f"records from {', '.join(args.from_paths)}")
    for note in (fitted.note(), checked.note() if checked else "", *unfit):
        if note:
            print(note)
    preds = []
    if layouts:
        preds = P.predicted_records(fits, layouts, sizes, rate)
        print(P.render(fits, preds))
    if against:
        print(P.render_checks(P.check_against(fits, against)))
    if args.json and preds:
        write_jsonl(args.json, preds)
        print(f"# wrote {len(preds)} predicted records to {args.json}")
    if args.plot:
        from ..explain.plots import plot_prediction
        plot_prediction(records + against, preds, args.plot)
        print(f"# wrote {args.plot}")
    return 0
