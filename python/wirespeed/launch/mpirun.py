"""Starting local ranks with mpirun: `wirespeed bench --backend mpi -N 4` run by hand (and the
emulated cluster's MPI launches, cluster_mpi.py)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

from ..errors import UsageError
from ..knobs import internal

# The smallest edit to Open MPI's defaults that lets it run here: as root (containers, CI) it refuses
# to start without these, and on a laptop or 2-core VM more ranks than cores is the normal case.
ROOT_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}

HOW_TO_GET = ("install Open MPI and mpi4py: `make setup` does it (Debian packages openmpi-bin "
              "libopenmpi-dev, then pip install mpi4py)")


_MASTER_FROM_MPI: tuple[str, int] | None = None


def master_from_mpi(rank: int, world: int) -> tuple[str, int]:
    """(rank 0's host name, a port free there), learned from MPI by every rank of an Open MPI job
    whose ranks span hosts and that has no MASTER_ADDR: Open MPI's variables do not say where
    rank 0 runs. MPI is initialised for this one broadcast and finalised at once (mpirun counts
    a rank that initialised and left without finalising as failed), so the job's own backend
    (gloo, wirespeed) starts as under any other launcher. Once per process: MPI cannot start
    twice."""
    global _MASTER_FROM_MPI
    if _MASTER_FROM_MPI is not None:
        return _MASTER_FROM_MPI
    import importlib.util
    unset = ("ranks span several hosts under mpirun and MASTER_ADDR is not set, so rank 0's host "
             "is asked of MPI, but ")
    fix = ": export MASTER_ADDR=<rank 0's host> (mpirun -x MASTER_ADDR=...) for every rank"
    if importlib.util.find_spec("mpi4py") is None:
        raise UsageError(unset + "mpi4py is not installed" + fix + ", or " + HOW_TO_GET)
    import socket
    import mpi4py
    mpi4py.rc.finalize = False       # finalised here, explicitly, right after the broadcast
    mpi4py.rc.thread_level = "single"
    try:
        from mpi4py import MPI
        comm = MPI.COMM_WORLD
        if comm.Get_size() != world or comm.Get_rank() != rank:
            raise UsageError(unset + f"MPI sees rank {comm.Get_rank()} of {comm.Get_size()}, not "
                             f"{rank} of {world} (mpi4py is built for another MPI than this "
                             "mpirun's)" + fix)
        mine = None
        if rank == 0:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind(("0.0.0.0", 0))   # free now; rank 0's store binds it a moment later
                mine = (socket.gethostname(), s.getsockname()[1])
        found = comm.bcast(mine, root=0)
        MPI.Finalize()
    except UsageError:
        raise
    except Exception as e:  # MPI's own errors: one line, and the way around them
        raise UsageError(unset + f"MPI failed: {str(e).splitlines()[0] if str(e) else type(e).__name__}"
                         + fix) from None
    _MASTER_FROM_MPI = (str(found[0]), int(found[1]))
    return _MASTER_FROM_MPI


def mpirun_command(argv: list[str], nproc: int, is_root: bool | None = None,
                   program: list[str] | None = None) -> list[str]:
    """mpirun running `python -m wirespeed.cli.main *argv` (or `program *argv`) as nproc local ranks."""
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        raise UsageError("mpirun is not on PATH: " + HOW_TO_GET)
    is_root = os.geteuid() == 0 if is_root is None else is_root
    cmd = [mpirun, "-n", str(nproc),
           "--oversubscribe",      # more ranks than cores is allowed, as with the local spawner
           "--bind-to", "none",    # and no pinning, so MPI and gloo ranks are scheduled alike
           "-q"]                   # no multi-line banners: each rank prints its own one-line error
    if is_root:
        cmd.append("--allow-run-as-root")
    return cmd + (program or [sys.executable, "-m", "wirespeed.cli.main"]) + list(argv)


def launch_mpirun(argv: list[str], nproc: int, program: list[str] | None = None) -> int:
    """Run the ranks under mpirun; return the job's exit code (non-zero when any rank failed)."""
    env = dict(os.environ)
    # What environment.spawned_here reads (environment.py imports this module: no import back).
    env.update({internal("LOCAL_SPAWN"): "1"}, OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "1"))
    if os.geteuid() == 0:
        env.update(ROOT_ENV)
    if nproc >= (os.cpu_count() or 1):
        # Open MPI's waits spin. When the ranks fill every core, a spinning rank can hold the core
        # its peer needs for a whole scheduler tick: on a 2-core machine with other load, 2 ranks
        # measured 24-32 ms instead of 10-20 us per small allreduce in some runs. Open MPI yields
        # by itself only when it knows the node is oversubscribed; do the same when it is full.
        env.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")
    try:
        proc = subprocess.Popen(mpirun_command(argv, nproc, program=program), env=env)
    except OSError as e:
        raise UsageError(f"could not start mpirun: {e}") from None
    try:
        code = proc.wait()
    except KeyboardInterrupt:
        proc.terminate()  # mpirun forwards it to every rank and cleans up
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        raise
    if code > 128:
        sys.stderr.write(f"wirespeed: error: a rank died (signal {code - 128}); mpirun ended the job\n")
    elif code not in (0, 1, 2, 3):
        # Not one of wirespeed's own exit codes, whose ranks print their own one-line error: mpirun
        # itself failed, and -q hid its explanation.
        sys.stderr.write(f"wirespeed: error: mpirun exited with code {code}; run `"
                         f"{' '.join(mpirun_command(argv, nproc, program=program)).replace(' -q', '')}"
                         "` to see Open MPI's reason\n")
    return code
