"""The shell's side of `wirespeed train`: each backend as one single-backend `wirespeed train` in
processes of its own (as compare runs each combination: no backend inherits another's threads,
caches or sockets), then the comparison: speed-ups over the first backend, the line to quote, and
the parameters of every backend against the first's."""
from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import EXIT_MISMATCH
from ..knobs import for_children
from ..launch.child import failure_line, run_child, scratch_dir
from ..report.outputs import run_dir, save_verdict
from .hooks import option_argv

# Backends may add a reduction's terms in different orders (float reassociation: ~1e-7 of a
# gradient, none with 2 ranks), and a network can amplify that over steps: BatchNorm over a few
# values per channel (a ResNet's last maps at 32-64 px) turns rounding into 1e-4 of a gradient
# in one step (measured: the same step on 1 thread and on 2), and it compounds: resnet18 at 64 px,
# batch 4, 3 ranks ends 4 steps 2.8% of the distance trained apart on gloo and wirespeed, and at
# 32 px, batch 2 (two values per channel, training diverging) 26%. So the parameters are judged
# after each of the first steps (train.EARLY_STEPS), where rounding has had no time to grow:
# ||p - p_first|| / ||p_first - p_init||, the difference over the distance training moved them,
# must be at most PARAM_TOLERANCE there: a gradient that lacks one of N ranks, or is summed
# instead of averaged, is off by 1/N of that distance or more, so up to 100 ranks a lost share is
# caught; the diverging resnet18 at 32 px above is 3e-8 apart after its first step and 7e-4
# after its second. After the last step the difference is reported, not judged.
PARAM_TOLERANCE = 1e-2


@dataclass
class ShellSettings:
    """What the shell does besides the runs' own settings (cli/train.py fills it from the flags):
    where the ranks run, the what-if's flags as given, the one-rank run, and its outputs."""
    cluster: str | None = None
    ranks_per_host: int | None = None
    master_port: str | None = None
    measured_link_rate: str | None = None
    what_if_hosts: str | None = None
    what_if_rate: str | None = None
    scaling: bool = True                 # --no-scaling turns the one-rank run off
    json_path: str | None = None
    plot_path: str | None = None
    save_dir: str | None = "runs"       # None: --no-save
    gpu: tuple | None = None            # --what-if-gpu: (name, peak TFLOPS, MFU)


@dataclass
class TrainRun:
    """One backend's run: a single-backend `wirespeed train` in processes of its own, every setting
    explicit (the children get no flag twins; tests/unit/test_argv_roundtrip.py parses it back)."""
    cfg: object                      # the TrainConfig every backend runs (train/rank.py)
    backend: str
    json_path: str
    state_path: str
    measured_link_rate: str | None = None   # the what-if's flags, as given
    what_if_hosts: str | None = None
    what_if_rate: str | None = None
    master_port: str | None = None
    cluster: str | None = None
    ranks_per_host: int | None = None

    @classmethod
    def of(cls, cfg, backend: str, json_path, state_path, shell: ShellSettings,
           what_if: bool = True) -> "TrainRun":
        """The run of `backend` the shell asks for; what_if=False leaves the what-if out (the
        one-rank run scaling is measured against)."""
        return cls(cfg, backend, str(json_path), str(state_path),
                   measured_link_rate=shell.measured_link_rate,
                   what_if_hosts=shell.what_if_hosts if what_if else None,
                   what_if_rate=shell.what_if_rate if what_if else None,
                   master_port=shell.master_port, cluster=shell.cluster,
                   ranks_per_host=shell.ranks_per_host)

    def argv(self) -> list[str]:
        cfg, s = self.cfg, self.cfg.spec
        argv = ["train", "--model", s.model, "--parallel", cfg.parallel, "--batch-size", str(s.batch_size),
                "--image-size", str(s.image_size), "--layers", str(s.layers), "--hidden", str(s.hidden),
                "--heads", str(s.heads), "--seq-len", str(s.seq_len), "--vocab", str(s.vocab),
                "--bucket-mb", f"{cfg.bucket_mb:g}", "--optimizer", cfg.optimizer, "--backend", self.backend,
                "--device", cfg.device, "-N", str(cfg.nproc), "-w", str(cfg.warmup_iters),
                "-n", str(cfg.iters), "-T", f"{cfg.timeout_s:g}", "--json", self.json_path,
                "--state-out", self.state_path, "--no-save"] + (["--timeline"] if cfg.timeline else [])
        argv += option_argv(cfg)
        if cfg.prune_below:   # float's repr: the child reads back the very threshold
            argv += ["--prune-below", f"{cfg.prune_below!r}@{cfg.prune_after}"]
        if cfg.trace:
            argv += ["--trace", cfg.trace]
        for flag in ("measured_link_rate", "what_if_hosts", "what_if_rate"):
            if getattr(self, flag):
                argv += ["--" + flag.replace("_", "-"), str(getattr(self, flag))]
        if self.master_port:
            argv += ["--master-port", str(self.master_port)]
        if self.cluster:
            argv += ["--cluster", self.cluster]
            if self.ranks_per_host:
                argv += ["--ranks-per-host", str(self.ranks_per_host)]
        return argv


