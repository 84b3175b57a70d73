"""What `train --tune` prints: the table of every configuration tried, the recommendation with the
lines that apply it (the wrapper's arguments and hook to paste, the threads, the knobs' `export`
lines, the `wirespeed train` command that reproduces it), what was pruned or skipped, and one
wirespeed.train/1 record per configuration (docs/records.md). Pure functions of the search.

The guard: within the tolerance, or within FLOOR_FACTOR x the noise floor the default's
rounding-only twin measured (train/guard.py), printed in the table's header; a configuration
within only by the floor says so in its verdict and in the recommendation.

The recommendation: the fastest configuration within the guard whose median run beats the
default's by at least CLEAR_GAIN and whose slowest run is faster than the default's median (so a
gain inside the spread of the repeats is not recommended). Compression is named as such in every
line that recommends it.
"""
from __future__ import annotations

import shlex

from . import guard
from .hooks import describe_hook, paste_lines

CLEAR_GAIN = 1.02
# --tune's own flags and the outputs: the reproducing command leaves them out.
_DROP_VALUE = {"--budget", "--loss-tolerance", "--candidates", "--json", "--repeat", "--save-dir"}
_DROP_BARE = {"--tune", "--no-save"}


def _verdict(i: int, rec: dict, first: dict, tol: float, s) -> str:
    gain = rec["samples_per_s"] / first["samples_per_s"]
    if i == 0:
        return "the default (exact)"
    if i in s.stopped:
        return f"{s.pruned[i]}: never recommended"
    if not guard.within(rec, tol, s.floor):
        return f"{'faster' if gain > 1 else 'slower'}, changes training by {guard.changed_by(rec):.1%}: never recommended"
    by_floor = guard.only_by_floor(rec, tol, s.floor)
    if i in s.pruned and i in s.built_on:
        return s.pruned[i] + (" (within the noise floor)" if by_floor else "")
    if i in s.pruned:
        return "slower after its first run: not run again" + (" (within the noise floor)" if by_floor else "")
    return ("within the noise floor, not the tolerance" if by_floor else "within tolerance") + \
        ("" if gain >= 1 else ", slower")


def floor_line(floor: guard.Floor, tol: float) -> str:
    """The table header's account of the noise floor and the bounds it sets."""
    if not floor.measured():
        return "# noise floor: not measured (the twin gave no figures): the tolerance alone decides"
    lb, db = floor.bounds(tol)
    return (f"# noise floor: drift {floor.drift:.2%}, loss {floor.loss:.2%}, from {floor.source} (the default with "
            f"only its sums' order changed); a configuration passes with drift up to {db:.2%} and loss diff up "
            f"to {lb:.2%} (the larger of the tolerance {tol:.1%} and {guard.FLOOR_FACTOR:g} x the floor)")


def _clear_win(runs: list[dict], rec: dict, first: dict) -> bool:
    """At least CLEAR_GAIN over the default's median, and its slowest run above that median."""
    return rec["samples_per_s"] >= first["samples_per_s"] * CLEAR_GAIN and \
        min(r["samples_per_s"] for r in runs) > first["samples_per_s"]


def reproduce(argv: list[str], flags: list[str], env: dict) -> str:
    """The user's own command without --tune's flags, with the configuration's flags replacing any
    the user gave for the same options, and its knobs in front."""
    args = list(argv[1:] if argv and argv[0] == "train" else argv)
    replaced = {f for f in flags if f.startswith("--")}
    pair = {"--reshard-after-forward", "--no-reshard-after-forward"}
    if pair & replaced:
        replaced |= pair
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
            continue
        name = a.split("=", 1)[0]
        if name in _DROP_BARE or (name in _DROP_VALUE | replaced and "=" in a):
            continue
        if name in _DROP_VALUE | replaced:
            skip = name not in ("--grad-as-bucket-view", "--static-graph", "--reshard-after-forward",
                                "--no-reshard-after-forward")
            continue
        out.append(a)
    prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    return (prefix + " " if prefix else "") + "wirespeed train " + shlex.join(out + flags)


