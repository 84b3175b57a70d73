"""torch.distributed clients on the wirespeed backend, as users run them: real rank processes on
2 ranks (started by torchrun) and 4 (started as torchrun would), one launch per world size
(worker_clients.py), every result compared with gloo's or with an exact reference. These are the
tests behind the README's "works with" table."""
import json
import math
import os
import signal
import subprocess
import sys
import tempfile

import pytest

from .ranks import WORKERS, free_port, run_ranks

COMMON = ("api", "dtypes", "layouts", "data_dtypes", "functional", "mesh1d", "fsdp2", "ddp_hooks")


def under_torchrun(nproc: int, args, timeout: float) -> list[dict]:
    """Each rank's report, in rank order, from a torchrun launch of worker_clients.py."""
    with tempfile.TemporaryDirectory() as d:
        return _torchrun(nproc, args, timeout, d)


def _torchrun(nproc, args, timeout, report_dir):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
           "--master-port", str(free_port()), str(WORKERS / "worker_clients.py"), *args]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    p = subprocess.Popen(cmd, env=dict(env, OMP_NUM_THREADS="1", CLIENTS_REPORT_DIR=report_dir),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)     # torchrun and every rank it started
        p.communicate()
        raise AssertionError(f"torchrun of worker_clients.py still running after {timeout} s")
    assert p.returncode == 0, (p.returncode, out[-2000:], err[-3000:])
    return [json.loads(open(os.path.join(report_dir, f"rank{r}.json")).read()) for r in range(nproc)]


@pytest.fixture(scope="module")
def two():
    return under_torchrun(2, COMMON + ("compile_aot_eager",), timeout=300)


@pytest.fixture(scope="module")
def four():
    return run_ranks("worker_clients.py", 4, timeout=300, args=COMMON + ("mesh2d",))


@pytest.fixture(params=["two", "four"])
def res(request):
    return request.getfixturevalue(request.param)


def scenario(res, name):
    for r, out in enumerate(res):
        assert "crash" not in out[name], f"rank {r}: {out[name]['crash']}"
    return [out[name] for out in res]


def test_group_is_named_with_cpu_device_and_wirespeed_backend(res):
    for out in scenario(res, "api"):
        assert out["group_name"] == "0" and out["device_types"] == ["cpu"], out
        assert out["backend"] == "wirespeed" and out["world_class"] == "WirespeedProcessGroup"


def test_split_group_and_new_subgroups(res):
    for out in scenario(res, "api"):
        new_rank, size, total, want_rank, want_total = out["split"]
        assert (new_rank, size, total) == (want_rank, 2, want_total), out["split"]
        n, backend, got, want = out["subgroups"]
        assert n == len(res) // 2 and backend == "wirespeed" and got == want, out["subgroups"]


def test_recv_from_any_source_names_each_sender(res):
    out = scenario(res, "api")[0]
    assert out["anysource"] == out["anysource_expected"]
    assert out["named_after_any"] == [7.0, 8.0]


def test_monitored_barrier_passes_and_names_the_missing_rank(res):
    outs = scenario(res, "api")
    missing = len(res) - 1
    kind, msg, secs = outs[0]["monitored_missing"]
    assert kind == "CollectiveTimeout" and f"Rank {missing} failed to pass monitoredBarrier" in msg, msg
    assert 1.4 < secs < 10, secs
    for out in outs[1:missing]:
        assert out["monitored_missing"][0] == "CollectiveTimeout", out["monitored_missing"]


def test_bad_peer_is_one_clear_error(res):
    for out in scenario(res, "api"):
        for what, err in out["bad_peer"].items():
            assert err is not None and err.startswith("UnsupportedError") and "not in this group" in err, (what, err)
        assert "rank -1" in out["bad_peer"]["send_minus_1"]


def test_every_dtype_and_op_equals_the_exact_reduction(res):
    for out in scenario(res, "dtypes"):
        assert out["wrong"] == [] and out["checked"] > 250, out
        ref = out["refusals"]
        assert "band" in ref["band_float"] and "integer" in ref["band_float"], ref
        assert "avg" in ref["avg_bool"] and "bool" in ref["avg_bool"], ref
        assert "float8" in ref["float8"] and "int16" in ref["float8"], ref
        assert all(v.startswith("UnsupportedError") for v in ref.values()), ref
        assert out["after_refusals"] == [float(len(res))] * 2