def _say(text: str = "") -> None:
    print(text)
    sys.stdout.flush()


def param_difference(first, mine, init) -> tuple[float, float]:
    """(||mine - first|| / ||first - init||, the same over ||first||), over the flat parameters;
    inf when the shapes differ. `init`: the parameters before training."""
    if first.shape != mine.shape:
        return float("inf"), float("inf")
    diff = float((mine - first).norm())
    moved, norm = float((first - init).norm()), float(first.norm())
    return diff / (moved if moved > 0 else norm or 1.0), diff / (norm or 1.0)


def table(records: list[dict], first: dict | None = None) -> str:
    """One row per backend; with `first`, the speed-up of each over it."""
    head = (f"{'backend':<10} {'ranks':>5} {'samples/s':>10} {'/rank':>8} {'step p50 ms':>11} "
            f"{'min-max ms':>15} {'compute ms':>10} {'exposed':>8} {'MB/step/rank':>12} "
            f"{'wire ms':>8} {'x limit':>7}" + (f" {'speed-up':>8}" if first else ""))
    lines = [head]
    for r in records:
        spread = f"{r['step_min_us'] / 1e3:.1f}-{r['step_max_us'] / 1e3:.1f}"
        row = (f"{r['backend']:<10} {r['world_size']:>5} {r['samples_per_s']:>10.2f} "
               f"{r['samples_per_s_per_rank']:>8.2f} {r['step_us'] / 1e3:>11.1f} {spread:>15} "
               f"{r['compute_us'] / 1e3:>10.1f} {r['exposed_pct']:>7.0f}% "
               f"{r['bytes_per_step'] / 1e6:>12.2f} "
               + (f"{r['wire_us'] / 1e3:>8.1f} " if r.get("wire_us") is not None else f"{'-':>8} ")
               + (f"{r['step_vs_limit']:>6.2f}x" if r.get("step_vs_limit") else f"{'-':>7}"))
        if first:
            row += f" {r['samples_per_s'] / first['samples_per_s']:>7.2f}x"
        lines.append(row)
    return "\n".join(lines)


def timeline_line(r: dict) -> str:
    """Where in the step a backend's communication ran (train/timeline.py), and the rate the
    link's bytes moved at while some bucket was in the backend's hands."""
    t = r["timeline"]
    line = (f"# timeline {r['backend']} (median step of the rank done last): forward pass done at "
            f"{t['forward_ms']:.0f} ms; buckets out from {t['comm_start_ms']:.0f} ms, the last back at "
            f"{t['comm_end_ms']:.0f} ms of a {r['step_us'] / 1e3:.0f} ms step; some bucket pending "
            f"{t['comm_busy_ms']:.0f} ms")
    if r.get("wire_bytes_per_step") and t["comm_busy_ms"] > 0:
        gbps = r["wire_bytes_per_step"] * 8 / (t["comm_busy_ms"] * 1e-3) / 1e9
        line += f", the link's bytes at {gbps:.3g} Gbit/s each way"
        if r.get("tcp_each_way_gbps"):
            line += f" ({gbps / r['tcp_each_way_gbps']:.0%} of TCP's measured rate)"
    return line


