"""`wirespeed plan`: MSCCL++ execution plans on CPUs (docs/plans.md).

`plan check PLAN.json` runs a plan in one process and says whether its outputs are right, whether
it can deadlock and whether it races; `plan simulate` times it on a described machine. No ranks
are launched: both are one process (`bench --plan` executes a plan across real ranks).
"""
from __future__ import annotations

import json

from ..errors import EXIT_FAILED, UsageError
from . import flags
from .common import add, positive_int


def register(sub) -> None:
    p = sub.add_parser("plan", help="check or simulate MSCCL++ execution plans on CPUs",
                       description="Read MSCCL++ execution plans (the JSON its DSL emits) and check "
                       "them (outputs, deadlocks, races) or simulate their time on a described machine.")
    ps = p.add_subparsers(dest="plan_command", metavar="ACTION", parser_class=type(p))
    c = ps.add_parser("check", help="run a plan in one process: outputs against the collective, "
                      "deadlocks, races, chunk ranges",
                      description="Run every rank's thread blocks of the plan in one process, "
                      "deterministically, with data unique to (rank, element, run); compare every "
                      "rank's output chunks with the collective's definition, find deadlocks (waits "
                      "no signal can satisfy) and races (accesses the plan's signal/wait/barrier/"
                      "semaphore/packet order does not order). Exit 0 only when the plan is right.")
    c.add_argument("plans", nargs="+", metavar="PLAN", help="plan JSON files, or wirespeed:NAME for "
                   "one of wirespeed's own algorithms written as a plan (e.g. wirespeed:allreduce-ring-port)")
    plan_shape(c)
    add(c, "--size", default=None, help="message size to check at (bytes, or 4K, 1M; default: the "
        "smallest the plan's chunks allow, twice over)")
    add(c, "--runs", default="2", type=positive_int("--runs", 1),
        help="back-to-back runs per rank (2 finds one run overtaking the next)")
    add(c, "--strict", action="store_true", default=False,
        help="warnings (ordering only through relaxed signals, hazards between runs) fail the check")
    flags.output(c, "--json", default=None, help="write one JSON verdict per plan here")
    c.set_defaults(func=check_main)
    s = ps.add_parser("simulate", help="time plans on a described machine, side by side per size",
                      description="Run each plan in one process in virtual time on the machine "
                      "--topology describes (latency and bandwidth per channel type, NICs shared per "
                      "host, links held first come first served) and print, per message size, each "
                      "plan's time and busbw (nccl-tests' definition), the fastest marked. The model "
                      "and where it stops being right: docs/plans-simulate.md.")
    s.add_argument("plans", nargs="+", metavar="PLAN", help="plan JSON files or wirespeed:NAME (side by "
                   "side: one collective on one number of ranks)")
    add(s, "--topology", default=None, help="a preset (nvlink-ib, cpu-emulated), key=value,... after an "
        "optional preset (ranks-per-host=4,memory=150GB/s:0.8us,port=12.5GB/s:5us,switch=300GB/s:1us,"
        "copy=200GB/s,op=0.2us; also fabric=, nics-per-host=), or a JSON file of those keys "
        "(default: nvlink-ib)")
    add(s, "--sizes", dest="plan_sizes", default=None, twin="WIRESPEED_PLAN_SIZES",
        help="comma list of message sizes (1K,1M,...; default 1K..1G by x4); each is rounded to the "
        "nearest the plan's chunks allow, and the table says so")
    add(s, "--runs", dest="sim_runs", default="1", type=positive_int("--runs", 1),
        help="runs back to back per rank, as a benchmark loop makes them (each rank starts its next "
        "run when its last ends); the time shown is their total / runs (default 1: one run from a "
        "common start)")
    plan_shape(s)
    flags.output(s, "--json", default=None, help="write one JSON record per plan and size here")
    s.set_defaults(func=simulate_main)
    p.set_defaults(func=lambda args, argv: p.print_help() or 2)


