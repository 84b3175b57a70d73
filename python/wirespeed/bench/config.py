"""The typed configuration of a benchmark run: what the CLI flags (and WIRESPEED_* twins) become."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class BenchConfig:
    collectives: list[str] = field(default_factory=lambda: ["all_reduce"])
    dtypes: list[str] = field(default_factory=lambda: ["float32"])
    ops: list[str] = field(default_factory=lambda: ["sum"])
    sizes: list[int] = field(default_factory=list)
    warmup_iters: int = 5
    iters: int = 20
    backend: str = "gloo"
    device: str = "cpu"
    nproc: int = 2
    root: int = 0
    check: bool = True
    per_op: bool = True        # also time single calls (p50/p99/min/max in records)
    per_op_columns: bool = False  # show p50/p99 of single calls in the table
    timeout_s: float = 300.0
    # Outputs (used on rank 0 only).
    format: str = "table"
    json_path: str | None = None
    csv_path: str | None = None
    plot_path: str | None = None
    save_dir: str | None = "runs"
    progress: bool = True
    host_per_rank: bool = False   # each rank its own host id (NCCL_HOSTID, WIRESPEED_HOSTID)
    plan: str | None = None       # an MSCCL++ execution plan to time instead of the collectives
    trace_path: str | None = None  # bench --trace: every timed call as a span (bench/tracing.py)

    @property
    def tracing(self) -> bool:
        return self.trace_path is not None

