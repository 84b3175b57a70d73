"""barrier: no data, latency only (no bandwidth is defined for it, here or in any peer tool)."""
import torch

from .base import Buffers, Collective


class Barrier(Collective):
    name = "barrier"
    variants = (False,)

    def busbw_factor(self, world):
        return 0.0

    def counts(self, nbytes, itemsize, world):
        return 0, 0, 0

    def alloc(self, case):
        empty = torch.empty(0, dtype=case.dtype.torch, device=case.device)
        return Buffers(empty, empty)

    def fill_inputs(self, case, bufs):
        pass

    def call(self, case, bufs):
        return "barrier", ()

    def wrong(self, case, bufs):
        return 0  # a barrier carries no data; a broken one shows as a hang, caught by the timeout


COLLECTIVE = Barrier()