def plan_shape(p) -> None:
    """--ranks and --ranks-per-host: what a file plan must have, what a built-in one is written for."""
    add(p, "--ranks", default=None, type=positive_int("--ranks", 1),
        help="ranks: the number a plan file must have (an error if it has another); the number a "
        "wirespeed:NAME plan is written for (default 4)")
    add(p, "--ranks-per-host", default=None, type=positive_int("--ranks-per-host", 1),
        help="ranks per host a wirespeed:NAME plan across hosts is written for (default 1)")


def load_plan(path: str, ranks: int | None, ranks_per_host: int | None = None):
    """A plan file, or wirespeed:NAME written by plans/algorithms.py at --ranks."""
    from ..plans.format import load, parse
    if path.startswith("wirespeed:"):
        from ..plans.algorithms import builtin
        try:
            obj = builtin(path.split(":", 1)[1], ranks or 4, ranks_per_host)
        except ValueError as e:
            raise UsageError(str(e)) from None
        return parse(obj, source=path)
    plan = load(path)
    if ranks is not None and plan.nranks != ranks:
        raise UsageError(f"{path}: the plan has {plan.nranks} ranks, --ranks says {ranks}")
    return plan


def check_main(args, argv) -> int:
    from ..plans.check import check
    from ..sizes import parse_size
    size = parse_size(str(args.size)) if args.size is not None else None
    verdicts, bad = [], 0
    for path in args.plans:
        plan = load_plan(path, args.ranks, args.ranks_per_host)
        result = check(plan, size=size, runs=int(args.runs), strict=bool(args.strict))
        print(f"{path}:")
        for line in result.lines():
            print(line)
        bad += not result.ok
        verdicts.append({"schema": "wirespeed.plan_check/1", "plan": path, "name": plan.name,
                         "collective": plan.collective, "ranks": plan.nranks, "size": result.size,
                         "runs": result.runs, "ok": result.ok, "error": result.error,
                         "races": [str(r) for r in result.races],
                         "warnings": [str(r) for r in result.relaxed + result.between],
                         "wrong_chunks": [{"rank": c.rank, "run": c.run, "chunk": c.chunk,
                                           "detail": c.detail} for c in result.chunks if not c.right]})
    if args.json:
        with open(args.json, "w") as f:
            for v in verdicts:
                f.write(json.dumps(v) + "\n")
    if len(args.plans) > 1:
        print(f"{len(args.plans) - bad} of {len(args.plans)} plans right")
    return EXIT_FAILED if bad else 0


def simulate_main(args, argv) -> int:
    import os

    from ..plans.simulate import compare, default_sizes, table
    from ..plans.topology import parse_topology
    from ..sizes import parse_size
    topo = parse_topology(args.topology)
    if args.ranks_per_host and "ranks-per-host" not in str(args.topology or ""):
        # A built-in plan written for K ranks per host runs on hosts of K ranks unless said otherwise.
        from dataclasses import replace
        topo = replace(topo, ranks_per_host=int(args.ranks_per_host))
    if args.plan_sizes:
        sizes = [parse_size(x) for x in str(args.plan_sizes).split(",") if x.strip()]
        if not sizes or min(sizes) < 1:
            raise UsageError(f"--sizes {args.plan_sizes!r}: give positive sizes, e.g. 1K,1M,1G")
    else:
        sizes = default_sizes()
    plans = [(path, load_plan(path, args.ranks, args.ranks_per_host)) for path in args.plans]
    stems = [os.path.splitext(os.path.basename(path))[0] for path, _ in plans]
    labels = stems if len(set(stems)) == len(stems) else [path for path, _ in plans]
    rows = compare(plans, topo, sizes, int(args.sim_runs))
    for line in table([(lab, p) for lab, (_, p) in zip(labels, plans)], rows, topo):
        print(line)
    if args.json:
        with open(args.json, "w") as f:
            for results in rows:
                for (path, _), r in zip(plans, results):
                    rec = r.record(path)
                    rec["topology"] = topo.as_dict()
                    f.write(json.dumps(rec) + "\n")
    return 0
