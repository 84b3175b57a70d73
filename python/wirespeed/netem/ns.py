"""Thin wrappers over `ip` and `tc`, and entering a network namespace from Python.

Everything the emulated cluster does to the kernel goes through `run`, so a failure always carries the
command and the tool's own one-line complaint, never a traceback.
"""
from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import threading
import time

from ..errors import UsageError, WirespeedError

NETNS_DIR = "/run/netns"
CLONE_NEWNET = 0x40000000
CAP_NET_ADMIN = 12


class NetemError(WirespeedError):
    """The kernel refused a step of building or tearing down the emulated cluster."""


class NoPrivilege(UsageError):
    """Namespaces and qdiscs need CAP_NET_ADMIN (in practice: root)."""


def has_net_admin() -> bool:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> CAP_NET_ADMIN & 1)
    except OSError:
        pass
    return os.geteuid() == 0


def require_admin(what: str = "the emulated cluster") -> None:
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            raise NoPrivilege(f"{what} needs the `{tool}` tool: install iproute2 (apt-get install iproute2)")
    if not has_net_admin():
        raise NoPrivilege(f"{what} needs root or CAP_NET_ADMIN (network namespaces and tc): "
                          "run it with sudo")


def run(cmd: list[str], *, check: bool = True, stdin: str | None = None, timeout: float = 30) -> str:
    """Run an iproute2 command; on failure raise NetemError naming it and the kernel's answer."""
    try:
        p = subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise NetemError(f"`{' '.join(cmd)}` did not finish within {timeout:g} s") from None
    if check and p.returncode != 0:
        msg = " ".join((p.stderr or p.stdout).split())[:300] or f"exit code {p.returncode}"
        raise NetemError(f"`{' '.join(cmd)[:200]}` failed: {msg}")
    return p.stdout


def tc_batch(ns: str, lines: list[str]) -> None:
    """Many tc commands in one process (a per-flow setup is hundreds of them)."""
    if lines:
        run(["tc", "-n", ns, "-batch", "-"], stdin="\n".join(lines) + "\n", timeout=120)


def list_netns() -> list[str]:
    try:
        return sorted(os.listdir(NETNS_DIR))
    except FileNotFoundError:
        return []


def netns_pids(ns: str) -> list[int]:
    out = run(["ip", "netns", "pids", ns], check=False)
    return [int(x) for x in out.split() if x.isdigit()]


def kill_netns_processes(ns: str, grace_s: float = 2.0) -> int:
    """Stop whatever still runs inside a namespace (ranks of a killed job): TERM, then KILL."""
    pids = netns_pids(ns)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace_s
        while pids and time.monotonic() < deadline:
            pids = [p for p in pids if os.path.exists(f"/proc/{p}")
                    and not _is_zombie(p)]
            time.sleep(0.05)
        if not pids:
            break
    return len(pids)


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


_libc = None


def _setns(fd: int) -> None:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL("libc.so.6", use_errno=True)
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise NetemError(f"setns failed: {os.strerror(err)}")


def run_in_netns(ns: str, fn, *args):
    """Call fn(*args) on a fresh thread that lives inside namespace `ns`; return its result.

    A network namespace belongs to a thread, not a process, so the caller's own namespace is never
    touched and sockets fn creates live in `ns` for their whole life.
    """
    box: dict = {}

    def body():
        try:
            fd = os.open(os.path.join(NETNS_DIR, ns), os.O_RDONLY)
            try:
                _setns(fd)
            finally:
                os.close(fd)
            box["value"] = fn(*args)
        except BaseException as e:  # handed to the caller's thread
            box["error"] = e

    t = threading.Thread(target=body, name=f"netns-{ns}", daemon=True)
    t.start()
    return t, box
