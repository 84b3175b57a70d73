"""What `wirespeed model` runs: the strategies, their settings, and what is refused before any
rank starts (each rank checks too, for outer launchers)."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import UsageError

STRATEGIES = ("allreduce", "reduce-broadcast", "sharded-ps", "async-ps")


@dataclass
class ModelConfig:
    strategies: list[str] = field(default_factory=lambda: ["allreduce"])
    bucket_mode: str = "ddp"
    bucket_bytes: int = 25 << 20
    bucket_label: str = "25"
    servers: int | None = None       # None: world size for sharded-ps, 1 for async-ps
    optimizer: bool = False
    overlap: bool = False
    dtype: str = "float32"
    backend: str = "gloo"
    device: str = "cpu"
    nproc: int = 2
    warmup_iters: int = 2
    iters: int = 10
    timeout_s: float = 300.0
    json_path: str | None = None


def parse_strategies(text: str) -> list[str]:
    names = list(STRATEGIES) if text.strip() == "all" else [t.strip() for t in text.split(",") if t.strip()]
    for n in names:
        if n not in STRATEGIES:
            raise UsageError(f"unknown strategy {n!r}: choose from {', '.join(STRATEGIES)} or all")
    if not names:
        raise UsageError("no strategy given: use e.g. --strategy allreduce or --strategy all")
    return names


def servers_for(strategy: str, cfg: ModelConfig, world: int) -> int:
    if strategy == "async-ps":
        s = cfg.servers if cfg.servers is not None else 1
        if not 1 <= s < world:
            raise UsageError(f"async-ps needs at least one server and one worker: --servers {s} "
                             f"with {world} ranks (use -N {s + 1} or more, or fewer --servers)")
        return s
    if strategy == "sharded-ps":
        s = cfg.servers if cfg.servers is not None else world
        if not 1 <= s <= world:
            raise UsageError(f"--servers {s} is not between 1 and the {world} ranks")
        return s
    return 0


def validate(cfg: ModelConfig, world: int) -> None:
    """Refuse, before any rank starts, what cannot run (each rank calls it too, for outer launchers)."""
    for s in cfg.strategies:
        servers_for(s, cfg, world)
    if "async-ps" in cfg.strategies and (cfg.backend != "gloo" or cfg.device != "cpu"):
        raise UsageError("async-ps runs on --backend gloo --device cpu only (it needs receives from "
                         "any source); leave it out of --strategy for other backends")
    if cfg.overlap and "allreduce" not in cfg.strategies:
        raise UsageError("--overlap times DDP's pattern: it needs --strategy allreduce")


@dataclass
class BatchingConfig:
    """What `wirespeed batching` runs: one dtype, the call counts, the ranks, and where rank 0 writes."""
    dtype: object                    # a bench.dtypes.DType
    chunks: list[int]
    backend: str
    device: str
    nproc: int
    warmup: int
    iters: int
    timeout: float
    json_path: str | None = None
    plot_path: str | None = None


@dataclass
class ObjectsConfig:
    """What `wirespeed objects` runs: the world sizes, the ranks, and where rank 0 writes
    (`records_to`: a world size's records handed back to the shell that started it)."""
    worlds: list[int]
    backend: str
    device: str
    iters: int
    timeout: float
    warmup: int
    json_path: str | None = None
    records_to: str | None = None
