"""Every collective x dtype x op, world sizes 1-4, zero and odd sizes, both variants: real gloo ranks
on loopback, every result checked by the harness, and every case that should exist was run."""
import json

import pytest

from wsutil import wirespeed
from wirespeed.bench.dtypes import DTYPES, OPS

IN_PLACE_ONLY = {"all_reduce", "broadcast", "reduce"}       # torch.distributed's API has no other form
OUT_OF_PLACE_ONLY = {"all_to_all", "send_recv", "barrier"}
REDUCING = {"all_reduce", "reduce_scatter", "reduce"}
ALL = ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all", "send_recv", "barrier"]
SIZES = [0, 1000, 4098]  # zero, odd element counts per rank for most world sizes


def expected_cases(world):
    cases = set()
    for coll in ALL:
        if coll == "send_recv" and world == 1:
            continue  # torch.distributed cannot send to itself
        variants = [True] if coll in IN_PLACE_ONLY else [False] if coll in OUT_OF_PLACE_ONLY else [False, True]
        dtypes = ["float32"] if coll == "barrier" else list(DTYPES)
        sizes = [0] if coll == "barrier" else SIZES
        for dt in dtypes:
            for op in (OPS if coll in REDUCING else [None]):
                if op == "avg" and not DTYPES[dt].is_float:
                    continue  # gloo has no integer average
                for inplace in variants:
                    for s in sizes:
                        cases.add((coll, dt, op, inplace, s))
    return cases


def requested_size(rec, world):
    """Map a record back to the requested size (the size column rounds to whole per-rank chunks)."""
    return min(s for s in SIZES if s >= rec["bytes"]) if rec["collective"] != "barrier" else 0


@pytest.mark.timeout(240)
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_every_case_runs_and_checks(world, tmp_path):
    out = tmp_path / "r.jsonl"
    p = wirespeed("bench", "-N", world, "-c", "all", "-d", "all", "-o", "all",
                  "--sizes", ",".join(map(str, SIZES)), "-w", "1", "-n", "1", "--no-save",
                  "--json", out, "--timeout", "60", timeout=220)
    assert p.returncode == 0, p.stderr[-2000:]
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert all(r["wrong"] == 0 and r["checked"] for r in recs)
    assert all(r["world_size"] == world for r in recs)
    got = {(r["collective"], r["dtype"], r["op"], r["inplace"], requested_size(r, world)) for r in recs}
    assert got == expected_cases(world)
    assert len(recs) == len(got)
    assert "Out of bounds values : 0 OK" in p.stdout
