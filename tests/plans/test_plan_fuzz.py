"""A seeded fuzzer of MSCCL++ plans: thousands of mutants of the fixture plans (ops and fields
deleted or duplicated, values of the wrong type, null, huge and negative numbers, empty lists, deep
nesting, garbage bytes, truncation), each fed as bytes to the real reader (format.loads, parse),
then to the checker and the simulator, in this process. Every mutant must end in a verdict or in
wirespeed's user error (UsageError, of which PlanError is one): any other exception is a failure,
and so is a mutant that takes more than CASE_LIMIT_S (a hang). A failure names the seed and the
case, which rebuild the mutant alone: `mutant(SEED, i)`.
"""
from __future__ import annotations

import json
import os
import random
import signal
import time
import traceback
from pathlib import Path

import pytest

from wirespeed.errors import UsageError
from wirespeed.plans import simulate as sim
from wirespeed.plans.check import check
from wirespeed.plans.format import loads, parse
from wirespeed.plans.topology import parse_topology

FIXTURES = Path(__file__).parent / "fixtures"
SEED = int(os.environ.get("WIRESPEED_FUZZ_SEED", "36"))
CASE_LIMIT_S = 2.0
# What a mutant's check may take: a mutant past these must be refused (a PlanError), not run.
CHECK_MEMORY = 256 << 20
CHECK_STEPS = 20_000
SIM_STEPS = 20_000

# Values put in place of a field or an element: wrong types, null, huge and negative numbers,
# empty containers, and "__DEEP__", which becomes deeply nested brackets in the text.
ODD_VALUES = [None, True, False, "", "x", "i", "memory", "put", 0, 1, 2, -1, -2**31, 5, 7, 16, 2**31 - 1,
              2**32, 2**63, 2**64 - 1, 2**64, -2**64, 2**100, 10**30, 1.5, -0.0, [], {}, [1, 2], [None],
              {"x": 1}, [[]], "__DEEP__"]


def _texts() -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(FIXTURES.glob("*.json"))}


TEXTS = _texts()
SMALL = [n for n in TEXTS if "_2r" in n or "_4r" in n]


def _positions(obj, path=()):
    """Every (container path, key) in obj, depth first."""
    out = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.append((path, k))
            out.extend(_positions(v, path + (k,)))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out.append((path, i))
            out.extend(_positions(v, path + (i,)))
    return out


def _get(obj, path):
    for k in path:
        obj = obj[k]
    return obj


def _odd(rng: random.Random, old):
    """A value for a field that held `old`: an odd one, or near the old one when it was a number."""
    if isinstance(old, int) and not isinstance(old, bool) and rng.random() < 0.4:
        return rng.choice([old + 1, old - 1, old * 2, old + 7, -old - 1, old + 2**32, old * 1000])
    return rng.choice(ODD_VALUES)


def _mutate_tree(rng: random.Random, obj, what: list[str]) -> None:
    positions = _positions(obj)
    if not positions:
        what.append("nothing left to mutate")
        return
    path, key = rng.choice(positions)
    parent = _get(obj, path)
    where = "/".join(map(str, path + (key,)))
    kind = rng.choice(["delete", "delete", "duplicate", "odd", "odd", "odd", "odd", "empty", "ops", "ops",
                       "insert"])
    blocks = [(p + (k,)) for p, k in positions if k == "ops" and isinstance(_get(obj, p + (k,)), list)]
    if kind == "insert" and blocks:
        # An op of a kind the fixtures lack (semaphores, barriers, pipelines), with odd numbers,
        # and the rank's semaphores set to odd initial values.
        block = rng.choice(blocks)
        ops = _get(obj, block)
        gpu = _get(obj, block[:2]) if len(block) >= 2 and block[0] == "gpus" else None
        if isinstance(gpu, dict) and rng.random() < 0.7:
            gpu["semaphores"] = [{"init_value": rng.choice([0, 1, 2, 2**32 - 1, 2**32, 2**64, -1])}
                                 for _ in range(rng.choice([1, 2]))]
        ids = [rng.choice([0, 0, 1, 2, -1, 2**64])]
        op = rng.choice([
            {"name": "sem_acquire", "semaphore_ids": ids * rng.choice([1, 2])},
            {"name": "sem_release", "semaphore_ids": ids},
            {"name": "barrier", "barrier_id": rng.choice([0, 1, 15, 16, 2**20]),
             "num_threadblocks": rng.choice([1, 2, 3, 0, 2**64])},
            {"name": "pipeline", "iter_context": {"unit_size": rng.choice([1, 16, 1024, 2**40, 2**41]),
                                                  "num_chunks": rng.choice([1, 2, 64, 2**20, 2**21])},
             "ops": [json.loads(json.dumps(rng.choice(ops)))] if ops else []},
            {"name": "nop"},
        ])
        ops.insert(rng.randrange(len(ops) + 1), op)
        what.append(f"insert {op['name']} into {'/'.join(map(str, block))}")
        return
    if kind == "ops" and blocks:
        # An op deleted, duplicated or moved in a thread block: mutants that still parse and
        # reach the checker (deadlocks, races, wrong chunks, empty blocks).
        ops = _get(obj, rng.choice(blocks))
        i = rng.randrange(len(ops)) if ops else 0
        how = rng.choice(["delete", "duplicate", "move", "clear"])
        if how == "delete" and ops:
            del ops[i]
        elif how == "duplicate" and ops:
            ops.insert(rng.randrange(len(ops) + 1), json.loads(json.dumps(ops[i])))
        elif how == "move" and ops:
            ops.insert(rng.randrange(len(ops) + 1), ops.pop(i))
        else:
            ops.clear()
        what.append(f"ops {how} at {i}")
        return
    if kind in ("delete", "ops", "insert"):
        del parent[key]
    elif kind == "duplicate" and isinstance(parent, list):
        parent.insert(key, json.loads(json.dumps(parent[key])))
    elif kind == "duplicate":
        parent[key + "_2"] = parent[key]            # an unknown field
    elif kind == "empty":
        parent[key] = rng.choice([[], {}, ""])
    else:
        parent[key] = _odd(rng, parent[key])
    what.append(f"{kind} {where}")


