"""What observe.py adds to a wirespeed call when no profiler records (issue 38's budget: ~0.2 us).

    PYTHONPATH=python .venv/bin/python benchmarks/observe_cost.py

One process, a group of one rank, 4 KiB float32, blocking. Two pairs, each timed in alternating
blocks of 2,000 calls (the order flips every block), best block of 200 each, so the machine's
load falls on both alike:
- the `dist.all_reduce` latency path (process_group.py's `allreduce`) against the same code
  without observe's additions (the profiler flag read, the count, the try), written out here;
- a call through an instrumented backend method (`all_gather_single`, what
  `all_gather_into_tensor` reaches) against its unwrapped `_raw_` method.
Also what the two ways of asking "is a profiler recording?" cost.
"""
import os
import time
import timeit

import torch
import torch.autograd.profiler as ap
import torch.distributed as dist

import wirespeed.native  # noqa: F401  (registers the "wirespeed" backend)
from wirespeed.launch.environment import free_port
from wirespeed.native.tensors import REDUCE_DTYPES, SUM

os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
dist.init_process_group("wirespeed", rank=0, world_size=1)
pg = dist.group.WORLD
backend = pg.backend
C10D = torch._C._distributed_c10d
t, o = torch.ones(1024), torch.empty(1024)
ar, ag = C10D.AllreduceOptions(), C10D.AllgatherOptions()
ar.asyncOp = ag.asyncOp = False
_AllreduceOptions, _STRIDED = C10D.AllreduceOptions, torch.strided   # module globals, as there


def latency_path_without_observe(self, *args, **kwargs):
    """process_group.py's latency case as it was before observe.py (same checks, same call)."""
    if len(args) == 2 and not kwargs and self._sum_now is not None:
        tensors, opts = args
        if (type(opts) is _AllreduceOptions and type(tensors) is list and len(tensors) == 1
                and not opts.asyncOp):
            x = tensors[0]
            code = REDUCE_DTYPES.get(x.dtype)
            if (code is not None and x.is_cpu and x.layout is _STRIDED and x.is_contiguous()
                    and opts.reduceOp == SUM):
                self._sum_now(x.data_ptr(), x.numel(), code, 0, x, True)
                return None
    raise AssertionError("not the latency case")


PAIRS = {
    "dist.all_reduce latency path": (lambda: latency_path_without_observe(pg, [t], ar), lambda: pg.allreduce([t], ar)),
    "backend method (all_gather_single)": (lambda: backend._raw_all_gather_single(o, t, ag),
                                           lambda: backend.all_gather_single(o, t, ag)),
}
CALLS, BLOCKS = 2000, 200
print(f"{'call':38} {'before us':>10} {'after us':>10} {'added us':>10}")
for name, (before, after) in PAIRS.items():
    for _ in range(CALLS):
        before(), after()
    best = {before: float("inf"), after: float("inf")}
    for block in range(BLOCKS):
        for f in ((before, after) if block % 2 else (after, before)):
            t0 = time.perf_counter_ns()
            for _ in range(CALLS):
                f()
            best[f] = min(best[f], (time.perf_counter_ns() - t0) / CALLS / 1000)
    print(f"{name:38} {best[before]:10.3f} {best[after]:10.3f} {best[after] - best[before]:10.3f}")
flag = min(timeit.repeat("ap._is_profiler_enabled", globals=globals(), number=200000, repeat=9)) / 200000
call = min(timeit.repeat(torch._C._autograd._profiler_enabled, number=200000, repeat=9)) / 200000
print(f"profiler check: torch.autograd.profiler._is_profiler_enabled {flag * 1e6:.3f} us, "
      f"torch._C._autograd._profiler_enabled() {call * 1e6:.3f} us")
dist.destroy_process_group()
