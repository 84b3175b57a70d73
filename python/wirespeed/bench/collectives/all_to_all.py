"""all_to_all: rank r's chunk j goes to rank j, landing at chunk r. Size column = one rank's send
buffer (count x n); busbw factor (n-1)/n, since 1/n of the data stays local."""
from ..verifiable import count_wrong, fill, gathered_values
from .base import Collective, poison


class AllToAll(Collective):
    name = "all_to_all"
    variants = (False,)  # nccl-tests times in place too but cannot validate it; no backend here has it

    def busbw_factor(self, world):
        return (world - 1) / world

    def counts(self, nbytes, itemsize, world):
        per_peer = nbytes // itemsize // world
        return per_peer * world, per_peer * world, per_peer * world

    def fill_inputs(self, case, bufs):
        poison(bufs.recv)
        fill(bufs.send, case.rank, 0, case.dtype, None, case.world)

    def call(self, case, bufs):
        return "all_to_all", (bufs.send, bufs.recv)

    def wrong(self, case, bufs):
        c, dev = case.send_count // case.world, bufs.recv.device  # elements per peer
        # Chunk `src` of my output is chunk `rank` of src's input.
        return count_wrong(bufs.recv, lambda off, n: gathered_values(
            c, case.rank * c, off, n, case.dtype, case.world, dev), case.dtype, None)


COLLECTIVE = AllToAll()
