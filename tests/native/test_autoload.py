"""An installed wirespeed is a torch.distributed backend without `import wirespeed` (issue 38):
torch's backend autoloading (entry points of group "torch.backends") calls wirespeed/autoload.py
at `import torch`. The installed metadata is what torch reads, so these tests need the package
installed from this tree (`make setup`, which `make test` runs first)."""
import os
import subprocess
import sys
import tomllib
from importlib.metadata import distribution
from pathlib import Path

import pytest

from .ranks import run_ranks

ROOT = Path(__file__).resolve().parents[2]


def _declared() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["torch.backends"]


def _python(code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, **env))


def test_installed_metadata_names_the_hook():
    installed = {e.name: e.value for e in distribution("wirespeed").entry_points if e.group == "torch.backends"}
    assert installed == _declared() == {"wirespeed": "wirespeed.autoload:torch_hook"}, \
        "the installed wirespeed lacks pyproject.toml's torch.backends entry point: run make setup"


@pytest.mark.slow
def test_import_torch_names_the_backend_and_loads_nothing_else():
    """The hook runs in every process that imports torch: it registers a name, imports no engine
    (wirespeed.native, the Rust module) and leaves gloo the cpu default of a process group
    created without a backend; with autoloading off it does not run at all."""
    probe = ("import sys, torch, torch.distributed as dist; "
             "print(sorted(m for m in sys.modules if m.startswith('wirespeed')), 'WIRESPEED' in dist.Backend._plugins, "
             "dist.Backend.default_device_backend_map['cpu'])")
    on = _python(probe, TORCH_DEVICE_BACKEND_AUTOLOAD="1")
    assert on.returncode == 0, on.stderr
    assert on.stdout.split("\n")[0] == "['wirespeed', 'wirespeed.autoload'] True gloo", on.stdout
    off = _python(probe, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    assert off.returncode == 0 and off.stdout.startswith("[] False"), (off.stdout, off.stderr)


def test_hook_never_raises():
    """Whatever fails inside it (torch.distributed missing, torch refusing the name), `import
    torch` must go on; register_backend, which it wraps, does raise the same failure (so the
    swallowing is the hook's, not a registration that cannot fail)."""
    code = """
import sys, torch, torch.distributed as dist
from wirespeed import autoload
def refuse(*a, **k): raise RuntimeError("refused")
dist.Backend.register_backend = refuse
autoload.torch_hook()
try:
    autoload.register_backend()
    print("register_backend did not raise")
except RuntimeError:
    pass
sys.modules["torch.distributed"] = None          # as where torch has no distributed package
autoload.torch_hook()
print("ok")
"""
    p = _python(code, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    assert p.returncode == 0 and p.stdout == "ok\n", (p.stdout, p.stderr)


@pytest.mark.slow
def test_script_without_import_runs_on_wirespeed():
    res = run_ranks("worker_autoload.py", 2, timeout=180, extra_env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "1"})
    for out in res:
        assert "wirespeed.native" not in out["loaded_at_import"], out
        assert out["backend"] == "wirespeed" and out["group"] == "WirespeedProcessGroup", out
        assert out["sum"] == [3.0], out
