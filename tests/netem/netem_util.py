"""Helpers and the cluster fixture of the emulated-cluster tests.

Not a conftest.py: tests/conftest.py is imported as the module `conftest` by other test folders, and
a second conftest.py here would take its place in sys.modules. Test modules import the fixture.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid

import pytest


def _netns_usable() -> str | None:
    """None if this machine can build emulated clusters, else why not."""
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return "iproute2 (ip, tc) is not installed"
    from wirespeed.netem.ns import has_net_admin
    if not has_net_admin():
        return "needs root or CAP_NET_ADMIN"
    probe = f"wsnet-probe{os.getpid()}"
    p = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    subprocess.run(["ip", "netns", "delete", probe], capture_output=True)
    if p.returncode != 0:
        return f"cannot create network namespaces here: {p.stderr.strip()}"
    return None


_WHY_NOT = _netns_usable()
needs_netns = pytest.mark.skipif(_WHY_NOT is not None, reason=f"emulated cluster: {_WHY_NOT}")


def leftovers_of(name: str) -> list[str]:
    from wirespeed.netem import cluster as C
    found = C.leftovers(name)
    found += [p for p in (os.path.join(C.ETC_NETNS, f"{C.ns_prefix(name)}h0"),
                          C.shm_root(name), C.state_path(name)) if os.path.exists(p)]
    return found


def netns_processes(name: str) -> dict[str, list[int]]:
    from wirespeed.netem import cluster as C
    from wirespeed.netem.ns import netns_pids
    return {ns: pids for ns in C.leftovers(name) if (pids := netns_pids(ns))}


from wsutil import run_here  # noqa: E402,F401 (netem tests import it from here)


def cli(*args) -> list[str]:
    return [sys.executable, "-m", "wirespeed.cli.main", *map(str, args)]


def wait_for_text(path, text: str, proc, timeout: float) -> bool:
    """Poll a file a background process writes until `text` shows up (False: it never did)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(path) as f:
                if text in f.read():
                    return True
        except FileNotFoundError:
            pass
        if proc.poll() is not None:
            return False
        time.sleep(0.2)
    return False


@pytest.fixture
def cluster_name():
    """A fresh cluster name; whatever the test built under it is removed and checked afterwards,
    so a test never touches a cluster a user (or a parallel run) has up, and leaves no namespace,
    process, hosts file, per-host /dev/shm or state file behind."""
    from wirespeed.netem import cluster as C
    name = "t" + uuid.uuid4().hex[:8]
    yield name
    C.down(name)
    assert leftovers_of(name) == [], "cluster teardown left something behind"
