"""`wirespeed plan check`: run a plan in one process and say whether it is right.

Three verdicts, each naming the op at fault (rank, thread block, op index, name):
- the outputs of every rank, chunk by chunk, against the collective's definition, with data
  unique to (rank, element, run) so a misplaced chunk shows where it came from;
- deadlock: a wait no signal can satisfy (interpret.Deadlock names every blocked op);
- races: accesses the plan's own synchronisation does not order (hazards.py);
plus out-of-range chunks and buffers reached through the wrong channel, which stop the run.

The plan runs `runs` times back to back per rank (interpret.py), so a plan that is right once but
lets one run's writes overtake a peer's previous run is caught too.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .format import Plan, PlanError
from .hazards import HazardTracker
from .interpret import Machine, op_count, thread_count
from .layout import Layout, smallest_size

# What a check may take, so that no plan, --size or --runs makes it run the machine out of memory
# or run for hours. It keeps per word of every rank's buffers the value and the race detector's
# shadow (8 + 24 bytes); per thread (each thread block of each run, each host and proxy) two
# vector clocks as long as there are threads, copied into the tokens threads hand each other
# (about 32 bytes per pair of threads: 320 MB measured for a 32-rank alltoall of 3,104 threads);
# per unrolled step about 200 bytes. It runs some 20-100 us a step.
MEMORY_SHARE = 0.5            # of this machine's physical memory
MAX_CHECK_STEPS = 1_000_000   # steps of all runs together, pipelines unrolled


@dataclass
class ChunkVerdict:
    rank: int
    run: int
    chunk: int
    right: bool
    detail: str = ""


@dataclass
class CheckResult:
    plan: Plan
    size: int
    runs: int
    error: str = ""                        # deadlock, range, misuse: the run stopped
    races: list = field(default_factory=list)
    relaxed: list = field(default_factory=list)   # warnings: ordered only through relaxed signals
    between: list = field(default_factory=list)   # warnings: unordered across back-to-back runs
    strict: bool = False                          # warnings count as failures
    notes: list[str] = field(default_factory=list)  # what MSCCL++'s executor would do otherwise
    chunks: list[ChunkVerdict] = field(default_factory=list)
    definition: bool = True                # False: a "test" plan, no collective to compare with

    @property
    def ok(self) -> bool:
        return (not self.error and not self.races and all(c.right for c in self.chunks)
                and not self.plan.over_limits
                and not (self.strict and (self.relaxed or self.between)))

    def lines(self) -> list[str]:
        p = self.plan
        n_tb = sum(len(r.threadblocks) for r in p.ranks)
        n_ops = sum(1 for _ in p.all_ops())
        out = [f"plan {p.name!r}: {p.collective}, {p.protocol}, {p.nranks} ranks, {n_tb} thread blocks, "
               f"{n_ops} ops; run {self.runs}x back to back at {self.size} bytes"]
        if self.error:
            out.append(f"  error: {self.error}")
        for over in self.plan.over_limits[:6]:
            out.append(f"  too big for MSCCL++'s executor: {over}")
        by_rank: dict[int, list[ChunkVerdict]] = {}
        for c in self.chunks:
            by_rank.setdefault(c.rank, []).append(c)
        for r, cs in sorted(by_rank.items()):
            wrong = [c for c in cs if not c.right]
            per_run = max(1, len(cs) // max(1, self.runs))
            if not wrong:
                out.append(f"  rank {r}: {per_run} output chunk(s) right in every run")
            else:
                out.append(f"  rank {r}: {len(wrong)} of {len(cs)} chunk results wrong")
                for c in wrong[:4]:
                    out.append(f"    run {c.run}, output chunk {c.chunk}: {c.detail}")
        if not self.definition:
            out.append("  outputs not compared: a \"test\" plan defines no collective (deadlocks, races and "
                       "ranges checked)")
        for race in self.races:
            out.append(f"  {race}")
        for warn in self.relaxed + self.between:
            out.append(f"  warning: {warn}")
        for note in self.notes:
            out.append(f"  note: {note}")
        if not self.races and not self.error:
            out.append("  races: none (every conflicting access ordered by the plan's signals, waits, "
                       "barriers, semaphores or packet flags)")
        out.append("OK" if self.ok else "WRONG")
        return out


def input_values(nranks: int, words: int):
    """Input data unique to (rank, word, run), exact in float64 sums: 1 + word + R*(rank + n*(run-1))."""
    R = 1 << max(1, int(words).bit_length())

    def make(rank: int, run: int, n: int) -> np.ndarray:
        return 1.0 + np.arange(n) + R * (rank + nranks * (run - 1))

    def decode(v: float) -> str:
        if v == 0:
            return "zeros (never written)"
        q, word = divmod(int(v) - 1, R)
        if v != int(v) or q >= nranks * 64:
            return "a value no input holds (a wrong sum?)"
        return f"rank {q % nranks}'s input word {word} of run {q // nranks + 1}"
    return make, decode, R


def expected(plan: Plan, rank: int, ins: list[np.ndarray], out_words: int) -> np.ndarray | None:
    """The collective's definition for `rank`, from every rank's input of one run."""
    n, c = plan.nranks, plan.collective
    if c == "allreduce":
        return np.sum(ins, axis=0)
    if c == "allgather":
        return np.concatenate(ins)
    if c == "reducescatter":
        s = out_words
        return np.sum([x[rank * s:(rank + 1) * s] for x in ins], axis=0)
    if c == "alltoall":
        s = out_words // n
        return np.concatenate([ins[j][rank * s:(rank + 1) * s] for j in range(n)])
    return None


def default_size(plan: Plan, cap: int = 64 << 20) -> int:
    """Twice the smallest size the chunks allow; for a plan with pipelines, doubled until every
    pipeline runs at least two rounds (a round boundary is where a pipelined plan goes wrong)."""
    size = smallest_size(plan) * 2
    pipes = [op for op in plan.all_ops() if op.name == "pipeline"]
    while pipes and size < cap:
        layout = Layout(plan, size)
        if all(op.pipeline_chunks * layout.chunk[op.rank] > op.unit_size for op in pipes):
            break
        size *= 2
    return size


def physical_memory() -> int:
    import os
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def memory_needed(plan: Plan, layout: Layout, runs: int) -> int:
    """Bytes a check of the plan at this layout's size takes, about (see MEMORY_SHARE)."""
    threads = thread_count(plan, runs)
    return 32 * sum(layout.arena) + 32 * threads * threads + 200 * op_count(plan, layout) * runs


