"""all_gather: every rank ends with all ranks' chunks, rank order. Size column = the full output;
busbw factor (n-1)/n. In place, each rank's input is its own slice of the output."""
from ..verifiable import count_wrong, fill, gathered_values
from .base import Buffers, Collective, poison


class AllGather(Collective):
    name = "all_gather"

    def busbw_factor(self, world):
        return (world - 1) / world

    def counts(self, nbytes, itemsize, world):
        per_rank = nbytes // itemsize // world
        return per_rank, per_rank, per_rank * world

    def alloc(self, case):
        bufs = super().alloc(case)
        if case.inplace:
            c = case.send_count
            return Buffers(bufs.recv[case.rank * c:(case.rank + 1) * c], bufs.recv)
        return bufs

    def fill_inputs(self, case, bufs):
        poison(bufs.recv)
        fill(bufs.send, case.rank, 0, case.dtype, None, case.world)

    def call(self, case, bufs):
        return "all_gather", (bufs.send, bufs.recv)

    def repeat_keeps_result(self, case):
        return True  # each rank's slice is its own input, which the gather writes back unchanged

    def wrong(self, case, bufs):
        c, dev = case.send_count, bufs.recv.device
        return count_wrong(bufs.recv, lambda off, n: gathered_values(
            c, 0, off, n, case.dtype, case.world, dev), case.dtype, None)


COLLECTIVE = AllGather()