def fair_bound_line(r: dict) -> str:
    """The step against the fairer bound (train/whatif.fair_bound), its terms spelled out."""
    first = r["timeline"]["comm_start_ms"]
    wire = (r["wire_tcp_us"] if r["fair_bound_rate"] == "tcp" else r["wire_us"]) / 1e3
    rate = "TCP's measured rate" if r["fair_bound_rate"] == "tcp" else "the link's nominal rate"
    return (f"# fairer bound {r['backend']}: max(compute {r['compute_us'] / 1e3:.0f} ms, first bucket "
            f"ready {first:.0f} ms + wire {wire:.0f} ms at {rate}) = {r['fair_bound_us'] / 1e3:.0f} ms; "
            f"the {r['step_us'] / 1e3:.0f} ms step is {r['step_vs_fair_bound']:.2f}x it (x limit, "
            "max(compute, wire), assumes a bucket could leave at the step's start)")


def gpu_lines(rec: dict, predicted, spec, gpu) -> str:
    """--what-if-gpu: the step's FLOPs, its compute on that GPU, and the what-if's steps with that
    compute (train/gpuflops.py)."""
    from .gpuflops import gpu_step_us, on_gpu, step_flops
    from .whatif import whatif_table
    name, peak, mfu = gpu
    flops = step_flops(spec, rec["parameters"])
    c = gpu_step_us(flops, peak, mfu)
    text = (f"# what-if GPU {name}: {flops / 1e9:.4g} GFLOPs per rank per step ("
            + ("6 x parameters x tokens" if spec.model == "gpt" else "3 x the forward's conv and linear FLOPs")
            + f") at {peak:g} TFLOPS peak x {mfu:.0%} assumed MFU: compute {c / 1e3:.3g} ms instead of "
            f"the measured {rec['compute_us'] / 1e3:.3g} ms on this CPU")
    mine = [p for p in predicted if p.get("backend") == rec["backend"]]
    if not mine:
        return text + "\n# (the step with it needs the what-if's fit: add --what-if-hosts or --what-if-rate on a cluster)"
    text += f"; the what-if's steps with that compute:\n" + whatif_table([on_gpu(p, c) for p in mine])
    if any(p.get("ranks_per_host", 1) > 1 for p in mine):
        # The fit of one layout cannot tell a host's shared memory from its link (both grow with the
        # bytes), so nothing in it can be re-priced at NVLink's rate on its own: said, not guessed.
        text += ("\n# the pairs inside a host are priced as this CPU's shared memory moved them, not at "
                 "NVLink's rate: run one rank a host to leave them out, or --what-if-only to price NVLink")
    return text


def quote(first: dict, r: dict) -> str:
    # A GPT's samples are sequences of the same length on every backend: the ratio is tokens/s's.
    unit = {"img": "img/s", "seq": "tokens/s"}.get(r.get("unit"), "samples/s")
    return (f"{r['backend']} vs {first['backend']}: "
            f"{r['samples_per_s'] / first['samples_per_s']:.2f}x {unit} (exposed comm "
            f"{first['exposed_pct']:.0f}% -> {r['exposed_pct']:.0f}% of the step)")