def affordable(plan: Plan, layout: Layout, runs: int, memory: int | None = None,
               max_steps: int = MAX_CHECK_STEPS) -> None:
    """A PlanError naming the limit when a check at this layout's size would take more than
    `memory` bytes (default: MEMORY_SHARE of this machine's) or more than `max_steps` steps."""
    from ..sizes import human_bytes
    at = f"{plan.source}: checking {plan.nranks} ranks at {layout.size} bytes x {runs} run{'s' if runs > 1 else ''}"
    steps = op_count(plan, layout) * runs
    if steps > max_steps:
        raise PlanError(f"{at} runs {steps} steps (pipelines unrolled), more than the {max_steps} a check "
                        "runs (MAX_CHECK_STEPS): check at a smaller --size or fewer --runs")
    if memory is None:
        total = physical_memory()
        memory, share = int(total * MEMORY_SHARE), f"{MEMORY_SHARE:.0%} of this machine's {human_bytes(total)}"
    else:
        share = "the limit given"
    need = memory_needed(plan, layout, runs)
    if need > memory:
        raise PlanError(f"{at} needs about {human_bytes(need)} of memory ({sum(layout.arena)} words of buffers, "
                        f"vector clocks of {thread_count(plan, runs)} threads), more than {human_bytes(memory)}, "
                        f"{share} (MEMORY_SHARE): check at a smaller --size, fewer --runs or on fewer ranks")


def check(plan: Plan, size: int | None = None, runs: int = 2, race_limit: int = 20,
          strict: bool = False, memory: int | None = None, max_steps: int = MAX_CHECK_STEPS) -> CheckResult:
    """Run the plan `runs` times at `size` bytes (default_size) and judge it. A check that would
    take more than `memory` bytes (default: MEMORY_SHARE of this machine's) or `max_steps` steps
    is refused first (PlanError), before anything is allocated."""
    size = size or default_size(plan)
    layout = Layout(plan, size)
    affordable(plan, layout, runs, memory, max_steps)
    result = CheckResult(plan, size, runs, definition=plan.collective != "test", strict=strict)
    flushes = [op.where for op in plan.all_ops() if op.name == "flush"]
    if flushes:
        result.notes.append(f"{flushes[0]}{' and more' if len(flushes) > 1 else ''}: checked as a flush; "
                            "MSCCL++'s executor at 1f5f065d flushes nothing for a standalone flush op "
                            "(docs/plans.md): end a channel's puts with pwsf to be right there too")
    max_in = max(layout.words[r]["input"] for r in range(plan.nranks)) or 1
    make, decode, _ = input_values(plan.nranks, max_in)
    inputs: dict[tuple, np.ndarray] = {}

    def feed(rank, run, words):
        inputs[(rank, run)] = make(rank, run, words)
        return inputs[(rank, run)]

    tracker = HazardTracker(layout.arena, limit=race_limit)
    m = Machine(plan, layout, runs=runs, data=True, observer=tracker, inputs=feed)
    try:
        m.run()
    except PlanError as e:
        result.error = str(e).split(": ", 1)[1] if str(e).startswith(plan.source + ": ") else str(e)
    result.races = tracker.races
    result.relaxed = tracker.relaxed
    result.between = tracker.between
    if result.error:
        return result
    for res in m.results:
        r, run, out = res["rank"], res["run"], res["output"]
        ins = [inputs[(j, run)] for j in range(plan.nranks)]
        chunk_w = layout.chunk[r] // 4
        if plan.collective == "sendrecv" or plan.collective == "broadcast":
            want, detail = _from_one_peer(plan, r, ins, out)
        else:
            want = expected(plan, r, ins, len(out))
            detail = ""
        if want is None:
            continue
        for ci in range(max(1, len(out) // max(1, chunk_w))):
            lo, hi = ci * chunk_w, min(len(out), (ci + 1) * chunk_w)
            got, exp = out[lo:hi], want[lo:hi]
            if np.array_equal(got, exp):
                result.chunks.append(ChunkVerdict(r, run, ci, True))
                continue
            bad = int(np.argmax(got != exp))
            result.chunks.append(ChunkVerdict(
                r, run, ci, False, detail or f"word {lo + bad} holds {decode(got[bad])}, "
                f"should hold {_describe(plan, exp[bad], decode)}"))
    return result


def _describe(plan, v, decode) -> str:
    if plan.collective in ("allreduce", "reducescatter"):
        return f"the sum over ranks ({v:.0f})"
    return decode(v)


def _from_one_peer(plan: Plan, rank: int, ins, out):
    """sendrecv and broadcast name no peer in the plan's header: the output must be, whole, one
    other rank's input (sendrecv: a different one per rank; broadcast: the root's)."""
    for j, x in enumerate(ins):
        if len(x) == len(out) and np.array_equal(out, x) and (j != rank or plan.collective == "broadcast"):
            return out, ""
    return np.full(len(out), np.nan), "is not, whole, any other rank's input of this run"
