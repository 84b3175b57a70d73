"""Keep torch.compile's frame compiler (dynamo) out of the backend's own code.

torch calls into this package from C++ (DDP's reducer broadcasting its rebuilt buckets, the
dispatcher reaching a Python Backend, a Work being waited on), and when that happens inside a
compiled region's eager gaps (`torch.compile(DDP(model))` runs DDP's `_pre_forward` between
graphs) dynamo is asked to compile each Python frame torch enters. It then sees the process group
as torch registered it for tracing (an opaque ProcessGroup with a handful of members) and fails
hard on any other attribute: `UnsafeScriptObjectError ... attr=_direct`. gloo's group never
shows dynamo a Python frame, so nothing is compiled there.

These frames are glue around native calls (pointers, the engine's op ids): there is nothing in
them for a graph. So every method of the classes torch calls into is marked, on its code object,
"skip this frame and every frame it calls" - the strategy dynamo itself sets for code it must not
compile. The mark costs nothing at call time (dynamo reads it only when it is deciding whether to
compile a frame) and nothing without torch.compile. `dist.all_reduce` inside a compiled function
is untouched: dynamo rewrites it into torch's functional collectives, which reach this group
through the dispatcher when the graph runs.
"""
from __future__ import annotations

import types


def _strategy():
    """dynamo's "skip this frame and all it calls", or None where this torch has no such call."""
    try:
        from torch._C._dynamo import eval_frame as ef
        skip = ef._FrameAction.SKIP
        return ef.set_code_exec_strategy, ef._FrameExecStrategy(skip, skip)
    except (ImportError, AttributeError):
        return None


def _codes(cls):
    """The code objects of `cls`'s own functions, properties and static/class methods."""
    for value in vars(cls).values():
        if isinstance(value, (staticmethod, classmethod)):
            value = value.__func__
        if isinstance(value, property):
            yield from (f.__code__ for f in (value.fget, value.fset, value.fdel)
                        if isinstance(f, types.FunctionType))
        elif isinstance(value, types.FunctionType):
            yield value.__code__


def hide_from_dynamo(*classes) -> int:
    """Mark every method of `classes` as never compiled by dynamo; the number of code objects
    marked (0 where this torch offers no way to mark them: then nothing changes)."""
    found = _strategy()
    if found is None:
        return 0
    set_strategy, skip_all = found
    n = 0
    for cls in classes:
        for code in _codes(cls):
            set_strategy(code, skip_all)
            n += 1
    return n
