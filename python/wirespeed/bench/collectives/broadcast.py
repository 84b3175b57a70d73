"""broadcast: every rank ends with the root's buffer. busbw factor 1 (the root's link carries it all)."""
from ..verifiable import count_wrong, fill, rank_values, to_dtype
from .base import Collective, poison


class Broadcast(Collective):
    name = "broadcast"
    rooted = True

    def busbw_factor(self, world):
        return 1.0

    def fill_inputs(self, case, bufs):
        poison(bufs.recv)
        if case.rank == case.root:
            fill(bufs.send, case.root, 0, case.dtype, None, case.world)

    def call(self, case, bufs):
        return "broadcast", (bufs.send, bufs.recv, case.root)

    def repeat_keeps_result(self, case):
        return True  # the root's buffer is never written; the others get the same copy again

    def wrong(self, case, bufs):
        return count_wrong(bufs.recv, lambda off, n: to_dtype(rank_values(
            case.root, off, n, case.dtype, None, case.world, bufs.recv.device), case.dtype),
            case.dtype, None)


COLLECTIVE = Broadcast()
