"""An MSCCL++ execution plan as a collective of the harness (`wirespeed bench --plan PLAN.json`).

A call is one execution of the plan (plans/execute.py) on this rank. Everything else is the
plan's collective's own module: its counts, busbw factor, verifiable inputs and check, so the
plan is timed and checked exactly as wirespeed's own all_reduce or gloo's. The buffers the
harness fills and checks are the plan's input and output buffers themselves, views into the
rank's shared-memory arena, aliased as the plan's in-place layout aliases them: a timed call
copies nothing in or out.

Sizes: a plan splits a message into chunks of whole alignment units, so a size of the sweep is
rounded up to a multiple of the smallest size the plan splits (layout.smallest_size); sizes that
round to one already in the sweep are run once, and sizes outside the plan's min/max message
size are skipped. `notes` says what was changed, for the run's header.
"""
from __future__ import annotations

import torch

from ...errors import UsageError
from .base import Buffers, Case, Collective

# The plan's collective -> the harness's module of it.
BENCH_NAMES = {"allreduce": "all_reduce", "allgather": "all_gather", "reducescatter": "reduce_scatter",
               "alltoall": "all_to_all", "sendrecv": "send_recv", "broadcast": "broadcast"}


# The steps one call of the plan makes, every rank's thread blocks together, pipelines unrolled
# (each rank unrolls them all): beyond it a size of the sweep is refused before any rank starts.
MAX_CALL_STEPS = 1_000_000
# What the check behind warn_if_racy may take in the launching process: a plan beyond it is not
# checked there (`wirespeed plan check` checks it in full).
RACE_CHECK_MEMORY = 512 << 20
RACE_CHECK_STEPS = 200_000


def load_plan(path: str):
    """The plan of `bench --plan`; whatever is wrong with the file or the plan is one UsageError
    line (plans/format.py), raised where the command starts, before any rank does."""
    from ...plans.format import load
    plan = load(path)
    if plan.collective not in BENCH_NAMES:
        raise UsageError(f"{path}: a {plan.collective!r} plan defines no collective to time and check: "
                         f"bench runs plans of {', '.join(BENCH_NAMES)}")
    return plan


def race_warning(plan) -> str | None:
    """What `wirespeed plan check` finds wrong with the plan's order (races, a deadlock, a chunk
    out of range), as one line; None when it finds nothing or the plan is too big to check here."""
    from ...plans.check import check
    from ...plans.format import PlanError
    try:
        result = check(plan, memory=RACE_CHECK_MEMORY, max_steps=RACE_CHECK_STEPS)
    except PlanError:
        return None
    if result.error:
        return f"{plan.source}: `wirespeed plan check` stops this plan: {result.error}"
    if result.races:
        n = len(result.races)
        return (f"{plan.source}: `wirespeed plan check` finds {n}{' or more' if n >= 20 else ''} race(s) in "
                f"this plan, so its results may be wrong on some calls: {result.races[0]}")
    return None


def warn_if_racy(coll: "PlanCollective") -> None:
    """One line on stderr when the plan of `bench --plan` races (race_warning); the run goes on.
    The launching process calls it once, before it starts the ranks."""
    import sys

    warning = race_warning(coll.plan)
    if warning:
        sys.stderr.write(f"wirespeed: warning: {warning}\n")
        sys.stderr.flush()