def run_backends(backends: list[str], cfg, shell: ShellSettings, repeat: int = 1) -> int:
    """Each backend in fresh processes, the list `repeat` times in the same order (A B A B), so
    slow drift of a busy machine spreads over every backend; a backend's figures are those of its
    median run (by step time). Returns the exit status."""
    runs: dict[str, list[dict]] = {b: [] for b in backends}
    failures, codes = [], []
    ceiling = _link_ceiling(cfg, shell)
    base = init = None   # the first backend's parameters, every other run compared with them
    env = for_children(os.environ)
    total = len(backends) * repeat
    with scratch_dir("wirespeed-train-") as tmp:
        for n, (rep, backend) in enumerate(((r, b) for r in range(repeat) for b in backends), 1):
            if any(b == backend for b, _ in failures):
                continue   # it failed once; its error is reported, not repeated
            tag = f"[{n}/{total}] {backend}" + (f" (repeat {rep + 1} of {repeat})" if repeat > 1 else "")
            json_path, state_path = Path(tmp) / f"{backend}-{rep}.jsonl", Path(tmp) / f"{backend}-{rep}.pt"
            _say(f"{tag}, {cfg.nproc} ranks")
            t0 = time.monotonic()
            # The ranks' own output (header, table) goes straight through; errors are kept to be
            # named in the summary.
            run = run_child(TrainRun.of(_traced(cfg, backend, backends), backend, json_path, state_path,
                                        shell).argv(), env, json_path, echo=True)
            took = time.monotonic() - t0
            if run.code != 0 or not run.wrote:
                why = failure_line(run.stderr, run.code)
                failures.append((backend, why))
                codes.append(run.code or 1)
                _say(f"{tag}: FAILED after {took:.1f} s: {why}")
                continue
            got = run.records
            rec = next(r for r in got if not r.get("predicted"))
            rec["repeat"] = rep
            rec["_predicted"] = [r for r in got if r.get("predicted")]
            if state_path.exists():
                import torch
                state = torch.load(state_path)
                if base is None:
                    base, init = state, initial_params(cfg.spec)
                _compare(rec, base, state, init)
            runs[backend].append(rec)
            _say(f"{tag}: done in {took:.1f} s")
        one = _one_rank_run(cfg, backends[0], shell, env, Path(tmp)) \
            if cfg.nproc > 1 and shell.scaling and not failures else None
    records = [_median_run(rs) for rs in runs.values() if rs]
    for r in records:
        _with_ceiling(r, ceiling)
    predicted = [p for r in records for p in r.pop("_predicted", [])]
    if one:
        for r in records:
            r["samples_per_s_one_rank"] = one["samples_per_s"]
            r["scaling_efficiency"] = r["samples_per_s_per_rank"] / one["samples_per_s"]
    mismatched = [b for b, rs in runs.items()
                  if any(max(r.get("params_diff_steps") or [0]) > PARAM_TOLERANCE for r in rs)]
    _report(records, failures, mismatched, one, predicted)
    if shell.gpu and records:
        _say(gpu_lines(records[0], predicted, cfg.spec, shell.gpu))
    _save(records + predicted, shell)
    if shell.plot_path and records:
        from ..report.plot import plot_records
        plot_records(records + predicted, shell.plot_path)
        _say(f"# plot: {shell.plot_path}")
    if failures:
        sys.stderr.write(f"wirespeed: error: {'; '.join(f'{b}: {w}' for b, w in failures)}\n")
        return codes[0]
    if mismatched:
        sys.stderr.write(f"wirespeed: error: the parameters of {', '.join(mismatched)} differ from "
                         f"{records[0]['backend']}'s after the same first steps by more than "
                         f"{PARAM_TOLERANCE:g} of the distance training moved them\n")
        return EXIT_MISMATCH
    return 0


def _traced(cfg, backend: str, backends: list[str]):
    """cfg with --trace's path of this backend's run: the path itself for one backend, else with
    the backend's name before the suffix (out.json -> out.gloo.json)."""
    if not cfg.trace or len(backends) < 2:
        return cfg
    from dataclasses import replace
    path = Path(cfg.trace)
    return replace(cfg, trace=str(path.with_name(f"{path.stem}.{backend}{path.suffix}")))


