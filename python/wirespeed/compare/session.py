"""One comparison end to end: plan the matrix, run it, print tables and the summary, save records,
plots and logs. `rebuild` does the printing and plotting again from saved records (--from)."""
from __future__ import annotations

import sys
import time
from pathlib import Path

from ..errors import UsageError
from ..report.outputs import run_dir
from ..report.records import load, write_jsonl
from . import render
from .plan import CompareConfig, gpu_count, make_plan
from .plot import plot_compare
from .runner import bench_run, run_matrix


def _print(text: str) -> None:
    if text:
        print(text)
    sys.stdout.flush()


def report(records, variant: str, plot_dir: str | None) -> None:
    _print(render.tables(records, variant))
    _print("")
    _print("# summary")
    _print(render.summary(records, variant))
    if plot_dir:
        for path in plot_compare(records, plot_dir, variant):
            _print(f"# plot: {path}")


def _placement(cfg: CompareConfig):
    """n -> the most ranks of an n-rank run on one host, as bench will place them."""
    from ..launch.gpus import most_ranks_on_one_host
    hosts = None
    if cfg.cluster:
        from ..netem import cluster as C
        hosts = len(C.require(C.check_name(cfg.cluster)).hosts)
    return lambda n: most_ranks_on_one_host(n, hosts, cfg.ranks_per_host, cfg.host_per_rank)


def run_compare(cfg: CompareConfig) -> int:
    from ..backends.registry import BACKENDS
    plan = make_plan(cfg.backends, [*cfg.dtypes], cfg.devices, cfg.nprocs, BACKENDS, gpu_count(),
                     _placement(cfg))
    for combo in plan.runs:  # every combination's resources, before the first runs
        try:
            bench_run(combo, cfg).check_resources()
        except UsageError as e:
            raise UsageError(f"{combo.label()} cannot run here: {e}") from None
    compare_id = time.strftime("%Y%m%d-%H%M%S")
    out_dir = run_dir(cfg.save_dir, "compare", compare_id)
    _print(f"# wirespeed compare: {len(plan.runs)} combination{'s' if len(plan.runs) != 1 else ''}"
           f" x {cfg.repeat} repeat{'s' if cfg.repeat != 1 else ''}, {', '.join(cfg.collectives)} "
           f"({', '.join(cfg.ops)}), {len(cfg.sizes)} size{'s' if len(cfg.sizes) != 1 else ''}, "
           f"{cfg.iters} iterations each")
    _print(render.skipped_text("skipped (cannot run here)", plan.skipped))
    if not plan.runs:
        sys.stderr.write("wirespeed: error: no combination can run here (see the skipped list)\n")
        return 2
    outcome = run_matrix(plan, cfg, compare_id, out_dir / "logs" if out_dir else None, say=_print)
    _print("")
    _print(render.skipped_text("skipped (cannot run here)", plan.skipped))
    _print(render.skipped_text("no results", outcome.empty))
    _print(render.skipped_text("failed", outcome.failures))
    _print("")
    plot_dir = cfg.plot_dir or (str(out_dir) if out_dir else None)
    report(outcome.records, cfg.variant, plot_dir)
    if cfg.json_path:
        write_jsonl(cfg.json_path, outcome.records)
    if out_dir:
        write_jsonl(out_dir / "records.jsonl", outcome.records)
        (out_dir / "summary.txt").write_text(render.tables(outcome.records, cfg.variant) + "\n\n"
                                             + render.summary(outcome.records, cfg.variant) + "\n")
        _print(f"# saved records, summary, plots and logs in {out_dir}/ "
               f"(`wirespeed compare --from {out_dir}` rebuilds them)")
    wrong = sum(int(r["wrong"]) for r in outcome.records)
    if wrong:
        sys.stderr.write(f"wirespeed: error: {wrong} wrong elements across the comparison "
                         "(see WRONG cells)\n")
    if outcome.failures:
        sys.stderr.write(f"wirespeed: error: {len(outcome.failures)} run"
                         f"{'s' if len(outcome.failures) != 1 else ''} failed (listed above)\n")
    return 1 if wrong or outcome.failures else 0


def rebuild(paths: list[str], variant: str, plot_dir: str | None) -> int:
    """Tables, summary and plots from saved records (compare or bench runs, any mix)."""
    loaded = load(paths, ("bench",), "compare", "--from")  # other kinds (model, ...) have no sizes
    records = loaded.records
    if plot_dir is None:
        first = Path(paths[0])
        plot_dir = str(first if first.is_dir() else first.parent)
    from ..report.outputs import check_output_dir
    check_output_dir(plot_dir, "--plot-dir")
    _print(f"# wirespeed compare: rebuilt from {len(records)} records in {', '.join(paths)}")
    _print(loaded.note())
    report(records, variant, plot_dir)
    return 0
