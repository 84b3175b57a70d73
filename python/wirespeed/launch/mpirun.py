"""Starting local ranks with mpirun: `wirespeed bench --backend mpi -N 4` run by hand (and the
emulated cluster's MPI launches, cluster_mpi.py)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

from ..errors import UsageError

# The smallest edit to Open MPI's defaults that lets it run here: as root (containers, CI) it refuses
# to start without these, and on a laptop or 2-core VM more ranks than cores is the normal case.
ROOT_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}

HOW_TO_GET = ("install Open MPI and mpi4py: `make setup` does it (Debian packages openmpi-bin "
              "libopenmpi-dev, then pip install mpi4py)")


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
    env.update(_WIRESPEED_LOCAL_SPAWN="1", OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "1"))
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
