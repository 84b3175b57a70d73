"""reduce: the root ends with the reduction of all ranks' buffers; other ranks' outputs are undefined
and not checked. busbw factor 1."""
from ..verifiable import count_wrong, fill, reduce_values
from .base import Collective, poison


class Reduce(Collective):
    name = "reduce"
    reduces = True
    rooted = True

    def busbw_factor(self, world):
        return 1.0

    def fill_inputs(self, case, bufs):
        fill(bufs.send, case.rank, 0, case.dtype, case.op, case.world)
        if bufs.recv is not bufs.send:
            poison(bufs.recv)

    def call(self, case, bufs):
        return "reduce", (bufs.send, bufs.recv, case.op, case.root)

    def wrong(self, case, bufs):
        if case.rank != case.root:
            return 0
        seeds = range(case.world)
        return count_wrong(bufs.recv, lambda off, n: reduce_values(
            seeds, off, n, case.dtype, case.op, case.world, bufs.recv.device), case.dtype, case.op)


COLLECTIVE = Reduce()