def _mutate_bytes(rng: random.Random, data: bytes, what: list[str]) -> bytes:
    kind = rng.choice(["truncate", "garbage", "flip", "nul", "nest"])
    at = rng.randrange(len(data) + 1)
    what.append(f"{kind} at byte {at}")
    if kind == "truncate":
        return data[:at]
    if kind == "garbage":
        return data[:at] + rng.randbytes(rng.randrange(1, 64)) + data[at + rng.randrange(64):]
    if kind == "flip":
        return data[:at] + bytes([rng.randrange(256)]) + data[at + 1:]
    if kind == "nul":
        return data[:at] + b"\0" + data[at:]
    n = rng.choice([40, 1000, 100_000])
    return data[:at] + b"[" * n + b"]" * n + data[at:]


def mutant(seed: int, case: int) -> tuple[str, bytes, list[str]]:
    """Case `case` of seed `seed`, rebuilt alone: (fixture, the mutant's bytes, what was done)."""
    rng = random.Random(f"{seed}:{case}")
    name = rng.choice(SMALL) if rng.random() < 0.85 else rng.choice(list(TEXTS))
    obj = json.loads(TEXTS[name])
    what: list[str] = []
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        _mutate_tree(rng, obj, what)
    deep = rng.choice([40, 2000, 200_000])
    data = json.dumps(obj).replace('"__DEEP__"', "[" * deep + "]" * deep).encode()
    if rng.random() < 0.15:
        data = _mutate_bytes(rng, data, what)
    return name, data, what


class _Hang(BaseException):
    """The case ran past CASE_LIMIT_S (a BaseException: no `except Exception` swallows it)."""


def _alarm(signum, frame):
    raise _Hang()


TOPO = parse_topology("cpu-emulated")


def run_case(seed: int, case: int) -> str:
    """'error' (wirespeed's user error), 'ok'/'wrong' (a check's verdict); anything else raises."""
    name, data, what = mutant(seed, case)
    obj = loads(data, "fuzz.json")
    plan = parse(obj, source="fuzz.json")
    result = check(plan, runs=2, memory=CHECK_MEMORY, max_steps=CHECK_STEPS)
    if not result.error:
        sim.simulate(plan, TOPO, sim.fit_size(plan, 4096))
    return "ok" if result.ok else "wrong"


def fuzz(seed: int, cases: int, monkeypatch) -> dict:
    monkeypatch.setattr(sim, "MAX_STEPS", SIM_STEPS)
    counts = {"ok": 0, "wrong": 0, "error": 0}
    failures = []
    old = signal.signal(signal.SIGALRM, _alarm)
    start = time.monotonic()
    try:
        for case in range(cases):
            t0 = time.monotonic()
            try:
                signal.setitimer(signal.ITIMER_REAL, CASE_LIMIT_S)
                try:
                    counts[run_case(seed, case)] += 1
                finally:
                    signal.setitimer(signal.ITIMER_REAL, 0)
            except UsageError as e:
                counts["error"] += 1
                msg = str(e)
                if "\n" in msg or not msg.startswith("fuzz.json: "):
                    failures.append((case, f"an error of more than one line or not naming the file: {msg!r}"))
            except _Hang:
                failures.append((case, f"took more than {CASE_LIMIT_S} s (a hang)"))
            except Exception as e:   # noqa: BLE001 - the point: anything but UsageError is a bug
                tb = traceback.extract_tb(e.__traceback__)[-1]
                failures.append((case, f"{type(e).__name__}: {str(e)[:200]} at {tb.filename}:{tb.lineno}"))
            if time.monotonic() - t0 > CASE_LIMIT_S and not any(c == case for c, _ in failures):
                failures.append((case, f"took {time.monotonic() - t0:.1f} s (a hang)"))
    finally:
        signal.signal(signal.SIGALRM, old)
    counts["seconds"] = round(time.monotonic() - start, 1)
    if failures:
        lines = []
        for case, why in failures[:20]:
            name, _, what = mutant(seed, case)
            lines.append(f"  case {case} ({name}: {'; '.join(what)}): {why}")
        pytest.fail(f"plan fuzzer, seed {seed} (rebuild a case with mutant({seed}, CASE)): {len(failures)} of "
                    f"{cases} cases failed; {counts}\n" + "\n".join(lines), pytrace=False)
    print(f"plan fuzzer: seed {seed}, {cases} cases: {counts}")
    return counts


def test_six_thousand_plan_mutants_give_a_verdict_or_one_line_never_a_traceback_or_a_hang(monkeypatch):
    counts = fuzz(SEED, 6000, monkeypatch)
    # The mutants reach every stage: refused by the reader, and checked to a verdict.
    assert counts["error"] > 1000 and counts["ok"] + counts["wrong"] > 100, counts


@pytest.mark.slow
def test_forty_thousand_plan_mutants_of_another_seed(monkeypatch):
    # 40,000 cases, about 70 s (100,000 took 167 s, the suite's longest test by far, while the
    # whole suite stood near its 35-minute line); the 6,000-case test checks the stages reached
    fuzz(SEED + 1, 40_000, monkeypatch)
