"""Where a plan's chunks lie in memory, for one message size, in 4-byte words.

The executor's arithmetic (docs/plans.md), so a chunk index means here what it means on a GPU:
- the message size is the input's bytes, the output's for allgather; each rank's input and output
  sizes follow from the collective, and must split into its chunk counts in whole alignment units;
- one chunk size per rank (input bytes / input chunks, or output's), for every buffer, scratch too;
- a thread-block group's member takes its share of a reference, split in alignment units;
- in-place layouts alias: allreduce and alltoall read and write one buffer, allgather's input is
  the output's own slice, reducescatter's output the input's own slice;
- LL packets: a payload at byte offset o of a packet buffer lies at byte 2*o, each 4-byte word of
  data followed by its 4-byte flag; with a double scratch buffer, odd-numbered runs use the first
  half of scratch and even ones the second.

Each rank's buffers sit in one "arena" of words (aliases share words), which is what the
interpreter's memory and the race detector's address space are.
"""
from __future__ import annotations

from dataclasses import dataclass

from .format import Plan, PlanError, Ref, smallest_size  # noqa: F401 (its callers import it here)

WORD = 4


def message_sizes(plan: Plan, size: int) -> tuple[int, int]:
    """(input bytes, output bytes) of each rank for a message of `size` bytes, as the executor's
    callers size them (MSCCL++'s executor test)."""
    n = plan.nranks
    c = plan.collective
    if c == "allgather":
        return size // n, size
    if c == "reducescatter":
        return size, size // n
    if c == "test":
        # The DSL's unit-test plans: size is bytes per chunk of the rank with the most.
        return size * plan.ranks[0].input_chunks, size * plan.ranks[0].output_chunks
    return size, size


@dataclass(frozen=True)
class Span:
    """`words` words from word `start` of rank `rank`'s arena; `packets`: a packet range, whose
    payload word j lies at start + 2j and its flag at start + 2j + 1."""

    rank: int
    start: int
    words: int
    packets: bool = False

    @property
    def end(self) -> int:
        return self.start + (2 * self.words if self.packets else self.words)


class Layout:
    """The arenas and the chunk arithmetic of one plan at one message size."""

    def __init__(self, plan: Plan, size: int):
        self.plan = plan
        self.size = size
        a = plan.alignment
        in_b, out_b = message_sizes(plan, size)
        self.in_bytes, self.out_bytes = in_b, out_b
        self.chunk: list[int] = []          # chunk bytes per rank
        self.base: list[dict[str, int]] = []  # word offset of each buffer in the rank's arena
        self.words: list[dict[str, int]] = []  # words of each buffer
        self.arena: list[int] = []
        self.scratch_half: list[int] = []   # words of one half of a double scratch buffer
        for r in plan.ranks:
            if in_b % a or out_b % a or (r.input_chunks and (in_b // a) % r.input_chunks) or \
                    (r.output_chunks and (out_b // a) % r.output_chunks):
                raise PlanError(f"{plan.source}: a {size}-byte {plan.collective} does not split into rank "
                                f"{r.id}'s {r.input_chunks} input / {r.output_chunks} output chunks of whole "
                                f"{a}-byte units: use a multiple of {smallest_size(plan)} bytes")
            if plan.collective == "test":
                chunk = size
            elif r.input_chunks:
                chunk = in_b // r.input_chunks
            elif r.output_chunks:
                chunk = out_b // r.output_chunks
            else:
                raise PlanError(f"{plan.source}: rank {r.id} has neither input nor output chunks")
            if r.input_chunks and r.output_chunks and in_b // r.input_chunks != out_b // r.output_chunks:
                raise PlanError(f"{plan.source}: rank {r.id}'s chunks differ in size between input "
                                f"({in_b} B / {r.input_chunks}) and output ({out_b} B / {r.output_chunks})")
            self.chunk.append(chunk)
            scratch_b = chunk * r.scratch_chunks * (2 if plan.packets else 1)
            half = -(-scratch_b // a) * a
            self.scratch_half.append(half // WORD)
            scratch_b = half * (2 if plan.double_scratch else 1)
            in_w, out_w, s_w = in_b // WORD, out_b // WORD, scratch_b // WORD
            base, words = {}, {"input": in_w, "output": out_w, "scratch": s_w}
            c, inplace = plan.collective, plan.inplace
            if inplace and c in ("allreduce", "alltoall", "broadcast"):
                base["input"] = base["output"] = 0
                total = max(in_w, out_w)
            elif inplace and c == "allgather":
                base["output"] = 0
                base["input"] = r.id * in_w
                total = out_w
            elif inplace and c == "reducescatter":
                base["input"] = 0
                base["output"] = r.id * out_w
                total = in_w
            else:
                base["input"], base["output"] = 0, in_w
                total = in_w + out_w
            base["scratch"] = total
            self.base.append(base)
            self.words.append(words)
            self.arena.append(total + s_w)

    def scratch_offset(self, rank: int, run: int) -> int:
        """Words the executor adds to scratch addresses in run `run` (1-based: its packet flag)."""
        if self.plan.double_scratch and run % 2 == 0:
            return self.scratch_half[rank]
        return 0

    def span(self, issuer: int, ref: Ref, tbg: tuple[int, int], offset: int = 0,
             unit: int | None = None, owner: int | None = None, packets: bool = False,
             scratch_offset: int = 0, where: str = "") -> Span | None:
        """The words `ref` names on rank `owner` (default: the ref's own rank), by the chunk size
        of `issuer`, the rank that runs the op (the executor computes every offset of an op, remote
        ones too, from its own rank's chunks); the group member's share; the pipeline window
        [offset, offset + unit) bytes; then packet doubling and the run's scratch half. None when
        the window is empty (a pipeline's last partial round). Past the buffer: OutOfRange."""
        return self._span(ref, self.chunk[issuer], tbg, offset, unit, owner, packets, scratch_offset, where)

    def _span(self, ref, chunk, tbg, offset, unit, owner, packets, scratch_offset, where):
        a = self.plan.alignment
        rank = ref.rank if owner is None else owner
        start_b = ref.index * chunk
        size_b = ref.count * chunk
        part, parts = tbg
        if parts > 1:
            units = size_b // a
            lo = part * (units // parts) + min(part, units % parts)
            hi = (part + 1) * (units // parts) + min(part + 1, units % parts)
            start_b += lo * a
            size_b = (hi - lo) * a
        if unit is not None:
            size_b = min(size_b - offset, unit)
            start_b += offset
            if size_b <= 0:
                return None
        start_w, n_w = start_b // WORD, size_b // WORD
        if packets:
            start_w *= 2
        buf_words = self.words[rank][ref.buffer]
        end_w = start_w + (2 * n_w if packets else n_w)
        # A packet form of input or output must fit the buffer (recpkt's copy, a port ppkt's
        # source): the executor does not make room for it.
        start_w += scratch_offset
        end_w += scratch_offset
        limit = buf_words
        if end_w > limit or start_w < 0:
            raise OutOfRange(f"{where}: {ref.buffer} chunks {ref.index}..{ref.index + ref.count - 1} of rank "
                             f"{rank}{' as packets' if packets else ''} end at word {end_w}, past the "
                             f"buffer's {limit} words ({self.plan.ranks[rank].__dict__[ref.buffer + '_chunks']} "
                             f"chunks)")
        return Span(rank, self.base[rank][ref.buffer] + start_w, n_w, packets)


class OutOfRange(PlanError):
    """An op names chunks beyond its buffer."""
