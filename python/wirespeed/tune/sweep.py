"""Plan and run a tune: the settings (the defaults, then each knob or group of knobs over its
values), each run as a `wirespeed bench` in processes of its own, because libraries read their
knobs once at start-up. Repeats are interleaved (every setting once, then every setting again),
so a slow drift of a shared machine spreads over all settings instead of favouring one.
"""
from __future__ import annotations

import itertools
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..compare.runner import BenchRun
from ..knobs import for_children
from ..launch.child import Outcome, run_child, scratch_dir
from .knobs import GROUP_RULES, KNOBS, Knob


@dataclass(frozen=True)
class Setting:
    env: tuple[tuple[str, str], ...] = ()   # () is the libraries' defaults

    @property
    def label(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.env) or "default"

    def as_dict(self) -> dict[str, str]:
        return dict(self.env)


DEFAULT = Setting()


@dataclass
class TuneConfig:
    """A tune: the bench every setting runs (`run`: ranks, cases, iterations), the knobs swept and
    how often, and where results go."""
    run: BenchRun
    knobs: list[Knob]
    repeat: int = 3
    json_path: str | None = None
    save_dir: str | None = "runs"


def settings(knobs: list[Knob]) -> list[Setting]:
    """The defaults first, then per group (a knob alone is a group of one) every combination of
    its values that GROUP_RULES allows, the other knobs left at their defaults."""
    groups: dict[str, list[Knob]] = {}
    for k in knobs:
        # A knob alone is keyed by where it acts too: WIRESPEED_ALGO has a one-host row and an
        # across-hosts row, and merged into one group the second's values overwrote the first's.
        groups.setdefault(k.group or f"{k.name}@{k.where}", []).append(k)
    out = [DEFAULT]
    for gname, members in groups.items():
        rule = GROUP_RULES.get(gname, lambda s: True)
        for combo in itertools.product(*(k.values for k in members)):
            env = {k.name: v for k, v in zip(members, combo)}
            s = Setting(tuple(env.items()))
            if rule(env) and s not in out:
                out.append(s)
    return out


def setting_env(setting: Setting, base=None) -> dict:
    """The environment of one setting's run: this one without flag twins (tune's own flags must
    not leak into bench) and without any knob of the table (so "default" is the libraries'
    default, not whatever this shell exported), plus the setting. The user's other core knobs
    (WIRESPEED_IFNAME, ...) stay."""
    env = for_children(dict(os.environ if base is None else base), drop={kn.name for kn in KNOBS})
    env.update(setting.env)
    return env


def interleaved(count: int, repeat: int):
    """(repeat, index) of `count` items run `repeat` times, interleaved: every item once, then
    every item again (A B C A B C), so slow drift of a shared machine spreads over all of them
    instead of favouring one. tune's sweep and `train --tune` both run in this order."""
    for rep in range(repeat):
        for i in range(count):
            yield rep, i


def run_sweep(cfg: TuneConfig, plan: list[Setting], tune_id: str, log_dir: Path | None,
              say: Callable[[str], None] = print) -> Outcome:
    out = Outcome()
    total, step = len(plan) * cfg.repeat, 0
    with scratch_dir("wirespeed-tune-") as tmp:
        for rep, i in interleaved(len(plan), cfg.repeat):
            setting = plan[i]
            step += 1
            t0 = time.monotonic()
            json_path = Path(tmp) / f"s{i}-r{rep}.jsonl"
            run = run_child(cfg.run.argv(str(json_path)), setting_env(setting), json_path,
                            log_dir / f"s{i}-r{rep}.log" if log_dir is not None else None,
                            log_header=f"# {setting.label}\n")
            records, why, code = run.records, run.why, run.code
            took = time.monotonic() - t0
            for r in records:
                r.update(tune_id=tune_id, repeat=rep, setting=setting.as_dict(),
                         setting_label=setting.label)
            out.records.extend(records)
            tag = f"[{step:>3}/{total}] {setting.label}" + (f" (repeat {rep + 1})" if cfg.repeat > 1 else "")
            wrong = sum(int(r["wrong"]) for r in records)
            if code != 0 and not wrong:
                out.failures.append((setting.label, why))
                say(f"{tag}: FAILED after {took:.1f} s: {why}")
            else:
                say(f"{tag}: {len(records)} results in {took:.1f} s"
                    + (f", {wrong} WRONG elements" if wrong else ""))
    return out
