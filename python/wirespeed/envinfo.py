"""What a bug report needs: versions, backends (and why not), CPUs, GPUs, NICs."""
from __future__ import annotations

import importlib.metadata
import os
import platform
import socket
import sys

from . import __version__


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _mem_total_gib() -> float:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / (1 << 20), 1)
    except OSError:
        pass
    return 0.0


def nics() -> list[dict]:
    """Interfaces with their IPv4 addresses, state and speed where the kernel tells it."""
    out = []
    base = "/sys/class/net"
    try:
        names = sorted(os.listdir(base))
    except OSError:
        return out
    addrs = _ipv4_addresses()
    for name in names:
        def read(attr):
            try:
                with open(f"{base}/{name}/{attr}") as f:
                    return f.read().strip()
            except OSError:
                return None
        speed = read("speed")
        out.append({"name": name, "state": read("operstate"), "mtu": read("mtu"),
                    "speed_mbps": int(speed) if speed and speed.lstrip("-").isdigit() and int(speed) > 0 else None,
                    "ipv4": addrs.get(name, [])})
    return out


def _ipv4_addresses() -> dict[str, list[str]]:
    import fcntl
    import struct
    out: dict[str, list[str]] = {}
    for _, name in socket.if_nameindex():
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:
                packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name[:15].encode()))
                out.setdefault(name, []).append(socket.inet_ntoa(packed[20:24]))
            except OSError:
                pass
    return out


def gpus() -> list[dict]:
    try:
        import torch
        if not torch.cuda.is_available():
            return []
        return [{"index": i, "name": torch.cuda.get_device_name(i),
                 "memory_gib": round(torch.cuda.get_device_properties(i).total_memory / (1 << 30), 1)}
                for i in range(torch.cuda.device_count())]
    except Exception:  # a broken driver must not stop a bug report
        return []


def versions() -> dict:
    v = {"wirespeed": __version__, "python": sys.version.split()[0]}
    try:
        import torch
        v["torch"] = torch.__version__
        v["cuda"] = torch.version.cuda
        if torch.cuda.is_available():
            nv = torch.cuda.nccl.version()
            v["nccl"] = ".".join(map(str, nv)) if isinstance(nv, tuple) else str(nv)
    except ImportError:
        v["torch"] = None
    try:
        from . import _native
        v["native_core"] = _native.core_version()
    except ImportError as e:
        v["native_core"] = f"not built ({e})"
    try:
        # The version from metadata: importing mpi4py.MPI would initialise MPI in every rank.
        v["mpi4py"] = importlib.metadata.version("mpi4py")
    except importlib.metadata.PackageNotFoundError:
        v["mpi4py"] = None
    return v


def record_env() -> dict:
    """The compact environment stored in every record."""
    return {"host": socket.gethostname(), "cpu": _cpu_model(), "cpus": os.cpu_count(),
            "mem_gib": _mem_total_gib(), "gpus": [g["name"] for g in gpus()], "versions": versions(),
            "platform": platform.platform()}


def full_report() -> dict:
    from .backends import availability, names
    from .netplugin import status as plugin_status
    return {**record_env(), "nics": nics(),
            "backends": {n: (availability(n) or "available") for n in names()},
            "nccl_plugin": plugin_status()}
