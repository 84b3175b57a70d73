"""Where the NCCL network plugin (crates/wirespeed-nccl, `make plugin`) lives, and the environment
that makes a rank's NCCL use it: `wirespeed plugin-path`, `--fast-net`, `wirespeed env`.

`make plugin` installs target/nccl-plugin/libnccl-net-wirespeed.so (plus a libnccl-net.so link, the
name NCCL opens when NCCL_NET_PLUGIN is unset). WIRESPEED_NCCL_PLUGIN overrides the location (a
path to the .so), for installs outside a checkout.
"""
from __future__ import annotations

import os
from pathlib import Path

from .errors import UsageError

LIBRARY = "libnccl-net-wirespeed.so"
NET_NAME = "wirespeed"  # the table's name: NCCL logs "Using network wirespeed"
API_VERSIONS = (8, 9, 10, 11, 12)


def _checkout_root() -> Path:
    # python/wirespeed/netplugin.py -> the repository root (the package is installed editable).
    return Path(__file__).resolve().parents[2]


def candidate() -> Path:
    """Where the library should be, built or not."""
    override = os.environ.get("WIRESPEED_NCCL_PLUGIN")
    if override:
        return Path(override).expanduser().resolve()
    return _checkout_root() / "target" / "nccl-plugin" / LIBRARY


def built() -> Path | None:
    p = candidate()
    return p if p.is_file() else None


def require() -> Path:
    """The built library, or a UsageError saying how to build it."""
    p = built()
    if p is None:
        if os.environ.get("WIRESPEED_NCCL_PLUGIN"):
            raise UsageError(f"WIRESPEED_NCCL_PLUGIN={os.environ['WIRESPEED_NCCL_PLUGIN']}: no such file")
        raise UsageError(f"the NCCL plugin is not built ({candidate()} is missing): run `make plugin` "
                         f"(or `make setup`) in {_checkout_root()}")
    return p


def api_for_nccl(version: tuple[int, ...]) -> int | None:
    """The plugin API version an NCCL release loads first (None: too old for this plugin)."""
    v = tuple(version[:2])
    for first, api in (((2, 30), 12), ((2, 28), 11), ((2, 26), 10), ((2, 24), 9), ((2, 20), 8)):
        if v >= first:
            return api
    return None


def torch_nccl_version() -> tuple[int, ...] | None:
    """The NCCL torch was built with (known without a GPU for CUDA builds; imports torch)."""
    try:
        import torch
        v = torch.cuda.nccl.version()
        return tuple(v) if isinstance(v, tuple) else None
    except Exception:  # a broken CUDA install must not stop a report
        return None


def status() -> str:
    """One line for `wirespeed env`."""
    p = built()
    head = (f"built: {p} (exports ncclNetPlugin_v8..v12)" if p
            else f"not built ({candidate()} missing): run `make plugin`")
    nv = torch_nccl_version()
    if nv is None:
        return head + "; this torch has no NCCL (a CPU-only build), nothing here would load it"
    api = api_for_nccl(nv)
    nccl = ".".join(map(str, nv))
    if api is None:
        return head + f"; torch's NCCL {nccl} is older than 2.20 and cannot load it"
    return head + f"; torch's NCCL {nccl} would load ncclNetPlugin_v{api}"


def fast_net_env(environ=None) -> dict[str, str]:
    """What a rank needs so its NCCL moves inter-host traffic through the plugin.

    NCCL_NET_PLUGIN gets the library's absolute path (NCCL 2.21+ opens a path as given) and
    NCCL_NET the plugin's name, so NCCL fails loudly instead of silently falling back to its
    socket transport if the plugin cannot start. The library's folder is put in front of
    LD_LIBRARY_PATH as well (for a rank started through ssh, `wirespeed launch` lets the remote
    shell prepend it to the remote value instead).
    """
    lib = require()
    environ = os.environ if environ is None else environ
    env = {"NCCL_NET_PLUGIN": str(lib), "NCCL_NET": NET_NAME}
    old = environ.get("LD_LIBRARY_PATH", "")
    env["LD_LIBRARY_PATH"] = str(lib.parent) + (f":{old}" if old else "")
    return env
