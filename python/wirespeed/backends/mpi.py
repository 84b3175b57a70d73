"""Adapter for MPI through mpi4py (PyPI's torch has no MPI backend), plus the mpirun launcher.

Buffers: the harness's CPU tensors are handed to MPI as raw views of their memory (no copies). The
view of a (address, bytes, type) triple is cached, because building one per call costs a few
microseconds, which is as long as a small shared-memory allreduce; a cached view can never point at
freed memory in use by someone else, since it is only looked up with a live tensor at that address.

Variants are MPI's own: allreduce, allgather and reduce take MPI_IN_PLACE; broadcast is in place by
nature; alltoall and sendrecv are out of place. MPI's in-place reduce_scatter_block leaves the
result at the start of the buffer, not at the rank's slice as NCCL's layout has it, so that variant
is reported n/a rather than timed with an extra copy.

float16 and bfloat16, which MPI has no types or reductions for, travel as 16-bit words and are
reduced by user-defined ops (see `reduce16`). avg, which MPI lacks, is a sum followed by a division
on this rank, and the division is inside the timed call: that is what avg costs a user of MPI.

MPI has no timeouts: a peer that hangs is caught by the harness watchdog, which ends the rank, and
mpirun then ends the job. A rank that fails exits without MPI_Finalize (mpi4py.rc.finalize off), so
mpirun ends the job at once instead of the survivors waiting in a collective for it.
"""
from __future__ import annotations

import os
import shutil
from functools import partial

import torch

from ..errors import UsageError
from ..launch.mpirun import HOW_TO_GET
from .base import Backend, RankInfo



def missing() -> str | None:
    """None when the mpi backend can run here, else why not and what to do. Never initializes MPI
    (importing mpi4py.MPI would, and a launcher process must not become an MPI singleton)."""
    import importlib.util
    if importlib.util.find_spec("mpi4py") is None:
        return "mpi4py is not installed: " + HOW_TO_GET
    if shutil.which("mpirun") is None and "OMPI_COMM_WORLD_RANK" not in os.environ:
        return "mpirun is not on PATH: " + HOW_TO_GET
    return None


# ---------------------------------------------------------------------------------------------------
# 16-bit float reductions


_TORCH16 = {"float16": torch.float16, "bfloat16": torch.bfloat16}


def reduce16(dtype: str, op: str):
    """The body of an MPI user op for a 16-bit float: inout = op(in, inout), element by element.

    torch's CPU kernels for float16/bfloat16 widen each element to float32, combine, and round once
    back to 16 bits (round to nearest even), without float32 temporaries the size of the buffer.
    float32 has at least 2p+2 significand bits for both formats (24 >= 2*11+2 and 2*8+2), so that
    double rounding gives the same bits as rounding the exact sum or product once: every step is
    correctly rounded. tests/mpi/test_reduce16.py checks this bit for bit against an exact reference,
    so a torch that computed in 16 bits would be caught."""
    tdt = _TORCH16[dtype]
    kernel = {"sum": torch.add, "prod": torch.mul, "min": torch.minimum, "max": torch.maximum}[op]

    def combine(inbuf, inoutbuf, _datatype):
        if len(inbuf) == 0:  # MPI may call it on empty pieces; torch.frombuffer refuses those
            return
        b = torch.frombuffer(inoutbuf, dtype=tdt)
        kernel(torch.frombuffer(inbuf, dtype=tdt), b, out=b)

    return combine


# ---------------------------------------------------------------------------------------------------
# The adapter


_MPI_TYPES = {"float32": "FLOAT", "float64": "DOUBLE", "int8": "INT8_T", "uint8": "UINT8_T",
              "int32": "INT32_T", "int64": "INT64_T", "float16": "UINT16_T", "bfloat16": "UINT16_T"}
_MPI_OPS = {"sum": "SUM", "prod": "PROD", "min": "MIN", "max": "MAX", "avg": "SUM"}
_DTYPE_NAME = {getattr(torch, n): n for n in _MPI_TYPES}


