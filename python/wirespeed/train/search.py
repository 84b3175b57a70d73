"""`wirespeed train --tune`: the default configuration, then candidates (the wrappers' options,
torch's comm hooks, intra-op threads, the backend's knobs), each a plain single-backend `wirespeed
train` in processes of its own, interleaved and repeated as `wirespeed tune` runs its settings
(tune/sweep.interleaved), on the same seed and data; each compared with the exact run's training
(train/guard.py); the search kept within a time budget.

Order: round 1 runs every candidate once, in the order of the plan (the likeliest gains first, so a
short budget cuts the long shots); a candidate slower than the default's latest run by more than
PRUNE_MARGIN, or outside the loss tolerance, cannot win and is not run again. Then the winners of
independent families (a hook, a bucket size, threads, a knob) are combined into one more candidate.
Then the leader (the fastest configuration within the guard so far) is tried with each threads and
bucket-size candidate added on top (on_top_of_leader): those two move the balance between compute
and communication, so their worth changes once a hook has taken most of the bytes off the wire
(resnet50 on an uncapped emulated 2 Gbit/s link: 2 threads a rank alone 0.58-0.64x the default, on
top of PowerSGD 1.20-1.33x that hook alone). The default runs again before the stage and after
every REFERENCE_EVERY of its runs; one slower than the leader it was built on is not run again.
Then the further rounds: the default and every candidate still in, again in turn. Before each run,
the time it should take (the candidate's own last run, else the median run so far) is weighed
against what is left of the budget; what does not fit is skipped and named. In round 1 the default
runs again every REFERENCE_EVERY candidates, and each candidate's first run is judged against the
default's latest.

Inside a run: a candidate's first run is handed a floor (prune_threshold): when its samples/s
over its first PRUNE_AFTER_STEPS timed steps is below it, the run stops there (train/rank.py) and
the candidate is pruned: never recommended, not run again. The default is never handed one.

Right after the default's first run, its rounding-only twin (train/guard.py: the same
configuration at another thread count) runs once, not timed against anything: its loss and
parameters against the default's are the noise floor every candidate is judged with.
"""
from __future__ import annotations

import os
import statistics
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..errors import UsageError
from ..flagvalues import parse_num
from ..launch.child import failure_line, run_child, scratch_dir
from ..report.outputs import run_dir, save_verdict
from ..tune.sweep import Setting, interleaved, setting_env
from . import guard
from .hooks import compresses, config_flags, parse_comm_hook
from .shell import ShellSettings, TrainRun, _link_ceiling, _median_run, _with_ceiling, initial_params, \
    param_difference

PRUNE_MARGIN = 0.05
# In round 1 the default runs again after every this many candidates, and a candidate is judged
# against the default's latest run: a shared machine's load drifts over a long round (a 2x swing in
# minutes was seen), and a reference near in time keeps that drift out of the pruning.
REFERENCE_EVERY = 5
# In-run pruning: after this many timed steps a candidate's first run may be stopped, when its
# samples/s over them is below the default's latest run's over its own first as many steps (like
# with like: the first steps after warm-up may run slower than the rest on every configuration) by
# more than IN_RUN_MARGIN plus twice the spread the default's runs have shown over those steps
# (default_noise). A few steps' median is noisier than a whole run's, so the margin is five times
# the whole-run PRUNE_MARGIN: what it stops, the whole-run rule would have pruned after the run.
PRUNE_AFTER_STEPS = 3
IN_RUN_MARGIN = 0.25


def first_steps_rate(rec: dict, k: int = PRUNE_AFTER_STEPS) -> float:
    """A run's samples/s over its first k timed steps (each its slowest rank's time; their median,
    as the run's own samples_per_s and the child's judgement take it: train/rank.steps_rate)."""
    steps = rec.get("step_times_us") or []
    if len(steps) < k:
        return rec["samples_per_s"]   # a record without the steps: its whole run's
    step_s = statistics.median(steps[:k]) * 1e-6
    return rec["batch_size"] * rec["world_size"] / step_s if step_s > 0 else float("inf")


