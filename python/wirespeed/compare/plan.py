"""The comparison matrix: what the user asked for, which combinations exist here, and why not others.

A combination that cannot run is listed with its reason instead of failing the whole comparison, so
`--backends gloo,mpi,wirespeed,nccl` works on a laptop and on a GPU node alike.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import UsageError

# Backends the project is known to be building: asked for but not registered is a skip, not a typo.
PLANNED = {"wirespeed": "not registered in this build yet (the native wirespeed backend is not built)"}
DEVICES = ("cpu", "cuda")


@dataclass(frozen=True, order=True)
class Combo:
    backend: str
    device: str
    dtype: str
    nproc: int

    def label(self) -> str:
        return f"{self.backend} {self.dtype} {self.device} n={self.nproc}"


@dataclass
class CompareConfig:
    backends: list[str]
    dtypes: list[str]
    devices: list[str]
    nprocs: list[int]
    collectives: list[str]
    ops: list[str]
    sizes: list[int]
    iters: int = 20
    warmup_iters: int = 5
    timeout_s: float = 300.0
    repeat: int = 1
    variant: str = "best"
    json_path: str | None = None
    save_dir: str | None = "runs"
    plot_dir: str | None = None
    cluster: str | None = None          # emulated cluster the benches run on (bench --cluster)
    ranks_per_host: int | None = None
    host_per_rank: bool = False         # bench --host-per-rank: every rank a host of its own


@dataclass
class Plan:
    runs: list[Combo] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (what, why), in asking order

    def skip(self, what: str, why: str) -> None:
        if (what, why) not in self.skipped:
            self.skipped.append((what, why))


def split_list(text: str, flag: str) -> list[str]:
    items = [t.strip() for t in str(text).split(",") if t.strip()]
    if not items:
        raise UsageError(f"{flag} is empty: give a comma list")
    if len(set(items)) != len(items):
        raise UsageError(f"{flag} names something twice: {text}")
    return items


def parse_nprocs(text: str) -> list[int]:
    out = []
    for item in split_list(text, "--nprocs"):
        try:
            n = int(item)
        except ValueError:
            raise UsageError(f"--nprocs takes a comma list of rank counts such as 2,4,8, got {item!r}") from None
        if n < 1:
            raise UsageError(f"--nprocs: {n} ranks is not a job; use 1 or more")
        out.append(n)
    return out


def make_plan(backends: list[str], dtypes: list[str], devices: list[str], nprocs: list[int],
              entries: dict, gpu_count: int, ranks_on_one_host=lambda n: n) -> Plan:
    """Every (backend, device, dtype, nproc) asked for: runnable ones in `runs`, others in `skipped`.
    `entries` is the backend registry (name -> BackendEntry); `gpu_count` the CUDA GPUs visible;
    `ranks_on_one_host(n)` how many of n ranks share a host (all of them unless on the emulated
    cluster or each its own host), which decides whether NCCL ranks may share GPUs, as in bench."""
    from ..launch.gpus import gpu_problem
    for d in devices:
        if d not in DEVICES:
            raise UsageError(f"unknown device {d!r}: choose from {', '.join(DEVICES)}")
    for b in backends:
        if b not in entries and b not in PLANNED:
            raise UsageError(f"unknown backend {b!r}: choose from {', '.join([*entries, *PLANNED])}")
    plan = Plan()
    for b in backends:
        if b not in entries:
            plan.skip(b, PLANNED[b])
            continue
        why = entries[b].check()
        if why:
            plan.skip(b, why)
            continue
        for d in devices:
            if d not in entries[b].devices:
                plan.skip(f"{b} on {d}", f"{b} runs on {', '.join(entries[b].devices)} tensors only")
                continue
            if d == "cuda" and gpu_count == 0:
                plan.skip(f"{b} on cuda", "no CUDA GPU is visible here")
                continue
            for n in nprocs:
                why = gpu_problem(b, n, gpu_count, ranks_on_one_host(n)) if d == "cuda" else None
                if why:
                    plan.skip(f"{b} on cuda with {n} ranks", why)
                    continue
                for dt in dtypes:
                    plan.runs.append(Combo(b, d, dt, n))
    return plan


def gpu_count() -> int:
    try:
        import torch
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except ImportError:
        return 0