def render(s, summary: list[tuple[int, dict]], base, backend: str, tol: float, argv: list[str],
           tune_id: str) -> tuple[str, list[dict]]:
    by_index = dict(summary)
    lines: list[str] = []
    if 0 not in by_index:
        return "# the default configuration gave no figures: nothing to compare against", []
    first = by_index[0]
    width = max(24, *(len(s.plan[i].label(base)) for i, _ in summary))
    wire_key = "wire_bytes_per_step" if first.get("wire_bytes_per_step") else "bytes_per_step"
    lines.append(f"# {first['model']}, {first['parallel']}, {first['world_size']} ranks, backend {backend}: "
                 f"samples/s the median over its runs (each run's: the median step); speed-up over the default's median; exposed = (step - "
                 f"compute) / step; MB/step = {'bytes each host link carries per step' if wire_key != 'bytes_per_step' else 'bytes handed to the collectives per step and rank'}; "
                 f"loss diff and param drift against the default's (exact) run, tolerance {tol:.1%}")
    lines.append(floor_line(s.floor, tol))
    lines.append(f"{'configuration':<{width}} {'runs':>4} {'samples/s':>10} {'speed-up':>8} {'exposed':>8} "
                 f"{'MB/step':>9} {'loss diff':>9} {'drift':>8}  verdict")
    best = None
    for i, rec in summary:
        gain = rec["samples_per_s"] / first["samples_per_s"]
        rec["speedup_vs_default"] = gain
        rec["verdict"] = _verdict(i, rec, first, tol, s)
        ok = i and guard.within(rec, tol, s.floor) and i not in s.pruned and \
            _clear_win(s.runs[i], rec, first)
        if ok and (best is None or rec["samples_per_s"] > by_index[best]["samples_per_s"]):
            best = i
        # A run stopped after its first steps has no guard figures (fewer steps than the exact run).
        guard_cols = f"{'-':>9} {'-':>8}" if i in s.stopped else \
            f"{rec['loss_rel_diff']:>9.2%} {rec['param_drift']:>8.2%}"
        lines.append(f"{s.plan[i].label(base):<{width}} {len(s.runs[i]):>4} {rec['samples_per_s']:>10.2f} "
                     f"{gain:>7.2f}x {rec['exposed_pct']:>7.0f}% {rec.get(wire_key, 0) / 1e6:>9.2f} "
                     f"{guard_cols}  {rec['verdict']}"
                     + (" [compression]" if s.plan[i].compression(base) else ""))
    for what, items in (("failed", s.failed), ("skipped", s.skipped)):
        for i, why in items.items():
            lines.append(f"# {what}: {s.plan[i].label(base)}: {why}")
    if s.cut_repeats:
        lines.append("# the budget cut the later runs of: "
                     + ", ".join(s.plan[i].label(base) for i in sorted(s.cut_repeats)))
    noise = max((r["param_drift"] for r in s.runs[0][1:]), default=None)
    if noise is not None:
        lines.append(f"# the default's own repeats ended {noise:.2%} from its first run (0: the same configuration "
                     "gave the same bits)")
    records = []
    for i, rec in summary:
        cand = s.plan[i]
        cfg = cand.config(base)
        rec.update(tune_id=tune_id, default=i == 0, recommended=i == best,
                   config={"label": cand.label(base), "flags": cand.flags(base), "env": dict(cand.env),
                           "family": cand.family or "default", "compression": cand.compression(base),
                           "comm_hook": cfg.comm_hook, "bucket_mb": cfg.bucket_mb, "threads": cfg.threads,
                           "on_top_of": s.plan[s.built_on[i]].label(base) if i in s.built_on else None}
                   , loss_tolerance=tol, noise_floor=s.floor.record(tol), runs=len(s.runs[i]),
                   # null: ran its course; else why not (after_steps etc. where stopped inside its run)
                   pruned={**(rec.get("pruned") or {}), "why": s.pruned[i]} if i in s.pruned else None)
        records.append(rec)
    if best is None:
        lines.append("# recommended: keep the default; no configuration within the tolerance or the noise floor beat it "
                     f"clearly (by {CLEAR_GAIN - 1:.0%} and beyond the spread of the runs)")
        return "\n".join(lines), records
    rec, cand = by_index[best], s.plan[best]
    cfg = cand.config(base)
    comp = []
    if cfg.comm_hook != "none":
        comp.append(describe_hook(cfg.comm_hook))
    if cfg.reduce_dtype == "bf16":
        comp.append("bf16 gradient reduction (MixedPrecisionPolicy(reduce_dtype=torch.bfloat16): compression)")
    by_floor = guard.only_by_floor(rec, tol, s.floor)
    lines.append(f"# recommended: {cand.label(base)}: {rec['speedup_vs_default']:.2f}x the default's samples/s "
                 f"({first['samples_per_s']:.2f} -> {rec['samples_per_s']:.2f}), training changed by "
                 f"{guard.changed_by(rec):.2%} (tolerance {tol:.1%})"
                 + (f", above the tolerance but within the noise floor ({s.floor.source} alone moved the "
                    f"parameters {s.floor.drift:.2%} and the loss {s.floor.loss:.2%}): this short run cannot tell its change from rounding"
                    if by_floor else "")
                 + (f"; it uses {' and '.join(comp)}: COMPRESSION, check your own training's loss with it"
                    + (": within the rounding floor of a short run of a network that amplifies rounding is "
                       "not proven harmless over a full run" if by_floor else "")
                    if comp else ""))
    lines.append("# in your training script:")
    lines += [f"    {ln}" for ln in paste_lines(cfg)]
    lines += [f"export {k}={v}" for k, v in cand.env]
    lines.append("# reproduce it as a plain run" + (" (compression)" if comp else "") + ":")
    lines.append(reproduce(argv, cand.flags(base), dict(cand.env)))
    return "\n".join(lines), records
