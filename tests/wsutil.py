"""Shared test helpers: run the real CLI in subprocesses. A module of its own (not conftest.py) so
`from wsutil import ...` is unambiguous when several test folders have a conftest.py."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent


def wirespeed(*args, timeout=120, env=None, check=False) -> subprocess.CompletedProcess:
    """Run `wirespeed ARGS` as a user would, capturing output."""
    full_env = dict(os.environ)
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "OMPI_COMM_WORLD_RANK",
              "PMI_RANK", "SLURM_PROCID", "_WIRESPEED_LOCAL_SPAWN"):
        full_env.pop(k, None)
    full_env.update(env or {})
    p = subprocess.run([sys.executable, "-m", "wirespeed.cli.main", *map(str, args)], capture_output=True,
                       text=True, timeout=timeout, env=full_env, cwd=ROOT)
    if check and p.returncode != 0:
        raise AssertionError(f"wirespeed {' '.join(map(str, args))} exited {p.returncode}:\n{p.stdout}\n{p.stderr}")
    return p


def run_here(capture, *args) -> tuple[int, str, str]:
    """`wirespeed ARGS` in this process (what the console script calls), for speed: a fresh
    interpreter pays seconds of torch import per call on this 2-core machine. `capture` is
    pytest's capsys, or capfd where ranks (child processes) print too."""
    from wirespeed.cli.main import main
    capture.readouterr()
    try:
        code = main([str(a) for a in args])
    except SystemExit as e:
        code = e.code
    out, err = capture.readouterr()
    return code, out, err
