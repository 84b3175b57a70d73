"""Adapter for wirespeed's own backend: torch.distributed with the "wirespeed" backend registered
by wirespeed.native, so the harness drives it exactly as it drives gloo."""
from __future__ import annotations

from .base import RankInfo
from .torch_dist import TorchDistBackend


def missing() -> str | None:
    """None when the native backend can run here, else why not and what to do."""
    try:
        from .. import _native
    except ImportError as e:
        return f"the native module is not built ({e}): run `make setup`"
    if not hasattr(_native, "Group"):
        return "the native module is out of date: run `make setup` to rebuild it"
    return None


class NativeBackend(TorchDistBackend):
    def __init__(self):
        super().__init__("wirespeed")

    def init(self, info: RankInfo, device: str, timeout_s: float) -> None:
        from .. import native  # noqa: F401  (registers "wirespeed" with torch.distributed)
        super().init(info, device, timeout_s)

    def version(self) -> str:
        from .. import _native
        return f"wirespeed-core {_native.core_version()}"
