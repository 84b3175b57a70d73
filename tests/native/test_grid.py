"""Every collective x dtype x op x world size (1-5, and 8 ranks on 2 cores) on the wirespeed
backend, bit-exact against gloo and the exact reference, with zero, odd and cross-memory sizes.
One launch of 8 real rank processes (worker_grid.py); smaller worlds are sub-groups of it. One test
per collective and world size, so a failure names its case (each message names dtype, size, op)."""
import pytest

from .ranks import run_ranks

COLLECTIVES = ("all_reduce", "reduce", "reduce_scatter", "all_gather", "broadcast", "all_to_all",
               "gather/scatter", "send/recv")
WORLDS = (1, 2, 3, 4, 5, 8)
_grid: list[dict] = []


def grid() -> list[dict]:
    if not _grid:
        _grid.extend(run_ranks("worker_grid.py", 8, timeout=580))
    return _grid


@pytest.mark.timeout(600)
@pytest.mark.parametrize("world", WORLDS, ids=lambda w: f"w{w}")
@pytest.mark.parametrize("collective", COLLECTIVES)
def test_collective_matches_gloo_and_the_exact_result_bit_for_bit(collective, world):
    results = grid()
    crashed = [f for r in results for f in r["failures"] if " w" not in f.split(":")[0]]
    assert not crashed, crashed[0]
    case = f"{collective} w{world}"
    failures = [f"rank {r['rank']}: {f}" for r in results for f in r["failures"]
                if f.split(":")[0].startswith(collective + " ") and f" w{world} " in f.split(":")[0]]
    assert not failures, "\n".join(failures[:20])
    checked = sum(r["checked"].get(case, 0) for r in results)
    if collective == "send/recv" and world == 1:
        return                          # nobody to send to
    assert checked >= world * 10, f"{case}: only {checked} results checked"
