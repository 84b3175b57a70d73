"""When a DDP step communicates: `wirespeed train --timeline`.

The step's figures say how much communication was exposed, not why. The timeline says where in
the step the gradients went out: when the forward pass ended, when the first bucket was handed
to the backend, when the last one came back, and how long some bucket was in the backend's hands
(the union of every bucket's [handed over, done] span), from which the shell derives the rate the
link's bytes moved at while there was something to move (train/shell.py).

DDP's reducer calls the process group from C++, out of Python's sight, so the buckets are caught
with a DDP communication hook that does what DDP's built-in all_reduce does (each bucket divided
by the world size, summed, the average handed back: torch's own `allreduce_hook`), and records
each bucket's times. The hook is the only change to the step; with --timeline the timed steps
run it on every backend alike, so the backends stay comparable with each other (and the records
say it was on). With a comm hook of its own (--comm-hook), that hook does the communication and
the timeline only wraps it, timing its future.

Each timed step's marks and buckets are also kept whole (`steps_raw`, on this process's clock) for
`--trace` (train/tracing.py). FSDP2 has no buckets: with --trace its collectives (the all-gathers
and reduce-scatters it calls through torch.distributed's Python functions, which `train`'s
CallCounter wraps) are kept the same way, each from its call to its Work's completion.
"""
from __future__ import annotations

import threading
import time

# Taken before `wirespeed train` wraps torch.distributed's functions to count bytes: the buckets
# are counted from DDP's plan already (train.wrap), not a second time here.
from torch.distributed.distributed_c10d import all_reduce as _all_reduce

from .whatif import COLLECTIVE_OF

FIELDS = ("forward_ms", "comm_start_ms", "comm_end_ms", "comm_busy_ms")
# What a span on the comm track is: DDP's buckets, and any collective train counts (FSDP2's).
COMM_KINDS = ("bucket", *dict.fromkeys(COLLECTIVE_OF.values()))


class CommTimeline:
    def __init__(self, world_size: int, group=None, inner=None):
        self.world_size = world_size
        self.group = group
        self.inner = inner   # (state, hook) of --comm-hook, or None: the plain average
        self._backward = self._optimizer = 0.0
        self.steps_raw: list[dict] = []
        self._lock = threading.Lock()   # completions land on the backend's threads
        self._on = False
        self._t0 = self._forward = 0.0
        self._spans: list[list] = []   # [start, end, index, bytes, kind] each
        self._calls = self._step = 0
        self.steps: list[dict] = []

    def register(self, ddp_model) -> None:
        ddp_model.register_comm_hook(self, CommTimeline._hook)

    @staticmethod
    def _hook(self: "CommTimeline", bucket):
        t = time.perf_counter()
        buf = bucket.buffer()
        span = [t, 0.0, bucket.index(), buf.numel() * buf.element_size(), "bucket"]
        if self.inner is not None:
            fut = self.inner[1](self.inner[0], bucket)
        else:
            buf.div_(self.world_size)
            fut = _all_reduce(buf, group=self.group, async_op=True).get_future()

        def done(f):
            span[1] = time.perf_counter()
            with self._lock:
                if self._on:
                    self._spans.append(span)
            value = f.value()
            return value[0] if isinstance(value, list) else value
        return fut.then(done)

    def collective(self, name: str, nbytes: int, start: float, work) -> None:
        """One collective FSDP2 called at `start` (perf_counter), done when its Work's future is
        (an async call) or now (a blocking one); numbered in its step's order."""
        with self._lock:
            if not self._on:
                return
            self._calls += 1
            span, step = [start, 0.0, self._calls, nbytes, name], self._step

        def done(_f=None):
            span[1] = time.perf_counter()
            with self._lock:
                if self._on and self._step == step:   # a late completion is not the next step's
                    self._spans.append(span)
        if work is None:
            done()
        else:
            work.get_future().add_done_callback(done)

    def begin(self) -> None:
        with self._lock:
            self._spans = []
            self._calls = 0
            self._step += 1
            self._on = True
        self._t0 = time.perf_counter()

    def forward_done(self) -> None:
        self._forward = time.perf_counter()

    def backward_done(self) -> None:
        self._backward = time.perf_counter()

    def optimizer_done(self) -> None:
        self._optimizer = time.perf_counter()

    def end(self) -> None:
        with self._lock:
            self._on = False
            spans = sorted(self._spans)
        self.steps_raw.append({"start": self._t0, "forward": self._forward, "backward": self._backward,
                               "optimizer": self._optimizer, "end": time.perf_counter(),
                               "buckets": [tuple(sp) for sp in spans]})
        ms = lambda t: (t - self._t0) * 1e3  # noqa: E731
        busy, cur = 0.0, None
        for a, b, *_ in spans:   # the union of the spans: time with some bucket in the backend's hands
            if cur is None or a > cur[1]:
                if cur is not None:
                    busy += cur[1] - cur[0]
                cur = [a, b]
            else:
                cur[1] = max(cur[1], b)
        if cur is not None:
            busy += cur[1] - cur[0]
        self.steps.append({"forward_ms": ms(self._forward),
                           "comm_start_ms": ms(spans[0][0]) if spans else 0.0,
                           "comm_end_ms": ms(max(sp[1] for sp in spans)) if spans else 0.0,
                           "comm_busy_ms": busy * 1e3})

    def median_step(self) -> list[float]:
        """The marks of the step whose last bucket came back at the median time (every mark from
        that one step, so they stay consistent with each other), in FIELDS' order."""
        if not self.steps:
            return [0.0] * len(FIELDS)
        ordered = sorted(self.steps, key=lambda s: s["comm_end_ms"])
        step = ordered[(len(ordered) - 1) // 2]
        return [step[f] for f in FIELDS]
