"""torch.compile(DDP(model)) on the wirespeed backend (issue 38): dynamo's DDP optimizer, plain
and with no_sync(), trains at 2 and 4 ranks and ends where the same run on gloo ends; and the
collectives dynamo breaks a compiled function's graph at (broadcast, barrier, reduce, send/recv)
give gloo's results. Before wirespeed's methods were kept out of dynamo (native/dynamo.py) both
failed: UnsafeScriptObjectError ... attr=_direct."""
import pytest
import torch

from .ranks import run_ranks

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("world", [2, 4])
def test_compiled_ddp_and_graph_broken_collectives_match_gloo(world):
    res = run_ranks("worker_compile_ddp.py", world, timeout=600)
    for mode in ("", "_no_sync"):
        for r, out in enumerate(res):
            for backend in ("gloo", "wirespeed"):
                assert "crash" not in out[backend + mode], f"rank {r}, {backend}{mode}:\n{out[backend + mode]['crash']}"
        ws = [torch.tensor(out["wirespeed" + mode]["params"]) for out in res]
        gloo = [torch.tensor(out["gloo" + mode]["params"]) for out in res]
        for r in range(world):
            # every rank trained on its own data, so equal parameters mean the gradients were synced
            assert torch.equal(ws[r], ws[0]), f"rank {r}{mode}: wirespeed replicas diverged"
            torch.testing.assert_close(ws[r], gloo[r], rtol=1e-5, atol=1e-6, msg=lambda m: f"rank {r}{mode}: {m}")
    for r, out in enumerate(res):
        for backend in ("gloo", "wirespeed"):
            assert "crash" not in out[backend + "_graph_breaks"], f"rank {r}:\n{out[backend + '_graph_breaks']['crash']}"
        assert out["wirespeed_graph_breaks"] == out["gloo_graph_breaks"], r
    # no_sync's accumulation (two batches a step) trained on other data than plain steps did
    assert not torch.equal(torch.tensor(res[0]["wirespeed"]["params"]), torch.tensor(res[0]["wirespeed_no_sync"]["params"]))