class MpiBackend(Backend):
    name = "mpi"

    def __init__(self):
        self._comm = None
        self._MPI = None
        self._views: dict = {}
        self._user_ops: dict = {}

    def init(self, info: RankInfo, device: str, timeout_s: float) -> None:
        from ..launch.environment import launcher_name
        kind = launcher_name()
        if info.world_size > 1 and kind not in ("mpirun", "pmi", "srun"):
            raise UsageError(f"the mpi backend needs its ranks started by an MPI launcher, but these "
                             f"were started by {kind or 'hand'}: run `wirespeed bench --backend mpi "
                             f"-N {info.world_size}` (it starts mpirun itself) or put mpirun in front")
        import mpi4py
        mpi4py.rc.finalize = False  # see the module docstring: failing ranks must not finalize
        mpi4py.rc.thread_level = "funneled"  # only the main thread calls MPI (the watchdog never)
        from mpi4py import MPI
        self._MPI = MPI
        self._comm = MPI.COMM_WORLD
        if (self._comm.Get_size(), self._comm.Get_rank()) != (info.world_size, info.rank):
            raise UsageError(f"MPI says this is rank {self._comm.Get_rank()} of {self._comm.Get_size()} "
                             f"but the launcher environment says rank {info.rank} of "
                             f"{info.world_size}: this mpi4py is built for another MPI than the "
                             "mpirun that started it (reinstall mpi4py against Open MPI)")

    def shutdown(self) -> None:
        if self._comm is None:
            return
        for op in self._user_ops.values():
            op.Free()
        self._user_ops.clear()
        self._views.clear()
        self._comm.Barrier()
        if not self._MPI.Is_finalized():
            self._MPI.Finalize()
        self._comm = None

    def version(self) -> str:
        from mpi4py import MPI
        return MPI.Get_library_version().strip().splitlines()[0].split(",")[0]

    def device_for(self, info, device):
        return "cpu"

    def unsupported(self, collective, dtype, op, inplace, device, world=None):
        if device != "cpu":
            return "mpi: cpu only"
        if collective in ("all_to_all", "send_recv", "barrier") and inplace:
            return "n/a"
        if collective == "broadcast" and not inplace:
            return "n/a"  # MPI_Bcast has one buffer
        if collective == "reduce_scatter" and inplace:
            return "n/a (MPI's in-place result lands at offset 0)"
        return None

    # -- buffers and ops -------------------------------------------------------------------------

    def _spec(self, t: torch.Tensor):
        """[memory view, MPI type] of a contiguous CPU tensor, without copying it."""
        key = (t.data_ptr(), t.numel(), t.dtype)
        spec = self._views.get(key)
        if spec is None:
            if not t.is_contiguous() or t.device.type != "cpu":
                raise ValueError("the mpi backend takes contiguous CPU tensors only")
            MPI = self._MPI
            mem = MPI.buffer.fromaddress(t.data_ptr(), t.numel() * t.element_size())
            # No explicit count: mpi4py derives it from the length, and for gathers and scatters
            # splits it into per-rank blocks (an explicit count would mean "per rank" there).
            spec = [mem, getattr(MPI, _MPI_TYPES[_DTYPE_NAME[t.dtype]])]
            if len(self._views) >= 16:  # a handful of live buffers per case; never grows unbounded
                self._views.clear()
            self._views[key] = spec
        return spec

    def _op(self, t: torch.Tensor, op: str):
        dtype = _DTYPE_NAME[t.dtype]
        if dtype not in _TORCH16:
            return getattr(self._MPI, _MPI_OPS[op])
        base = "sum" if op == "avg" else op
        key = (dtype, base)
        if key not in self._user_ops:
            self._user_ops[key] = self._MPI.Op.Create(reduce16(dtype, base), commute=True)
        return self._user_ops[key]

    def _average(self, t: torch.Tensor, op: str) -> None:
        """avg = sum / world size, divided here (MPI has no avg). Integer data divides truncating."""
        if op != "avg":
            return
        n = self._comm.Get_size()
        t.div_(n, rounding_mode=None if t.dtype.is_floating_point else "trunc")

    @staticmethod
    def _aliases(send: torch.Tensor, recv: torch.Tensor) -> bool:
        return send.untyped_storage().data_ptr() == recv.untyped_storage().data_ptr()

    # -- bound calls (a timed loop's) -------------------------------------------------------------

    def bind(self, name, *args):
        """mpi4py's call with its buffer views, op and MPI_IN_PLACE resolved once (each method below
        looks them up per call: ~0.5 us, a tenth of a small shared-memory allreduce). The tensors
        ride on the bound call, so its raw views never outlive the memory they point at."""
        make = getattr(self, "_bind_" + name, None)
        if make is None:
            return super().bind(name, *args)
        call = make(*args)
        call.keep = args
        return call

    def _averaged(self, call, recv, op):
        if op != "avg":
            return call

        def then_average():
            call()
            self._average(recv, op)
        return then_average

    def _bind_all_reduce(self, send, recv, op):
        first = self._MPI.IN_PLACE if send is recv else self._spec(send)
        return self._averaged(partial(self._comm.Allreduce, first, self._spec(recv), self._op(recv, op)),
                              recv, op)

    def _bind_all_gather(self, send, recv):
        # the harness's in-place layout: send is my slice of recv
        first = self._MPI.IN_PLACE if self._aliases(send, recv) else self._spec(send)
        return partial(self._comm.Allgather, first, self._spec(recv))

    def _bind_reduce_scatter(self, send, recv, op):
        return self._averaged(partial(self._comm.Reduce_scatter_block, self._spec(send), self._spec(recv),
                                      self._op(recv, op)), recv, op)

    def _bind_broadcast(self, send, recv, root):
        return partial(self._comm.Bcast, self._spec(recv), root)

    def _bind_reduce(self, send, recv, op, root):
        mop, me = self._op(recv, op), self._comm.Get_rank()
        if send is recv:
            args = (self._MPI.IN_PLACE if me == root else self._spec(send),
                    self._spec(recv) if me == root else None, mop, root)
        else:
            args = (self._spec(send), self._spec(recv), mop, root)
        call = partial(self._comm.Reduce, *args)
        return self._averaged(call, recv, op) if me == root else call

    def _bind_all_to_all(self, send, recv):
        return partial(self._comm.Alltoall, self._spec(send), self._spec(recv))

    def _bind_send_recv(self, send, recv, to, frm):
        return partial(self._comm.Sendrecv, self._spec(send), to, 0, self._spec(recv), frm, 0)

    def _bind_barrier(self):
        return partial(self._comm.Barrier)

    # -- the collectives -------------------------------------------------------------------------

    # Each one call of its bound form above, resolved for this call alone: one translation of
    # the arguments, whether a timed loop binds it once or a caller makes a single call.

    def all_reduce(self, send, recv, op):
        self._bind_all_reduce(send, recv, op)()

    def all_gather(self, send, recv):
        self._bind_all_gather(send, recv)()

    def reduce_scatter(self, send, recv, op):
        self._bind_reduce_scatter(send, recv, op)()

    def broadcast(self, send, recv, root):
        self._bind_broadcast(send, recv, root)()

    def reduce(self, send, recv, op, root):
        self._bind_reduce(send, recv, op, root)()

    def all_to_all(self, send, recv):
        self._bind_all_to_all(send, recv)()

    def send_recv(self, send, recv, to, frm):
        self._bind_send_recv(send, recv, to, frm)()

    def barrier(self):
        self._comm.Barrier()

    def allgather_floats(self, values):
        import numpy as np
        mine = np.asarray(values, dtype=np.float64)
        out = np.empty((self._comm.Get_size(), len(values)), dtype=np.float64)
        self._comm.Allgather(mine, out)
        return out.tolist()
