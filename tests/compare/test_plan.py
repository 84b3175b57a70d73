"""Which combinations `wirespeed compare` runs here and which it skips, with the reason."""
import pytest

from wirespeed.backends.registry import BACKENDS, BackendEntry
from wirespeed.compare.plan import Combo, make_plan, parse_nprocs, split_list
from wirespeed.errors import UsageError


def test_this_machine_runs_cpu_backends_and_explains_the_rest():
    plan = make_plan(["gloo", "mpi", "nccl"], ["float32", "float16"], ["cpu", "cuda"], [2, 4],
                     BACKENDS, gpu_count=0)
    assert Combo("gloo", "cpu", "float16", 4) in plan.runs
    assert Combo("mpi", "cpu", "float32", 2) in plan.runs
    assert len(plan.runs) == 2 * 2 * 2
    reasons = dict(plan.skipped)
    assert reasons["mpi on cuda"] == "mpi runs on cpu tensors only"
    assert "no CUDA GPU" in reasons["gloo on cuda"]
    if BACKENDS["nccl"].check():  # no GPU here: the registry's own reason is passed on
        assert reasons["nccl"] == BACKENDS["nccl"].check()


def _entry(name, devices, why=None):
    return BackendEntry(name, devices, lambda: why, lambda: None)


def test_gpu_counts_limit_world_sizes_and_missing_backends_are_skipped():
    entries = {"nccl": _entry("nccl", ("cuda",)), "gloo": _entry("gloo", ("cpu", "cuda")),
               "broken": _entry("broken", ("cpu",), "libbroken is not installed: pip install it")}
    plan = make_plan(["nccl", "gloo", "broken", "wirespeed"], ["float32"], ["cpu", "cuda"], [2, 8],
                     entries, gpu_count=4)
    assert plan.runs == [Combo("nccl", "cuda", "float32", 2), Combo("gloo", "cpu", "float32", 2),
                         Combo("gloo", "cpu", "float32", 8), Combo("gloo", "cuda", "float32", 2),
                         Combo("gloo", "cuda", "float32", 8)]
    reasons = dict(plan.skipped)
    assert reasons["nccl on cuda with 8 ranks"].startswith("8 NCCL ranks on one host need 8 GPUs but 4 are")
    assert "--host-per-rank" in reasons["nccl on cuda with 8 ranks"]
    # gloo on CUDA tensors shares GPUs, as bench allows: 8 ranks on 4 GPUs run
    assert Combo("gloo", "cuda", "float32", 8) in plan.runs
    assert reasons["nccl on cpu"] == "nccl runs on cuda tensors only"
    assert reasons["broken"] == "libbroken is not installed: pip install it"
    assert "not registered" in reasons["wirespeed"]  # asked for, known, not in this build


@pytest.mark.parametrize("call", [
    lambda: make_plan(["glooo"], ["float32"], ["cpu"], [2], BACKENDS, 0),
    lambda: make_plan(["gloo"], ["float32"], ["tpu"], [2], BACKENDS, 0),
    lambda: parse_nprocs("2,0"),
    lambda: parse_nprocs("2,x"),
    lambda: split_list("gloo,gloo", "--backends"),
    lambda: split_list(" , ", "--backends"),
])
def test_bad_matrix_is_a_usage_error(call):
    with pytest.raises(UsageError):
        call()


def test_nccl_ranks_share_one_gpu_only_as_hosts_of_their_own():
    from wirespeed.launch.gpus import most_ranks_on_one_host
    entries = {"nccl": _entry("nccl", ("cuda",))}
    local = make_plan(["nccl"], ["float32"], ["cuda"], [1, 2], entries, gpu_count=1)
    assert local.runs == [Combo("nccl", "cuda", "float32", 1)]
    own_hosts = make_plan(["nccl"], ["float32"], ["cuda"], [1, 2], entries, gpu_count=1,
                          ranks_on_one_host=lambda n: most_ranks_on_one_host(n, host_per_rank=True))
    assert own_hosts.runs == [Combo("nccl", "cuda", "float32", 1), Combo("nccl", "cuda", "float32", 2)]
    # an emulated cluster of 2 hosts, round robin: 2 ranks are alone on their hosts, 4 are not
    on_cluster = make_plan(["nccl"], ["float32"], ["cuda"], [2, 4], entries, gpu_count=1,
                           ranks_on_one_host=lambda n: most_ranks_on_one_host(n, hosts=2))
    assert on_cluster.runs == [Combo("nccl", "cuda", "float32", 2)]
    assert "2 NCCL ranks on one host" in dict(on_cluster.skipped)["nccl on cuda with 4 ranks"]