def _link_ceiling(cfg, shell: ShellSettings) -> dict | None:
    """On the emulated cluster, what TCP carries between the job's first two hosts, both ways at
    once (launch.cluster.job_link_ceiling), measured before the runs; None elsewhere, or when the
    probe fails (said, and the run goes on: it is a figure beside the run's, not the run)."""
    if not shell.cluster or cfg.nproc < 2:
        return None
    from ..launch.cluster import job_link_ceiling
    from ..netem.ns import NetemError
    try:
        return job_link_ceiling(shell.cluster, cfg.nproc, shell.ranks_per_host)
    except NetemError as e:
        _say(f"# the links' TCP rate could not be measured ({e}); no TCP bound")
        return None


def _with_ceiling(rec: dict, ceiling: dict | None) -> None:
    """The wire time and the step's multiple of its lower limit at the rate TCP was measured to
    carry (the `wire_us` beside them is at the link's nominal rate); with a timeline, the fairer
    limit too (train/whatif.fair_bound)."""
    _with_ceiling_rate(rec, ceiling)
    wire = rec.get("wire_tcp_us") if rec.get("wire_tcp_us") is not None else rec.get("wire_us")
    if rec.get("timeline") and wire is not None:
        from .whatif import fair_bound
        rec["fair_bound_rate"] = "tcp" if rec.get("wire_tcp_us") is not None else "nominal"
        rec["fair_bound_us"], rec["step_vs_fair_bound"] = fair_bound(
            rec["step_us"], rec["compute_us"], rec["timeline"]["comm_start_ms"] * 1e3, wire)


def _with_ceiling_rate(rec: dict, ceiling: dict | None) -> None:
    if not ceiling or not rec.get("wire_bytes_per_step") or rec.get("hosts", 1) < 2:
        return
    from .whatif import step_over_limit, wire_time_us
    rate = ceiling["each_way_bps"]
    wire = wire_time_us(rec["wire_bytes_per_step"], rate)
    rec["tcp_each_way_gbps"] = rate / 1e9
    rec["tcp_between"] = ceiling["between"]
    rec["tcp_streams"] = ceiling["streams"]
    rec["wire_tcp_us"] = wire
    _, rec["step_vs_tcp_limit"] = step_over_limit(rec["step_us"], rec["compute_us"], wire)


def _one_rank_run(cfg, backend: str, shell: ShellSettings, env: dict, tmp: Path) -> dict | None:
    """The first backend's step on one rank (same batch per rank): what scaling efficiency is
    measured against. Its failure is reported and leaves the figure out, not the run."""
    from dataclasses import replace
    one = replace(cfg, nproc=1, whatif_iters=0)
    json_path, state_path = tmp / "one-rank.jsonl", tmp / "one-rank.pt"
    _say(f"[scaling] {backend}, 1 rank")
    run = run_child(TrainRun.of(one, backend, json_path, state_path, shell, what_if=False).argv(), env,
                    json_path, echo=True)
    if run.code != 0 or not run.wrote:
        _say(f"[scaling] FAILED: {failure_line(run.stderr, run.code)}; no scaling efficiency")
        return None
    return run.records[0]


def _compare(rec: dict, base: dict, state: dict, init) -> None:
    """This run's parameters against the first backend's, into its record: after each of the first
    steps (judged) and after the last (reported)."""
    rec["params_diff_steps"] = [param_difference(a, b, init)[0]
                                for a, b in zip(base["early"], state["early"])]
    rec["params_diff"], rec["params_rel_diff"] = param_difference(base["final"], state["final"], init)
    rec["params_tolerance"] = PARAM_TOLERANCE


def initial_params(spec):
    """The parameters every run starts from (the seeded build), flat, as the runs hand theirs back."""
    import torch
    from .nets import build
    return torch.cat([p.detach().float().reshape(-1) for p in build(spec, "cpu").parameters()])


