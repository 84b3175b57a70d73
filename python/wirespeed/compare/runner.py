"""Run the matrix: every combination is one `wirespeed bench` in fresh processes, so no backend
inherits another's threads, caches or sockets, and every figure comes from the same harness, checks
and statistics as `bench`. With --repeat the whole matrix runs again in the same order (A B C A B C),
so slow drift of a noisy machine spreads over every combination instead of favouring one.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..knobs import for_children
from ..launch.child import Outcome, run_child, scratch_dir
from .plan import Combo, CompareConfig, Plan


@dataclass(frozen=True)
class BenchRun:
    """One `wirespeed bench` of compare's or tune's: which ranks, which cases, how long."""
    backend: str
    device: str
    nproc: int
    collectives: list[str]
    dtypes: list[str]
    ops: list[str]
    sizes: list[int]
    iters: int
    warmup_iters: int
    timeout_s: float
    cluster: str | None = None
    ranks_per_host: int | None = None
    host_per_rank: bool = False
    extra: tuple[str, ...] = ()          # further bench flags (tune: --no-per-op)

    def check_resources(self) -> None:
        """What bench refuses before it starts ranks (their runtimes and buffers in this host's
        memory; the emulated cluster's ranks run here too), asked of every run before the first
        starts: a matrix or sweep whose runs would each fail alike is refused once, in one line,
        instead of running every one to the same error."""
        from ..bench.memory import check_fits
        check_fits(self.collectives, self.dtypes, self.sizes, self.nproc, self.nproc, self.device)

    def argv(self, json_path: str) -> list[str]:
        """The command line (sizes explicit, so every run gets the same)."""
        argv = ["bench", "--backend", self.backend, "--device", self.device, "-N", str(self.nproc),
                "-c", ",".join(self.collectives), "-d", ",".join(self.dtypes), "-o", ",".join(self.ops),
                "--sizes", ",".join(str(s) for s in self.sizes), "-n", str(self.iters),
                "-w", str(self.warmup_iters), "-T", f"{self.timeout_s:g}", "--json", json_path,
                "--no-save", "--no-progress", *self.extra]
        if self.host_per_rank:
            argv += ["--host-per-rank"]
        if self.cluster:
            argv += ["--cluster", self.cluster]
            if self.ranks_per_host:
                argv += ["--ranks-per-host", str(self.ranks_per_host)]
        return argv


def bench_run(combo: Combo, cfg: CompareConfig) -> BenchRun:
    return BenchRun(combo.backend, combo.device, combo.nproc, cfg.collectives, [combo.dtype], cfg.ops, cfg.sizes,
                    cfg.iters, cfg.warmup_iters, cfg.timeout_s, cfg.cluster, cfg.ranks_per_host, cfg.host_per_rank)


def child_env() -> dict:
    """This environment without flag twins: compare's own settings must not leak into the benches
    as, say, WIRESPEED_PLOT or WIRESPEED_DTYPE (every bench flag that matters is explicit). The
    user's core knobs (WIRESPEED_NSTREAMS, ...) stay: they are what the comparison is run with."""
    return for_children(os.environ)


def run_one(combo: Combo, cfg: CompareConfig, workdir: Path, log_path: Path | None) -> tuple[list[dict], str | None]:
    """Run one combination; (records, None) on success, (records so far, why) when it failed."""
    json_path = workdir / f"{combo.backend}-{combo.device}-{combo.dtype}-n{combo.nproc}.jsonl"
    run = run_child(bench_run(combo, cfg).argv(str(json_path)), child_env(), json_path, log_path)
    return run.records, run.why


def run_matrix(plan: Plan, cfg: CompareConfig, compare_id: str, log_dir: Path | None,
               say: Callable[[str], None] = print) -> Outcome:
    from ..bench.harness import NOTHING_RUNS  # here: importing the harness imports torch
    out = Outcome()
    total = len(plan.runs) * cfg.repeat
    step = 0
    with scratch_dir("wirespeed-compare-") as tmp:
        for rep in range(cfg.repeat):
            for combo in plan.runs:
                step += 1
                tag = f"{combo.label()}" + (f" (repeat {rep + 1} of {cfg.repeat})" if cfg.repeat > 1 else "")
                t0 = time.monotonic()
                log = log_dir / f"{combo.backend}-{combo.device}-{combo.dtype}-n{combo.nproc}-r{rep}.log" \
                    if log_dir else None
                records, why = run_one(combo, cfg, Path(tmp), log)
                took = time.monotonic() - t0
                for r in records:
                    r["compare_id"] = compare_id
                    r["repeat"] = rep
                out.records.extend(records)
                if why and why.startswith(NOTHING_RUNS):  # bench refused: every case was n/a
                    if rep == 0:
                        out.empty.append((combo.label(), why))
                    say(f"[{step:>3}/{total}] {tag}: no results: {why}")
                    continue
                if why:
                    out.failures.append((tag, why))
                    say(f"[{step:>3}/{total}] {tag}: FAILED after {took:.1f} s: {why}")
                    continue
                say(f"[{step:>3}/{total}] {tag}: {len(records)} results in {took:.1f} s")
                if rep == 0:
                    got = {r["collective"] for r in records}
                    for c in cfg.collectives:
                        if c not in got:
                            out.empty.append((combo.label(), f"no {c} results: the backend has no "
                                              f"{c} for {combo.dtype} (every case was n/a)"))
    return out
