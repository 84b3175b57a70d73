"""Rank and world from each launcher's variables (the launchers themselves run in multiproc/)."""
import pytest

from wirespeed.errors import UsageError
from wirespeed.launch.environment import (expand_slurm_hostlist, first_slurm_host, launcher_name,
                                          rank_info, slurm_tasks_per_node)


def test_torchrun_variables():
    info = rank_info({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4",
                      "MASTER_ADDR": "node1", "MASTER_PORT": "1234"})
    assert (info.rank, info.world_size, info.local_rank, info.local_world_size) == (3, 8, 1, 4)
    assert (info.master_addr, info.master_port) == ("node1", 1234)


def test_slurm_variables_derive_master_from_nodelist_and_port_from_job():
    env = {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_STEP_ID": "0",
           "SLURM_NTASKS_PER_NODE": "4", "SLURM_JOB_NODELIST": "gpu[03-04]", "SLURM_JOB_ID": "123456"}
    info = rank_info(env)
    assert launcher_name(env) == "srun"
    assert (info.rank, info.world_size, info.local_rank, info.local_world_size) == (5, 8, 1, 4)
    assert info.master_addr == "gpu03"
    assert info.master_port == 29500 + 123456 % 10000


def test_slurm_tasks_per_node_with_repeat_suffix():
    env = {"SLURM_PROCID": "0", "SLURM_NTASKS": "8", "SLURM_STEP_ID": "0",
           "SLURM_TASKS_PER_NODE": "4(x2)", "SLURM_JOB_NODELIST": "n1,n2"}
    assert rank_info(env).local_world_size == 4


def test_srun_uneven_tasks_per_node_reads_this_nodes_count():
    # What srun -N 2 -n 4 gave on two 4-CPU nodes of the emulated cluster: 3 tasks, then 1.
    step = {"SLURM_NTASKS": "4", "SLURM_STEP_ID": "0", "SLURM_JOB_ID": "7",
            "SLURM_STEP_TASKS_PER_NODE": "3,1", "SLURM_TASKS_PER_NODE": "3,1",
            "SLURM_JOB_NODELIST": "wsnet-a-h[0-1]", "SLURM_STEP_NODELIST": "wsnet-a-h[0-1]"}
    first = rank_info({**step, "SLURM_PROCID": "2", "SLURM_LOCALID": "2", "SLURM_NODEID": "0"})
    second = rank_info({**step, "SLURM_PROCID": "3", "SLURM_LOCALID": "0", "SLURM_NODEID": "1"})
    assert (first.local_rank, first.local_world_size) == (2, 3)
    assert (second.local_rank, second.local_world_size) == (0, 1)
    assert first.master_addr == second.master_addr == "wsnet-a-h0"


def test_srun_step_on_part_of_the_allocation_meets_at_the_steps_first_node():
    env = {"SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_STEP_ID": "1", "SLURM_NODEID": "0",
           "SLURM_STEP_TASKS_PER_NODE": "2(x2)", "SLURM_JOB_NODELIST": "node[01-04,07]",
           "SLURM_STEP_NODELIST": "node[03-04]"}
    info = rank_info(env)
    assert (info.master_addr, info.local_world_size) == ("node03", 2)


@pytest.mark.parametrize("spec,counts", [("4", [4]), ("2(x3)", [2, 2, 2]), ("3,1", [3, 1]),
                                         ("2(x2),1", [2, 2, 1])])
def test_slurm_tasks_per_node(spec, counts):
    assert slurm_tasks_per_node(spec) == counts


@pytest.mark.parametrize("nodelist,hosts", [
    ("node[01-04,07]", ["node01", "node02", "node03", "node04", "node07"]),
    ("wsnet-ws-h[0-1]", ["wsnet-ws-h0", "wsnet-ws-h1"]),
    ("gpu[9-10],cpu1", ["gpu9", "gpu10", "cpu1"]),
    ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
    ("a.b.c", ["a.b.c"])])
def test_expand_slurm_hostlist(nodelist, hosts):
    assert expand_slurm_hostlist(nodelist) == hosts


@pytest.mark.parametrize("bad", ["node[1-", "node[a-b]", "node[4-2]", "", "node]1["])
def test_unreadable_slurm_hostlist_says_set_master_addr(bad):
    with pytest.raises(UsageError, match="MASTER_ADDR") as e:
        expand_slurm_hostlist(bad)
    assert "\n" not in str(e.value)


def test_open_mpi_single_host_needs_no_master():
    env = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
           "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}
    info = rank_info(env)
    assert (info.rank, info.world_size, info.master_addr) == (1, 2, "127.0.0.1")


def test_multi_host_mpi_without_master_is_a_clear_error():
    env = {"PMI_RANK": "0", "PMI_SIZE": "4", "MPI_LOCALNRANKS": "2"}
    with pytest.raises(UsageError, match="MASTER_ADDR"):
        rank_info(env)


def test_no_launcher():
    assert rank_info({}) is None


@pytest.mark.parametrize("nodelist,first", [("a", "a"), ("node[1-4]", "node1"), ("x[07,09]", "x07"),
                                            ("gpu-a[010-011],cpu1", "gpu-a010")])
def test_first_slurm_host(nodelist, first):
    assert first_slurm_host(nodelist) == first


def test_open_mpi_across_hosts_asks_mpi_only_in_a_real_rank():
    # A dict of variables is never a rank of a live job: no MPI is started to ask for rank 0.
    env = {"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4",
           "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}
    with pytest.raises(UsageError, match="MASTER_ADDR"):
        rank_info(env)
    assert rank_info({**env, "MASTER_ADDR": "node0"}).master_addr == "node0"


def test_asking_mpi_without_mpi4py_is_one_clear_error(monkeypatch):
    import importlib.util

    from wirespeed.launch import mpirun
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mpi4py" else real(name, *a))
    monkeypatch.setattr(mpirun, "_MASTER_FROM_MPI", None)
    with pytest.raises(UsageError, match="mpi4py is not installed.*MASTER_ADDR"):
        mpirun.master_from_mpi(1, 4)


def test_ranks_a_launcher_starts_log_torchs_cpp_errors_only_unless_the_user_says():
    """When a peer dies, torch's store client logs a warning with a C++ stack from each thread
    that touches the store, ahead of wirespeed's one-line error (the soak found them on
    survivors' stderr): wirespeed's launchers give their ranks TORCH_CPP_LOG_LEVEL=ERROR, and
    keep a level the user set."""
    from wirespeed.launch.local import rank_env
    assert rank_env(0, 2, 29500, {})["TORCH_CPP_LOG_LEVEL"] == "ERROR"
    assert rank_env(0, 2, 29500, {"TORCH_CPP_LOG_LEVEL": "INFO"})["TORCH_CPP_LOG_LEVEL"] == "INFO"
