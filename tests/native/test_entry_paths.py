"""Every entry path torch has into the wirespeed backend (entry_paths.py), with temporary inputs
dropped before the wait and the allocator churned: 2, 3 and 4 real rank processes, one launch per
world size, one test per case and world, each result checked against the collective's definition.
gloo runs every case in the same job as the control: a case gloo fails is a wrong test, not a
wrong backend."""
import pytest

from .entry_paths import CASES
from .ranks import run_ranks

WORLDS = (2, 3, 4)
_runs: dict[int, list[dict]] = {}


def ranks_of(world: int) -> list[dict]:
    if world not in _runs:
        _runs[world] = run_ranks("worker_entry_paths.py", world, timeout=400)
    return _runs[world]


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("world", WORLDS)
def test_entry_path_gives_the_collectives_result(world, case):
    res = ranks_of(world)
    control = {r: out["gloo"][case] for r, out in enumerate(res) if out["gloo"][case]}
    assert not control, f"the case is wrong: gloo fails it too: {control}"
    wrong = {r: out["wirespeed"][case] for r, out in enumerate(res) if out["wirespeed"][case]}
    assert not wrong, f"{case} at {world} ranks: {wrong}"
