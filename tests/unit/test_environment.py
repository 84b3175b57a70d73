"""Rank and world from each launcher's variables (the launchers themselves run in multiproc/)."""
import pytest

from wirespeed.errors import UsageError
from wirespeed.launch.environment import first_slurm_host, launcher_name, rank_info


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