def test_any_layout_is_reduced_and_moved_in_place(res):
    for r, out in enumerate(scenario(res, "layouts")):
        assert out["wrong"] == [], (r, out["wrong"])
    for r, out in enumerate(scenario(res, "data_dtypes")):
        assert out["wrong"] == [], (r, out["wrong"])


def test_functional_collectives(res):
    for r, out in enumerate(scenario(res, "functional")):
        assert out["wrong"] == [], (r, out["wrong"])


def test_device_mesh_and_dtensor_1d(res):
    for r, out in enumerate(scenario(res, "mesh1d")):
        assert out["wrong"] == [], (r, out["wrong"])


def test_device_mesh_2d_with_dtensor_sharding(four):
    for r, out in enumerate(scenario(four, "mesh2d")):
        assert out["backends"] == ["wirespeed", "wirespeed"], out
        assert out["classes"] == ["WirespeedProcessGroup"] * 2, out
        assert out["wrong"] == [], (r, out["wrong"])


def close(a, b, rel=1e-5, abs_=1e-6):
    return len(a) == len(b) and all(math.isclose(x, y, rel_tol=rel, abs_tol=abs_) for x, y in zip(a, b))


def test_fsdp2_training_equals_gloo(res):
    outs = scenario(res, "fsdp2")
    for r, out in enumerate(outs):
        ws, gl = out["wirespeed"], out["gloo"]
        assert close(ws["losses"], gl["losses"]), (r, ws["losses"], gl["losses"])
        assert close(ws["params"], gl["params"]), r
        assert ws["params"] == outs[0]["wirespeed"]["params"]     # every rank holds the same model
    # training moved the parameters, identically on every rank: not a no-op that trivially agrees
    assert len(set(round(x, 6) for x in outs[0]["wirespeed"]["losses"])) > 1


def test_ddp_with_each_builtin_comm_hook_equals_gloo(res):
    outs = scenario(res, "ddp_hooks")
    for r, out in enumerate(outs):
        for hook, both in out.items():
            ws, gl = both["wirespeed"], both["gloo"]
            if "error" in gl:
                # torch's own hook fails on gloo too (batched PowerSGD in this torch): alike here
                assert "error" in ws and ws["error"].split(":")[0] == gl["error"].split(":")[0], (hook, ws, gl)
                continue
            if hook == "builtin:FP16_COMPRESS":
                # torch's C++ fp16 hook needs a C++-typed future, which a backend written in Python
                # cannot make (README: what does not work); the Python FP16_COMPRESS hook does.
                assert "isTensorList" in ws.get("error", ""), ws
                continue
            assert "error" not in ws, (hook, ws["error"])
            # Two ranks add one pair of numbers: bit for bit gloo's. Four add in another order, and
            # wirespeed sums halves in float32, rounding once (gloo rounds each addition to half).
            if len(res) == 2:
                assert ws["params"] == gl["params"], hook
            else:
                half = hook in ("FP16_COMPRESS", "BF16_COMPRESS")
                assert close(ws["params"], gl["params"], 1e-2 if half else 1e-4, 1e-3 if half else 1e-5), hook
    working = [h for h, both in outs[0].items() if "error" not in both["wirespeed"]]
    assert len(working) == 9, working


def test_torch_compile_of_a_functional_collective(two):
    for out in scenario(two, "compile_aot_eager"):
        assert "error" not in out, out["error"]
        assert out["equal"], out


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_torch_compile_with_inductor_on_cpu():
    """Inductor generates and compiles C++ for the graph around the collective (a minute here)."""
    res = under_torchrun(2, ("compile_inductor",), timeout=380)
    for out in scenario(res, "compile_inductor"):
        if "error" in out and ("compiler" in out["error"].lower() or "InvalidCxxCompiler" in out["error"]):
            pytest.skip(f"torch.compile cannot build C++ here: {out['error']}")
        assert "error" not in out, out["error"]
        assert out["equal"], out
