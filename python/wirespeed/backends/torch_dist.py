"""Adapter for any torch.distributed backend (gloo, nccl, and wirespeed's own once registered).

torch.distributed's API fixes which variants exist: all_reduce, broadcast and reduce are in place
only; all_to_all and send/recv out of place only. Those gaps show as 'n/a', never as a timed copy.
"""
from __future__ import annotations

import datetime
from functools import partial

import torch
import torch.distributed as dist

from .base import Backend, RankInfo

_OPS = {"sum": "SUM", "prod": "PRODUCT", "min": "MIN", "max": "MAX", "avg": "AVG"}
_INPLACE_ONLY = {"all_reduce", "broadcast", "reduce"}
_OUT_OF_PLACE_ONLY = {"all_to_all", "send_recv", "barrier"}


class TorchDistBackend(Backend):
    def __init__(self, name: str):
        self.name = name
        self._device = "cpu"

    def init(self, info: RankInfo, device: str, timeout_s: float) -> None:
        self._device = self.device_for(info, device)
        if self._device.startswith("cuda"):
            torch.cuda.set_device(self._device)
        from .rendezvous import roll_call_store
        store = roll_call_store(info, timeout_s)  # names the ranks that never came, in time
        dist.init_process_group(
            self.name, store=store, rank=info.rank,
            world_size=info.world_size, timeout=datetime.timedelta(seconds=timeout_s),
            **({"device_id": torch.device(self._device)} if self._device.startswith("cuda") else {}))

    def shutdown(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()

    def version(self) -> str:
        if self.name == "nccl" and torch.cuda.is_available():
            v = torch.cuda.nccl.version()
            return "nccl " + ".".join(map(str, v)) if isinstance(v, tuple) else f"nccl {v}"
        return f"torch {torch.__version__}"

    def unsupported(self, collective, dtype, op, inplace, device, world=None):
        if inplace and collective in _OUT_OF_PLACE_ONLY:
            return "n/a"
        if not inplace and collective in _INPLACE_ONLY:
            return "n/a"
        if collective == "send_recv" and (world or dist.get_world_size()) == 1:
            return "n/a (needs 2 ranks)"  # torch.distributed cannot send to itself
        if self.name == "gloo" and op == "avg" and not dtype.startswith(("float", "bfloat")):
            return "gloo: no integer avg"
        return None

    def synchronize(self) -> None:
        if self._device.startswith("cuda"):
            torch.cuda.synchronize()

    @staticmethod
    def _op(op):
        return getattr(dist.ReduceOp, _OPS[op])

    def bind(self, name, *args):
        # torch.distributed's own function with its arguments bound, no method of ours between the
        # loop and it. Only where the method is this class's: an adapter that changes a call (the
        # tests' fault-injecting ones) has its change timed and checked too.
        make = _BOUND.get(name)
        if make is None or getattr(type(self), name) is not getattr(TorchDistBackend, name):
            return super().bind(name, *args)
        return make(self, *args)

    def all_reduce(self, send, recv, op):
        dist.all_reduce(recv, op=self._op(op))

    def all_gather(self, send, recv):
        dist.all_gather_into_tensor(recv, send)

    def reduce_scatter(self, send, recv, op):
        dist.reduce_scatter_tensor(recv, send, op=self._op(op))

    def broadcast(self, send, recv, root):
        dist.broadcast(recv, src=root)

    def reduce(self, send, recv, op, root):
        dist.reduce(recv, dst=root, op=self._op(op))

    def all_to_all(self, send, recv):
        dist.all_to_all_single(recv, send)

    def send_recv(self, send, recv, to, frm):
        reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, send, to), dist.P2POp(dist.irecv, recv, frm)])
        for r in reqs:
            r.wait()

    def barrier(self):
        dist.barrier()

    def allgather_floats(self, values):
        t = torch.tensor(values, dtype=torch.float64, device=self._device)
        out = torch.empty(dist.get_world_size() * len(values), dtype=torch.float64, device=self._device)
        dist.all_gather_into_tensor(out, t)
        return out.view(dist.get_world_size(), len(values)).cpu().tolist()


# What bind hands the loop: each the very call of the method of the same name above, its
# arguments positional (a partial's keywords cost ~0.1 us a call: a dict built, then unpacked
# through torch's decorators).
_BOUND = {
    "all_reduce": lambda b, send, recv, op: partial(dist.all_reduce, recv, b._op(op)),
    "all_gather": lambda b, send, recv: partial(dist.all_gather_into_tensor, recv, send),
    "reduce_scatter": lambda b, send, recv, op: partial(dist.reduce_scatter_tensor, recv, send, b._op(op)),
    "broadcast": lambda b, send, recv, root: partial(dist.broadcast, recv, root),
    "reduce": lambda b, send, recv, op, root: partial(dist.reduce, recv, root, b._op(op)),
    "all_to_all": lambda b, send, recv: partial(dist.all_to_all_single, recv, send),
    "barrier": lambda b: dist.barrier,
}
