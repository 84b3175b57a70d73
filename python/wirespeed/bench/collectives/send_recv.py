"""send_recv: a ring exchange, each rank sends its buffer to rank+1 and receives from rank-1 at once
(nccl-tests' sendrecv). busbw factor 1: point to point."""
from ..verifiable import count_wrong, fill, rank_values, to_dtype
from .base import Collective, poison


class SendRecv(Collective):
    name = "send_recv"
    variants = (False,)  # sending and receiving in one buffer at once is meaningless

    def busbw_factor(self, world):
        return 1.0

    def fill_inputs(self, case, bufs):
        poison(bufs.recv)
        fill(bufs.send, case.rank, 0, case.dtype, None, case.world)

    def call(self, case, bufs):
        return "send_recv", (bufs.send, bufs.recv, (case.rank + 1) % case.world, (case.rank - 1) % case.world)

    def wrong(self, case, bufs):
        src = (case.rank - 1) % case.world
        return count_wrong(bufs.recv, lambda off, n: to_dtype(rank_values(
            src, off, n, case.dtype, None, case.world, bufs.recv.device), case.dtype),
            case.dtype, None)


COLLECTIVE = SendRecv()
