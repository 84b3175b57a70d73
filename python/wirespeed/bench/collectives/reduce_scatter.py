"""reduce_scatter: rank r ends with chunk r of the reduction of all ranks' inputs. Size column = the
full input; busbw factor (n-1)/n. In place, each rank's output is its own slice of the input."""
from ..verifiable import count_wrong, fill, reduce_values
from .base import Buffers, Collective, poison


class ReduceScatter(Collective):
    name = "reduce_scatter"
    reduces = True

    def busbw_factor(self, world):
        return (world - 1) / world

    def counts(self, nbytes, itemsize, world):
        per_rank = nbytes // itemsize // world
        return per_rank, per_rank * world, per_rank

    def alloc(self, case):
        import torch
        send = torch.empty(case.send_count, dtype=case.dtype.torch, device=case.device)
        if case.inplace:
            c = case.recv_count
            return Buffers(send, send[case.rank * c:(case.rank + 1) * c])
        return Buffers(send, torch.empty(case.recv_count, dtype=case.dtype.torch, device=case.device))

    def fill_inputs(self, case, bufs):
        if not case.inplace:
            poison(bufs.recv)
        fill(bufs.send, case.rank, 0, case.dtype, case.op, case.world)

    def call(self, case, bufs):
        return "reduce_scatter", (bufs.send, bufs.recv, case.op)

    def wrong(self, case, bufs):
        base = case.rank * case.recv_count
        seeds = range(case.world)
        return count_wrong(bufs.recv, lambda off, n: reduce_values(
            seeds, base + off, n, case.dtype, case.op, case.world, bufs.recv.device), case.dtype, case.op)


COLLECTIVE = ReduceScatter()
