"""DTensor redistributions, sharded matmuls, a tensor-parallel model and (4 ranks) FSDP2 x TP on
the wirespeed backend at 2, 3 and 4 ranks, each against the whole computation in one process,
with gloo run the same way in the same job as the control (dtensor_checks.py says what and why
the tolerance)."""
import pytest

from .dtensor_checks import TRAIN_ATOL
from .ranks import run_ranks

WORLDS = (2, 3, 4)
_runs: dict[int, list[dict]] = {}


def ranks_of(world: int) -> list[dict]:
    if world not in _runs:
        checks = ("redistribute", "matmul", "tp") + (("fsdp_tp",) if world == 4 else ())
        _runs[world] = run_ranks("worker_dtensor.py", world, timeout=400, args=checks)
    return _runs[world]


def results(world, backend, check):
    out = [r[backend][check] for r in ranks_of(world)]
    for rank, o in enumerate(out):
        assert not (isinstance(o, dict) and "crash" in o), f"{backend} rank {rank}: {o['crash']}"
    return out


@pytest.mark.parametrize("world", WORLDS)
def test_every_redistribution_matches_the_whole_tensor_as_on_gloo(world):
    for rank, (ws, gl) in enumerate(zip(results(world, "wirespeed", "redistribute"),
                                        results(world, "gloo", "redistribute"))):
        assert set(ws) == set(gl) and len(ws) == 32
        # torch refuses a few pairs (Replicate -> Partial) on any backend: the same refusal is right
        wrong = {k: (ws[k], gl[k]) for k in ws if ws[k] != gl[k] or not (ws[k] == "ok" or ws[k].startswith("raised"))}
        assert not wrong, f"rank {rank}: (wirespeed, gloo) {wrong}"
        assert sum(v == "ok" for v in ws.values()) >= 28, ws


@pytest.mark.parametrize("world", WORLDS)
def test_sharded_matmuls_are_exact(world):
    assert results(world, "gloo", "matmul") == [[]] * world
    assert results(world, "wirespeed", "matmul") == [[]] * world


@pytest.mark.parametrize("backend", ("gloo", "wirespeed"))
@pytest.mark.parametrize("check,world", [("tp", 2), ("tp", 3), ("tp", 4), ("fsdp_tp", 4)])
def test_tensor_parallel_training_matches_the_unsharded_model(check, world, backend):
    for rank, r in enumerate(results(world, backend, check)):
        assert r["finite"], f"rank {rank}: inf or NaN: {r}"
        assert r["loss_gap"] <= TRAIN_ATOL and r["param_gap"] <= TRAIN_ATOL, f"rank {rank}: {r}"
