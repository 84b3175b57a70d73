"""Which ranks may share a GPU and what the header says (launch/gpus.py), and the backend picked
without --backend (cli/rankjob.pick_backend): pure rules, tested with the inputs a GPU box gives."""
import pytest

from wirespeed.launch.gpus import (MPS_START, gpu_problem, most_ranks_on_one_host, mps_running,
                                   set_host_per_rank, sharing_lines)
from wirespeed.cli.rankjob import pick_backend, resolve_backend


def test_device_cpu_picks_a_cpu_backend_even_where_nccl_runs():
    assert pick_backend("cpu", nccl_usable=True) == ("gloo", "cpu")
    assert pick_backend(None, nccl_usable=True) == ("nccl", "cuda")
    assert pick_backend(None, nccl_usable=False) == ("gloo", "cpu")
    assert pick_backend("cuda", nccl_usable=False) == ("nccl", "cuda")  # create() then says why not
    assert resolve_backend(None, "cpu") == ("gloo", "cpu")


@pytest.mark.parametrize("nproc,hosts,per_host,own,expect", [
    (4, None, None, False, 4),   # local spawn: every rank on this host
    (4, None, None, True, 1),    # --host-per-rank
    (4, 2, None, False, 2),      # round robin over 2 emulated hosts
    (3, 4, None, False, 1),
    (4, 2, 2, False, 2),         # blocks of 2
    (1, 2, 4, False, 1),
])
def test_ranks_on_one_host(nproc, hosts, per_host, own, expect):
    assert most_ranks_on_one_host(nproc, hosts, per_host, own) == expect


def test_only_nccl_ranks_of_one_host_need_a_gpu_each():
    assert gpu_problem("gloo", 4, 1, 4) is None
    assert gpu_problem("nccl", 2, 2, 2) is None
    assert gpu_problem("nccl", 2, 1, 1) is None  # each rank its own host
    why = gpu_problem("nccl", 2, 1, 2)
    assert "2 NCCL ranks on one host need 2 GPUs but 1 is visible" in why and "--host-per-rank" in why


def test_host_per_rank_sets_both_host_ids():
    env = {}
    set_host_per_rank(3, env)
    assert env["NCCL_HOSTID"] == env["WIRESPEED_HOSTID"] and env["NCCL_HOSTID"].endswith("-rank3")


def test_mps_is_seen_by_its_control_pipe(tmp_path):
    env = {"CUDA_MPS_PIPE_DIRECTORY": str(tmp_path)}
    assert not mps_running(env)
    (tmp_path / "control").write_text("")
    assert mps_running(env)


def test_header_names_shared_gpus_and_mps_advice():
    assert sharing_lines(["a", "b"], ["GPU-1", "GPU-2"], "nccl", mps=False) == []
    lines = sharing_lines(["h0", "h1", "h0"], ["GPU-1", "GPU-1", "GPU-2"], "nccl", mps=False)
    assert lines[0] == "# ranks 0,1 share GPU GPU-1 (2 host ids: h0, h1)"
    assert any("network transport" in line for line in lines)
    assert MPS_START in lines[-1] and "not running" in lines[-1]
    with_mps = sharing_lines(["h0", "h1"], ["GPU-1", "GPU-1"], "gloo", mps=True)
    assert "MPS is running" in with_mps[-1] and not any("NCCL" in line for line in with_mps)
