"""accelerate and transformers' Trainer on a wirespeed process group initialised before them (the
route docs/clients.md gives, since both refuse a custom backend by name on CPU), against the same
script on gloo: two real ranks each. Each library's test skips, saying so, where it is not installed."""
import pytest

from .ranks import run_ranks

_runs: dict[str, list[dict]] = {}


def ranks_of(backend: str) -> list[dict]:
    if backend not in _runs:
        _runs[backend] = run_ranks("worker_hf_clients.py", 2, timeout=400, args=(backend,))
    return _runs[backend]


def outcome(backend: str, lib: str) -> list[dict]:
    out = [r[lib] for r in ranks_of(backend)]
    if "missing" in out[0]:
        pytest.skip(f"{lib} is not installed here ({out[0]['missing']})")
    for rank, o in enumerate(out):
        assert "error" not in o, f"{lib} on {backend}, rank {rank}: {o['error']}"
    return out


@pytest.mark.slow
def test_accelerate_trains_on_wirespeed_as_on_gloo():
    ws, gl = outcome("wirespeed", "accelerate"), outcome("gloo", "accelerate")
    assert [r["process_group"] for r in ranks_of("wirespeed")] == ["wirespeed"] * 2
    for rank in range(2):
        # accelerate names no backend it does not know: it reports gloo while wirespeed moves the data
        assert ws[rank]["num_processes"] == 2 and ws[rank]["distributed_type"].endswith("MULTI_CPU")
        assert ws[rank]["params"] == gl[rank]["params"], f"rank {rank}: parameters differ from gloo's"
    assert ws[0]["params"] == ws[1]["params"]


@pytest.mark.slow
def test_trainer_trains_on_wirespeed_as_on_gloo():
    ws, gl = outcome("wirespeed", "trainer"), outcome("gloo", "trainer")
    for rank in range(2):
        assert ws[rank]["world_size"] == 2
        assert ws[rank]["loss"] == pytest.approx(gl[rank]["loss"], abs=1e-6)
        assert ws[rank]["params"] == pytest.approx(gl[rank]["params"], abs=1e-6), f"rank {rank}"
    assert ws[0]["params"] == ws[1]["params"]
