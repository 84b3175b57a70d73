"""all_reduce: every rank ends with the reduction of all ranks' buffers. busbw factor 2(n-1)/n."""
from ..verifiable import count_wrong, fill, reduce_values
from .base import Collective, poison


class AllReduce(Collective):
    name = "all_reduce"
    reduces = True

    def busbw_factor(self, world):
        return 2 * (world - 1) / world

    def fill_inputs(self, case, bufs):
        fill(bufs.send, case.rank, 0, case.dtype, case.op, case.world)
        if bufs.recv is not bufs.send:
            poison(bufs.recv)

    def call(self, case, bufs):
        return "all_reduce", (bufs.send, bufs.recv, case.op)

    def repeat_keeps_result(self, case):
        return not case.inplace or case.op in ("min", "max")  # idempotent on its own output

    def wrong(self, case, bufs):
        seeds = range(case.world)
        return count_wrong(bufs.recv, lambda off, n: reduce_values(
            seeds, off, n, case.dtype, case.op, case.world, bufs.recv.device), case.dtype, case.op)


COLLECTIVE = AllReduce()