def default_noise(default_runs: list[dict]) -> float:
    """How far the default's runs so far spread over their first steps: (fastest - slowest) / their
    median samples/s; 0 with one run (nothing to measure a spread from: the margin alone stands)."""
    rates = [first_steps_rate(r) for r in default_runs]
    if len(rates) < 2:
        return 0.0
    return (max(rates) - min(rates)) / statistics.median(rates)


def prune_threshold(default_runs: list[dict], iters: int) -> float:
    """The samples/s below which a candidate's first run stops after PRUNE_AFTER_STEPS timed steps:
    the default's latest run's over as many steps x (1 - IN_RUN_MARGIN - 2 x default_noise). 0
    (never stop) while the default has no run, when stopping would not save at least as many
    steps as it judged (a run of fewer than twice PRUNE_AFTER_STEPS), and when the default's own
    spread leaves no room."""
    if not default_runs or iters < 2 * PRUNE_AFTER_STEPS:
        return 0.0
    keep = 1 - IN_RUN_MARGIN - 2 * default_noise(default_runs)
    return first_steps_rate(default_runs[-1]) * keep if keep > 0 else 0.0


@dataclass(frozen=True)
class Candidate:
    options: tuple = ()   # (TrainConfig field, value)
    env: tuple = ()       # (knob, value)
    family: str = ""      # what it changes ("hook", "bucket", "threads", a knob's name, ...)

    def config(self, base):
        return replace(base, **dict(self.options))

    def flags(self, base) -> list[str]:
        return config_flags(self.config(base), base)

    def label(self, base) -> str:
        return " ".join(self.flags(base) + [f"{k}={v}" for k, v in self.env]) or "default"

    def compression(self, base) -> bool:
        cfg = self.config(base)
        return compresses(cfg.comm_hook) or cfg.reduce_dtype == "bf16"


DEFAULT = Candidate()


def _opt(family: str, **fields) -> Candidate:
    return Candidate(tuple(fields.items()), (), family)