class PlanCollective(Collective):
    def __init__(self, path: str, timeout_s: float):
        from . import COLLECTIVES
        self.path = path
        self.plan = load_plan(path)
        self.inner: Collective = COLLECTIVES[BENCH_NAMES[self.plan.collective]]
        self.name = f"plan {self.plan.name}"   # what the backend is asked about: no library variant
        self.reduces = self.inner.reduces
        self.rooted = self.inner.rooted
        self.variants = (self.plan.inplace,)
        self.timeout_s = timeout_s
        self.job = None
        self.notes: list[str] = []

    # ---- the job ----
    def begin(self, backend, info) -> None:
        import torch.distributed as dist
        from ...plans.execute import PlanJob
        self.job = PlanJob(self.plan, self.timeout_s)
        self.job.begin(backend, info.rank, info.world_size, dist.distributed_c10d._get_default_store())

    def end(self) -> None:
        if self.job is not None:
            self.job.close()
            self.job = None

    def record_fields(self) -> dict:
        return {"collective": self.inner.name, "plan": self.plan.name, "plan_file": self.path}

    # ---- sizes ----
    def sizes(self, sizes: list[int]) -> list[int]:
        from ...plans.interpret import op_count
        from ...plans.layout import Layout, smallest_size
        from ...sizes import format_size
        unit = smallest_size(self.plan)
        out, moved, skipped = [], [], []
        for s in sizes:
            r = max(unit, -(-s // unit) * unit)
            if not self.plan.min_size <= r <= self.plan.max_size:
                skipped.append(s)
                continue
            if r != s:
                moved.append(f"{s}->{r}")
            if r not in out:
                out.append(r)
        for i, r in enumerate(out):
            steps = op_count(self.plan, Layout(self.plan, r))
            if steps > MAX_CALL_STEPS:
                fits = f"use -e {format_size(out[i - 1])}" if i else "use smaller sizes"
                raise UsageError(f"{self.path}: at {format_size(r)} the plan's pipelines unroll into {steps} "
                                 f"steps a call, more than the {MAX_CALL_STEPS} wirespeed runs (MAX_CALL_STEPS): "
                                 f"{fits}")
        self.notes = []
        if moved:
            self.notes.append(f"sizes rounded up to multiples of {unit} bytes (the plan's chunks): "
                              + ", ".join(moved[:6]) + (" ..." if len(moved) > 6 else ""))
        if skipped:
            self.notes.append(f"sizes outside the plan's {self.plan.min_size}..{self.plan.max_size} bytes "
                              f"skipped: {', '.join(map(str, skipped[:6]))}")
        return out

    # ---- one size ----
    def busbw_factor(self, world):
        return self.inner.busbw_factor(world)

    def counts(self, nbytes, itemsize, world):
        return self.inner.counts(nbytes, itemsize, world)

    def alloc(self, case: Case) -> Buffers:
        m = self.job.prepare(case.nbytes)
        lay, r = m.layout, case.rank
        arena = torch.from_numpy(m.mem[r])
        (ib, iw), (ob, ow) = ((lay.base[r][b], lay.words[r][b]) for b in ("input", "output"))
        # In place, one buffer is a view into the other, as the harness's own modules lay them out
        # (all_reduce: the same tensor; all_gather: the input is the output's slice; reduce_scatter:
        # the output is the input's).
        if (ib, iw) == (ob, ow):
            send = recv = arena[ob:ob + ow]
        elif ob <= ib and ib + iw <= ob + ow:
            recv = arena[ob:ob + ow]
            send = recv[ib - ob:ib - ob + iw]
        elif ib <= ob and ob + ow <= ib + iw:
            send = arena[ib:ib + iw]
            recv = send[ob - ib:ob - ib + ow]
        else:
            send, recv = arena[ib:ib + iw], arena[ob:ob + ow]
        if send.numel() != case.send_count or recv.numel() != case.recv_count:
            raise UsageError(f"{self.path}: the plan's buffers ({iw} and {ow} words) are not the "
                             f"{case.collective}'s ({case.send_count} and {case.recv_count})")
        return Buffers(send, recv)

    def fill_inputs(self, case, bufs):
        self.inner.fill_inputs(case, bufs)

    def poison_outputs(self, case, bufs):
        self.inner.poison_outputs(case, bufs)

    def repeat_keeps_result(self, case):
        return self.inner.repeat_keeps_result(case)

    def run(self, backend, case, bufs):
        self.job.machine.execute_once()

    def bind(self, backend, case, bufs):
        return self.job.machine.execute_once   # the case's machine: alloc (prepare) has set it

    def wrong(self, case, bufs):
        return self.inner.wrong(case, bufs)