def _median_run(runs: list[dict]) -> dict:
    """The run of median step time, with every run's step time and the largest parameter
    difference of any (one record per backend and world size)."""
    ordered = sorted(runs, key=lambda r: r["step_us"])
    rec = dict(ordered[(len(ordered) - 1) // 2])
    rec["repeats"] = len(runs)
    rec["step_us_repeats"] = [r["step_us"] for r in runs]
    for key in ("params_diff", "params_rel_diff"):
        diffs = [r[key] for r in runs if key in r]
        if diffs:
            rec[key] = max(diffs)
    steps = [r["params_diff_steps"] for r in runs if r.get("params_diff_steps")]
    if steps:
        rec["params_diff_steps"] = [max(col) for col in zip(*steps)]
    return rec


def _report(records, failures, mismatched, one=None, predicted=()) -> None:
    _say()
    if records:
        first = records[0]
        for r in records:
            r["speedup_vs_first"] = r["samples_per_s"] / first["samples_per_s"] \
                if first["samples_per_s"] > 0 else 0.0
        _say(f"# {first['model']}, {first['parallel']}, {first['world_size']} ranks; step = per "
             "step the slowest rank's, median over steps; compute = the same step with no "
             "communication; exposed = (step - compute) / step; MB/step/rank = bytes handed to "
             "the collectives per step and rank")
        _say(table(records, first))
        for r in records[1:]:
            _say(quote(first, r))
        if first.get("wire_us") is not None:
            _say(f"# wire = the bytes each host's link must carry per step at its rate "
                 f"({first['link_rate_gbps']:g} Gbit/s, {first['wire_bytes_per_step'] / 1e6:.1f} MB "
                 f"over {first['hosts']} hosts); x limit = step / max(compute, wire), 1.00x is "
                 "perfect overlap")
        if first.get("wire_tcp_us") is not None:
            nominal = (f", {first['tcp_each_way_gbps'] / first['link_rate_gbps']:.0%} of the link's "
                       "rate") if first.get("link_rate_gbps") else ""
            _say(f"# TCP between {' and '.join(first['tcp_between'])}, both ways at once "
                 f"({first['tcp_streams']} flows each way, before the runs): {first['tcp_each_way_gbps']:.3g} Gbit/s each way{nominal}; "
                 f"the wire at that rate {first['wire_tcp_us'] / 1e3:.1f} ms, x that limit: "
                 + ", ".join(f"{r['backend']} {r['step_vs_tcp_limit']:.2f}x" for r in records
                             if r.get("step_vs_tcp_limit")))
        for r in records:
            if r.get("timeline"):
                _say(timeline_line(r))
            if r.get("fair_bound_us"):
                _say(fair_bound_line(r))
        if one:
            _say(f"# scaling efficiency = samples/s per rank over one rank's ({one['backend']}, "
                 f"{one['samples_per_s']:.2f} samples/s): "
                 + ", ".join(f"{r['backend']} {r['scaling_efficiency']:.2f}" for r in records))
        if predicted:
            from .whatif import whatif_table
            _say("# what-if (predicted; each backend's model fitted on its own run and its "
                 "collectives benched alone):")
            _say(whatif_table(list(predicted)))
        diffs = [f"{r['backend']} {', '.join(f'{d:.1e}' for d in r['params_diff_steps'])} "
                 f"(after the last: {r['params_diff']:.1e})"
                 for r in records[1:] if r.get("params_diff_steps")]
        if diffs:
            _say(f"# parameters against {first['backend']}'s after the first steps, the difference "
                 f"over the distance training moved them (tolerance {PARAM_TOLERANCE:g}): "
                 f"{'; '.join(diffs)}" + (f"; BEYOND IT: {', '.join(mismatched)}" if mismatched else ""))
        _say(f"# every rank's model state agreed within every backend that finished (digest {first['state_digest'][:12]} "
             f"on {first['backend']})")
    for backend, why in failures:
        _say(f"# {backend} failed: {why}")


def _save(records, shell: ShellSettings) -> None:
    if records:
        save_verdict(shell.json_path, run_dir(shell.save_dir, "train", time.strftime("%Y%m%d-%H%M%S")),
                     records, None, _say)