def builtin_plan(base, backend: str, shell: ShellSettings) -> list[Candidate]:
    """The candidates for this run, the likeliest gains on a network-bound step first."""
    out: list[Candidate] = []
    if base.parallel == "ddp":
        buckets = [b for b in (5.0, 50.0, 100.0) if b != base.bucket_mb]
        out += [_opt("hook", comm_hook="fp16"), _opt("hook", comm_hook="bf16")]
        out += [_opt("hook", comm_hook="fp16", bucket_mb=b) for b in buckets[:1] + buckets[-1:]]
        out += [_opt("hook", comm_hook="powersgd:1"), _opt("hook", comm_hook="powersgd:4")]
        out += [_opt("bucket", bucket_mb=b) for b in buckets]
        out += [_opt("graph", grad_as_bucket_view=True), _opt("graph", static_graph=True)]
    else:
        out += [_opt("reduce", reduce_dtype="bf16"), _opt("reshard", reshard_after_forward=False),
                _opt("prefetch", prefetch=1), _opt("prefetch", prefetch=2)]
    cores = os.cpu_count() or 1
    per_rank = max(1, cores // base.nproc)   # the emulated cluster's hosts share this machine's cores
    out += [_opt("threads", threads=n) for n in sorted({per_rank, per_rank - 1, cores, cores - 1})
            if n > 0 and n != base.threads]
    out += knob_candidates(backend, base, shell)
    if backend == "wirespeed" and _across_hosts(base, shell) and per_rank > 1:
        # a core moved from torch's intra-op threads to the engine's socket threads
        more_io = str(int(_engine_io_threads()) + 1)
        out.append(Candidate((("threads", per_rank - 1),), (("WIRESPEED_IO_THREADS", more_io),), "io-threads"))
    return out


def _ranks_per_host(base, shell: ShellSettings) -> int:
    """On the emulated cluster its --ranks-per-host (1 unless given), else all on this host."""
    return (shell.ranks_per_host or 1) if shell.cluster else base.nproc


def _across_hosts(base, shell: ShellSettings) -> bool:
    return base.nproc > _ranks_per_host(base, shell)


# The engine's reactor threads when WIRESPEED_IO_THREADS is not set (crates' config.rs):
# 1 up to 4 CPUs, else 2; the CPUs this process may run on, as the engine counts them.
def _engine_io_threads() -> str:
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return "1" if cpus <= 4 else "2"


def knob_candidates(backend: str, base, shell: ShellSettings) -> list[Candidate]:
    """The backend's knobs that `wirespeed tune` sweeps by default where these ranks run (its table,
    tune/knobs.py), one setting per candidate; for wirespeed across hosts also its I/O threads
    (what a training step's compute threads compete with), but not the count it runs by default."""
    from ..tune.knobs import backends, select
    from ..tune.sweep import settings
    if backend not in backends() or base.nproc < 2:
        return []
    across, one_host = _across_hosts(base, shell), _ranks_per_host(base, shell) > 1
    try:
        knobs, _ = select(backend, None, False, across, one_host)
    except UsageError:
        return []
    if backend == "wirespeed" and across:
        io, _ = select(backend, ["WIRESPEED_IO_THREADS"], False, across, one_host)
        default_io = _engine_io_threads()
        knobs += [replace(k, values=tuple(v for v in k.values if v != default_io)) for k in io]
    return [Candidate((), s.env, s.env[0][0]) for s in settings(knobs)[1:]]


_FIELDS = {"bucket-mb": "bucket_mb", "comm-hook": "comm_hook", "threads": "threads",
           "grad-as-bucket-view": "grad_as_bucket_view", "static-graph": "static_graph",
           "reshard-after-forward": "reshard_after_forward", "prefetch": "prefetch",
           "reduce-dtype": "reduce_dtype"}


def parse_candidates(text: str, base, backend: str) -> list[Candidate]:
    """--candidates 'comm-hook=fp16; bucket-mb=5+threads=2; WIRESPEED_NSTREAMS=4', each checked as
    the flags it stands for would be."""
    from ..tune.knobs import KNOBS
    from .hooks import check_options
    out = []
    for part in str(text).split(";"):
        if not part.strip():
            continue
        opts, env = {}, {}
        for item in part.split("+"):
            name, _, value = item.strip().partition("=")
            if name in _FIELDS:
                f = _FIELDS[name]
                if f in ("grad_as_bucket_view", "static_graph", "reshard_after_forward"):
                    opts[f] = value.strip().lower() not in ("0", "false", "no", "off")
                elif f == "comm_hook":
                    opts[f] = parse_comm_hook(value)
                elif f == "reduce_dtype":
                    opts[f] = value.strip()
                else:
                    opts[f] = parse_num(value, f"--candidates {name}", float if f == "bucket_mb" else int)
            elif name.isupper() and value and any(k.name == name and k.backend == backend for k in KNOBS):
                env[name] = value.strip()
            else:
                raise UsageError(f"--candidates {item.strip()}: not a train option ({', '.join(_FIELDS)}) "
                                 f"nor a {backend} knob NAME=value")
        if opts.get("bucket_mb") == 0:
            raise UsageError("--candidates: bucket-mb must be positive")
        check_options(replace(base, **opts))
        out.append(Candidate(tuple(opts.items()), tuple(env.items()), "given"))
    if not out:
        raise UsageError("--candidates: give at least one candidate")
    return out


@dataclass
class Search:
    """What the search found: per plan entry its runs, and the entries that failed, were pruned or
    skipped (and why)."""
    plan: list[Candidate]
    runs: dict = field(default_factory=dict)        # index -> [record]
    took: dict = field(default_factory=dict)        # index -> [seconds]
    failed: dict = field(default_factory=dict)      # index -> why
    pruned: dict = field(default_factory=dict)      # index -> why
    skipped: dict = field(default_factory=dict)     # index -> why
    floor: guard.Floor = guard.NO_FLOOR              # the rounding-only twin's figures
    cut_repeats: set = field(default_factory=set)   # indices whose later repeats the budget cut
    stopped: set = field(default_factory=set)       # indices pruned inside their first run
    built_on: dict = field(default_factory=dict)    # index -> the leader's index it adds to


def _say(text: str = "") -> None:
    print(text)
    sys.stdout.flush()


def run_search(base, backend: str, shell: ShellSettings, budget_s: float, tolerance: float,
               candidates: list[Candidate], repeat: int, argv: list[str]) -> int:
    from .tunereport import render
    plan = [DEFAULT] + candidates
    s = Search(plan)
    t_start = time.monotonic()
    ceiling = _link_ceiling(base, shell)
    _say(f"# wirespeed train --tune: {base.spec.describe()}, {base.parallel}, backend {backend}, "
         f"{base.nproc} ranks; {len(plan)} configurations (the default, then {len(candidates)} "
         f"candidates) x up to {repeat} runs, interleaved, each in fresh processes; budget "
         f"{budget_s:g} s; loss tolerance {tolerance:.1%} (loss and parameters against the default's), or "
         f"{guard.FLOOR_FACTOR:g} x the noise floor a rounding-only twin of the default measures where larger")
    exact: dict = {}
    init = initial_params(base.spec)
    tune_id = time.strftime("%Y%m%d-%H%M%S")
    out_dir = run_dir(shell.save_dir, "train-tune", tune_id)

    def estimate(i: int) -> float:
        own = s.took.get(i)
        every = [t for j, ts in s.took.items() if j not in s.stopped for t in ts]   # whole runs
        return own[-1] if own else (statistics.median(every) if every else 0.0)

    runs_started = [0]

    def launch(cand: Candidate, label: str, tmp: Path, prune_below: float = 0.0):
        """One plain `train` of the candidate's configuration, stopped after PRUNE_AFTER_STEPS timed
        steps when slower than prune_below samples/s: (the child's run, seconds, where its final
        parameters are)."""
        n = runs_started[0]   # each run's files its own
        runs_started[0] += 1
        json_path, state_path = tmp / f"run{n}.jsonl", tmp / f"run{n}.pt"
        t0 = time.monotonic()
        cfg = replace(cand.config(base), prune_below=prune_below,
                      prune_after=PRUNE_AFTER_STEPS if prune_below else 0)
        run = run_child(TrainRun.of(cfg, backend, json_path, state_path, shell, what_if=False).argv(),
                        setting_env(Setting(cand.env)), json_path,
                        out_dir / "logs" / f"run{n}.log" if out_dir else None, log_header=f"# {label}\n")
        return run, time.monotonic() - t0, state_path

    def compared(run, state_path) -> dict:
        """The run's record with its loss_rel_diff and param_drift against the exact run."""
        rec = next(r for r in run.records if not r.get("predicted"))
        import torch
        state = torch.load(state_path)
        if not exact:
            exact.update(state=state, losses=rec["losses"])
        rec["param_drift"] = param_difference(exact["state"]["final"], state["final"], init)[0]
        rec["loss_rel_diff"] = guard.loss_rel_diff(exact["losses"], rec["losses"])
        return rec

    def twin(tmp: Path) -> None:
        """The default's rounding-only twin, once: the noise floor (train/guard.py)."""
        threads = guard.twin_threads(int(s.runs[0][0].get("threads") or 1))
        cand = Candidate((("threads", threads),), (), "noise floor")
        label = cand.label(base)
        run, took, state_path = launch(cand, label, tmp)
        if run.code != 0 or not run.wrote:
            _say(f"[noise-floor twin {label}]: FAILED after {took:.0f} s: {failure_line(run.stderr, run.code)}; "
                 f"no noise floor: the tolerance alone decides")
            return
        rec = compared(run, state_path)
        s.floor = guard.Floor(rec["loss_rel_diff"], rec["param_drift"], label)
        lb, db = s.floor.bounds(tolerance)
        _say(f"[noise-floor twin {label}]: the default with only its sums' order changed moved the loss "
             f"{s.floor.loss:.2%} and the parameters {s.floor.drift:.2%}, {took:.0f} s; candidates are judged "
             f"against loss {lb:.2%}, parameters {db:.2%} (the larger of the tolerance and "
             f"{guard.FLOOR_FACTOR:g} x the floor)")

    def one(i: int, rep: int, tmp: Path) -> None:
        cand = plan[i]
        if i in s.failed or i in s.pruned or i in s.skipped:
            return
        if i and not exact:
            return
        label = cand.label(base)
        left = budget_s - (time.monotonic() - t_start)
        if (i or rep) and estimate(i) > left:
            if rep == 0:
                s.skipped[i] = f"not run: about {estimate(i):.0f} s, {max(left, 0):.0f} s of the budget left"
            else:
                s.cut_repeats.add(i)
            return
        if i and cand.options and dict(cand.options).keys() == {"threads"} and s.runs.get(0) and \
                s.runs[0][0].get("threads") == cand.config(base).threads:
            s.skipped[i] = "the same threads as the default's"
            return
        # The default is never stopped; a candidate's first run, once the default has a speed.
        below = prune_threshold(s.runs.get(0, []), base.iters) if i and rep == 0 else 0.0
        run, took, state_path = launch(cand, label, tmp, below)
        s.took.setdefault(i, []).append(took)
        runs_here = len(s.took[i])
        tag = f"[{label}]" + (f" (run {runs_here})" if runs_here > 1 else "")
        if run.code != 0 or not run.wrote:
            s.failed[i] = failure_line(run.stderr, run.code)
            _say(f"{tag}: FAILED after {took:.0f} s: {s.failed[i]}")
            return
        if i and (first := next(r for r in run.records if not r.get("predicted"))).get("pruned"):
            stopped_early(i, first, tag, took)
            return
        rec = compared(run, state_path)
        rec["repeat"] = rep
        s.runs.setdefault(i, []).append(rec)
        latest = s.runs[0][-1]
        gain = rec["samples_per_s"] / latest["samples_per_s"]
        _say(f"{tag}: {rec['samples_per_s']:.2f} samples/s" + (f" ({gain:.2f}x the default's latest run)" if i else "")
             + f", training changed by {guard.changed_by(rec):.2%} (loss {rec['loss_rel_diff']:.2%}, "
             f"parameters {rec['param_drift']:.2%}), {took:.0f} s")
        rec["gain_vs_latest_default"] = gain
        if i and rep == 0:
            if i in s.built_on and gain < (lead := s.runs[s.built_on[i]][0]["gain_vs_latest_default"]) * \
                    (1 - PRUNE_MARGIN):
                s.pruned[i] = (f"{gain / lead:.2f}x {s.plan[s.built_on[i]].label(base)} (which it adds to) "
                               f"after its first run: not run again")
            elif gain < 1 - PRUNE_MARGIN:
                s.pruned[i] = f"{gain:.2f}x the default after its first run: not run again"
            elif not guard.within(rec, tolerance, s.floor):
                s.pruned[i] = "outside the loss tolerance and the noise floor after its first run: not run again"

    def stopped_early(i: int, rec: dict, tag: str, took: float) -> None:
        """A first run the child stopped after its first steps: pruned, shown, never run again (no
        guard figures: its parameters and losses are of fewer steps than the exact run's)."""
        p, latest = rec["pruned"], first_steps_rate(s.runs[0][-1])
        ratio = p["samples_per_s"] / latest
        p.update(default_samples_per_s=latest, vs_default=ratio)
        s.pruned[i] = f"pruned after {p['after_steps']} steps ({ratio:.2f}x the default's samples/s)"
        s.stopped.add(i)
        rec["repeat"] = 0
        rec["loss_rel_diff"] = rec["param_drift"] = None   # the record's fields, null: not comparable
        s.runs[i] = [rec]
        _say(f"{tag}: {p['samples_per_s']:.2f} samples/s over its first {p['after_steps']} timed steps, "
             f"{ratio:.2f}x the default's latest run over as many, below {p['below']:.2f} "
             f"(1 - {IN_RUN_MARGIN:g} - 2 x the default's spread {default_noise(s.runs[0]):.1%} of it): "
             f"stopped and pruned, {took:.0f} s")

    with scratch_dir("wirespeed-train-tune-") as tmp_dir:
        tmp = Path(tmp_dir)
        for _, i in interleaved(len(plan), 1):
            one(i, 0, tmp)
            if i == 0 and 0 in s.failed:
                sys.stderr.write(f"wirespeed: error: the default configuration failed: {s.failed[0]}\n")
                return 1
            if i == 0:
                twin(tmp)
            if i and i % REFERENCE_EVERY == 0 and i < len(plan) - 1:
                one(0, len(s.runs[0]), tmp)   # the reference again
        combo = combine(s, base, tolerance)
        if combo is not None:
            plan.append(combo)
            one(0, len(s.runs[0]), tmp)
            one(len(plan) - 1, 0, tmp)
        lead = leader(s, tolerance)
        for n, cand in enumerate(on_top_of_leader(s, lead, base)):
            if n % REFERENCE_EVERY == 0:
                one(0, len(s.runs[0]), tmp)   # the reference again: each judged against a near one
            plan.append(cand)
            s.built_on[len(plan) - 1] = lead
            one(len(plan) - 1, 0, tmp)
        for rep, i in interleaved(len(plan), repeat - 1):
            one(i, rep + 1, tmp)
    summary = []
    for i, runs in s.runs.items():
        rec = _median_run(runs)
        # Every configuration's samples/s by the same statistic, the median of its runs (an even
        # count: the mean of the middle two), so one run more or fewer does not favour any.
        rec["samples_per_s_runs"] = [r["samples_per_s"] for r in runs]
        rec["samples_per_s"] = statistics.median(rec["samples_per_s_runs"])
        for key in ("param_drift", "loss_rel_diff") if i not in s.stopped else ():   # the worst of its runs
            rec[key] = max(r[key] for r in runs)
        _with_ceiling(rec, ceiling)
        summary.append((i, rec))
    text, records = render(s, summary, base, backend, tolerance, argv, tune_id)
    _say()
    _say(text)
    save_verdict(shell.json_path, out_dir, records, text, _say)
    return 0


def winners(s: Search, tolerance: float) -> list[int]:
    """The configurations whose first run beat the default's latest run then by more than
    PRUNE_MARGIN / 5, within the guard and not pruned: what combine and leader build on (a win
    inside the noise is not worth the runs built on it)."""
    return [i for i, runs in s.runs.items()
            if i and i not in s.pruned and guard.within(runs[0], tolerance, s.floor)
            and runs[0]["gain_vs_latest_default"] > 1 + PRUNE_MARGIN / 5]


def leader(s: Search, tolerance: float) -> int:
    """The fastest of the winners after round 1 and the combination, against the default's latest
    run then; 0 (the default) when none won."""
    return max(winners(s, tolerance), key=lambda i: s.runs[i][0]["gain_vs_latest_default"], default=0)


ON_TOP_FIELDS = ({"threads"}, {"bucket_mb"})   # a candidate that sets one of these and nothing else


def on_top_of_leader(s: Search, lead: int, base) -> list[Candidate]:
    """The leader with each candidate of the plan that sets only the threads or only the bucket size
    added on top (built-in or given with --candidates), where the leader does not set that field
    itself; none when the default leads (round 1 ran them all on it)."""
    if lead == 0:
        return []
    top = s.plan[lead]
    have = dict(top.options)

    def key(c: Candidate) -> tuple:
        return repr(c.config(base)), tuple(sorted(c.env))
    out, seen = [], {key(c) for c in s.plan}   # nothing run twice under two names
    for j, c in enumerate(s.plan):
        # skipped: the default's own threads, or no time for it in round 1 (none now either)
        fields = set(dict(c.options))
        if j in (0, lead) or j in s.skipped or j in s.failed or c.env or fields not in ON_TOP_FIELDS or \
                fields & set(have):
            continue
        merged = Candidate(tuple({**have, **dict(c.options)}.items()), top.env, "on top")
        if key(merged) in seen:
            continue
        seen.add(key(merged))
        out.append(merged)
    return out


def combine(s: Search, base, tolerance: float) -> Candidate | None:
    """One candidate from the winners of round 1 that change different things (the faster first),
    when two or more did: a hook with threads and a knob, say. None when fewer won."""
    opts, env, used = {}, {}, []
    for i in sorted(winners(s, tolerance), key=lambda i: (s.runs[i][0]["samples_per_s"], i), reverse=True):
        c = s.plan[i]
        if set(dict(c.options)) & set(opts) or set(dict(c.env)) & set(env) or \
                (c.family in ("hook", "bucket") and {"comm_hook", "bucket_mb"} & set(opts)):
            continue
        opts.update(c.options)
        env.update(c.env)
        used.append(i)
    if len(used) < 2:
        return None
    return Candidate(tuple(opts.items()), tuple(env.items()), "combined")
