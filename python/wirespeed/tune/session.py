"""One tune end to end: the header, the sweep, the verdict, records and logs saved."""
from __future__ import annotations

import sys
import time

from ..report.outputs import run_dir, save_verdict
from . import verdict
from .sweep import TuneConfig, run_sweep, settings


def _print(text: str = "") -> None:
    print(text)
    sys.stdout.flush()


def run_tune(cfg: TuneConfig, notes: list[str]) -> int:
    plan = settings(cfg.knobs)
    tune_id = time.strftime("%Y%m%d-%H%M%S")
    out_dir = run_dir(cfg.save_dir, "tune", tune_id)
    knobs = ", ".join(dict.fromkeys(k.name for k in cfg.knobs))
    run = cfg.run
    _print(f"# wirespeed tune: backend {run.backend}, device {run.device}, {run.nproc} ranks"
           f"{', emulated cluster ' + run.cluster if run.cluster else ''}"
           f"{', a host per rank' if run.host_per_rank else ''}; knobs {knobs}")
    _print(f"# {len(plan)} settings (the defaults, then each knob or group over its values, the others "
           f"at their defaults) x {cfg.repeat} repeat{'s' if cfg.repeat != 1 else ''}, interleaved; "
           f"each a checked `wirespeed bench` of its own ({len(run.sizes)} sizes, {run.iters} calls "
           "per size)")
    for note in notes:
        _print(f"# note: {note}")
    outcome = run_sweep(cfg, plan, tune_id, out_dir / "logs" if out_dir else None, say=_print)
    failed = {label for label, _ in outcome.failures}
    usable = [r for r in outcome.records if r["setting_label"] not in failed]
    _print()
    if failed:
        _print("# failed (left out of the verdict; logs kept):")
        for label, why in dict(outcome.failures).items():
            _print(f"#   {label}: {why}")
    text, summary = verdict.render(usable, cfg.repeat)
    _print(text)
    for r in summary:
        r.update(tune_id=tune_id, backend=run.backend, knobs=list(dict.fromkeys(k.name for k in cfg.knobs)))
    records = outcome.records + summary
    save_verdict(cfg.json_path, out_dir, records, text, _print)
    wrong = sum(int(r["wrong"]) for r in outcome.records)
    if wrong:
        sys.stderr.write(f"wirespeed: error: {wrong} wrong elements in the sweep (the WRONG cells)\n")
    if not any(r["setting_label"] == verdict.DEFAULT_LABEL for r in usable):
        sys.stderr.write("wirespeed: error: the run at the defaults failed: nothing to compare against\n")
        return 1
    return 1 if wrong else 0
