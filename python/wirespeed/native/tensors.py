"""What the wirespeed backend accepts from torch, and how any tensor becomes buffers the engine can use.

The engine moves and reduces flat runs of memory. A collective's tensors are validated here (CPU,
dense), reductions are mapped to the native dtype and op codes, and a tensor whose elements are
not one contiguous run (a transposed or strided view, channels_last, a slice with a step) is
staged: the engine works on a contiguous copy and the result is copied back into the caller's
tensor, in place and whatever its strides, when the op completes. Ranks may pass different layouts
of the same logical tensor, which is why a permuted-but-dense tensor is staged too: element i must
mean the same element on every rank.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from .errors import UnsupportedError

# Native dtype codes (wirespeed-core dtype.rs). Data movement (broadcast, gathers, all_to_all,
# send/recv) takes any dtype as bytes; these are the dtypes a reduction understands.
REDUCE_DTYPES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2, torch.float64: 3,
                 torch.int8: 4, torch.uint8: 5, torch.int32: 6, torch.int64: 7,
                 torch.int16: 8, torch.uint16: 9, torch.uint32: 10, torch.uint64: 11, torch.bool: 12}
_REDUCE_NAMES = ("float32, float16, bfloat16, float64, int8, uint8, int16, uint16, int32, uint32, int64, "
                 "uint64, bool, and complex (sum and avg)")

# Native op codes (dtype.rs); PREMUL_SUM is a sum after scaling a copy of the input here.
_RED = dist.ReduceOp.RedOpType
OP_CODES = {_RED.SUM: 0, _RED.PRODUCT: 1, _RED.MIN: 2, _RED.MAX: 3, _RED.AVG: 4,
            _RED.BAND: 5, _RED.BOR: 6, _RED.BXOR: 7}
OP_NAMES = "sum, prod, min, max, avg, band, bor, bxor, premul_sum"
SUM = dist.ReduceOp.SUM
_FLOATS = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
# A complex tensor reduces (sum, avg) as the pairs of reals it is made of.
_COMPLEX_PARTS = {torch.complex64: torch.float32, torch.complex128: torch.float64,
                  torch.complex32: torch.float16}


def check(t: torch.Tensor, what: str) -> None:
    """A tensor the engine can address: on the CPU, dense. Any strides and any dtype."""
    if not isinstance(t, torch.Tensor):
        raise UnsupportedError(f"wirespeed: {what} is a {type(t).__name__}, not a tensor")
    if not t.is_cpu:
        raise UnsupportedError(f"wirespeed: {what} is on {t.device}; the wirespeed backend handles CPU "
                               "tensors only (use nccl for GPU tensors)")
    if t.layout != torch.strided:
        raise UnsupportedError(f"wirespeed: {what} is {t.layout}; only dense (strided) tensors are supported")


def reduction(t: torch.Tensor, op, what: str) -> tuple[int, int, float | None, int]:
    """(native dtype code, native op code, premul factor or None, element size) for reducing `t`
    with `op`; the engine's element count is the tensor's bytes over that element size.

    Raised here, before anything is sent, for an op the dtype does not define, so every rank
    refuses the same call and the group stays usable. Complex tensors reduce as their real view.
    """
    kind = op.op if hasattr(op, "op") else dist.ReduceOp(op).op
    factor = None
    if kind == _RED.PREMUL_SUM:
        f = getattr(op, "factor", None)
        if f is None:
            raise UnsupportedError("wirespeed: PREMUL_SUM needs its factor: build the op with "
                                   "dist._make_nccl_premul_sum(factor)")
        factor = float(f.item() if isinstance(f, torch.Tensor) else f)
        code = 0
    else:
        code = OP_CODES.get(kind)
        if code is None:
            raise UnsupportedError(f"wirespeed: reduce op {kind.name} is not supported; use {OP_NAMES}")
    dt = t.dtype
    if dt.is_complex:
        if kind not in (_RED.SUM, _RED.AVG, _RED.PREMUL_SUM):
            raise UnsupportedError(f"wirespeed: {kind.name.lower()} is not defined on complex tensors; "
                                   "use sum, avg or premul_sum")
        dt = _COMPLEX_PARTS[dt]
    dcode = REDUCE_DTYPES.get(dt)
    if dcode is None:
        raise UnsupportedError(f"wirespeed: {what} has dtype {t.dtype}; reductions support {_REDUCE_NAMES}")
    if code in (5, 6, 7) and dt in _FLOATS:
        raise UnsupportedError(f"wirespeed: {kind.name.lower()} is defined on integer and bool tensors, "
                               f"not {t.dtype}")
    if dt == torch.bool and code == 4:
        raise UnsupportedError("wirespeed: avg is not defined on bool tensors; use max (any) or min (all)")
    if factor is not None and dt not in _FLOATS:
        raise UnsupportedError(f"wirespeed: premul_sum scales by a float factor; {t.dtype} cannot hold it, "
                               "use sum on a scaled floating-point tensor")
    return dcode, code, factor, dt.itemsize


class Staging:
    """Contiguous stand-ins for the caller's tensors, and what to copy back when the op is done.

    `read` gives memory holding the tensor's values (the tensor itself when it is one contiguous
    run); `write` gives memory to receive into; `update` both. Every buffer handed out is in
    `keep`, the list the backend gives the engine with the op (`keep=`), which holds it until the
    op can no longer touch it. `finish` copies results back into the callers' tensors, whatever
    their strides; `back` says whether there is anything to copy.
    """
    __slots__ = ("back", "keep")

    def __init__(self):
        self.back: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.keep: list[torch.Tensor] = []

    def _own(self, c: torch.Tensor) -> torch.Tensor:
        self.keep.append(c)
        return c

    def read(self, t: torch.Tensor) -> torch.Tensor:
        if t.is_contiguous():
            self.keep.append(t)
            return t
        return self._own(t.contiguous())

    def write(self, t: torch.Tensor) -> torch.Tensor:
        if t.is_contiguous():
            self.keep.append(t)
            return t
        c = self._own(torch.empty(t.shape, dtype=t.dtype))
        self.back.append((t, c))
        return c

    def update(self, t: torch.Tensor) -> torch.Tensor:
        if t.is_contiguous():
            self.keep.append(t)
            return t
        c = self._own(t.contiguous())
        self.back.append((t, c))
        return c

    def scaled(self, t: torch.Tensor, factor: float) -> torch.Tensor:
        """A contiguous copy of t * factor (PREMUL_SUM's input), in t's dtype."""
        return self._own(torch.mul(t, factor).contiguous())

    def result(self, t: torch.Tensor, c: torch.Tensor) -> None:
        """Copy c into t when the op completes (t may be contiguous: c is a scaled copy)."""
        if c is not t:
            self.back.append((t, c))

    def finish(self) -> None:
        """Copy staged results back (once). `keep` is left alone: it is the engine's now."""
        for dst, src in self.back:
            dst.copy_(src)
        self.back = []


def buf(t: torch.Tensor) -> tuple[int, int]:
    """(address, bytes) of a contiguous tensor."""
    return (t.data_ptr(), t.numel() * t.element_size())


def nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()
