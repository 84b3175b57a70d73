"""What torch's tools see of a wirespeed group: profiler spans, flight-recorder entries, and a
collective's sequence number for the error a hang ends in.

wirespeed's collectives skip torch's dispatcher for speed (process_group.py), and with it the
profiler's `c10d::*` spans and the flight recorder's hook. So:

- **Profiler.** Every public collective and point-to-point method of the backend is wrapped
  (`instrument`): while torch's profiler records, the call is a span named as torch names its own
  backends' (`wirespeed:all_reduce`, ...), with the tensors (record_shapes shows their sizes and
  dtypes) and the fields torch's `record_param_comms` uses (`In msg nelems`, `dtype`,
  `Process Group Name`, `Group size`, `Seq`). A blocking op's span runs from the call to its
  return (the op ran inline); an async op's from the call to its Work's wait, on the waiting
  thread. With no profiler recording, the check is one module attribute read
  (`torch.autograd.profiler._is_profiler_enabled`, set by torch's profile classes).
- **Flight recorder.** torch records a group's ops from the dispatcher's pre/post hooks
  (FlightRecorderHook), which the direct route skips, and a Python backend cannot write into the
  C++ recorder itself. So a group created while `TORCH_FR_BUFFER_SIZE` (or torch's older
  `TORCH_NCCL_TRACE_BUFFER_SIZE`) is set above 0 sends every op through torch's dispatcher
  (`fr_requested`), and torch's own hook records them: `_dump_fr_trace_json(backend="wirespeed")`
  and `fr_trace` read them unchanged. This costs the dispatcher's 35-70 us a call, so it is not
  the default (torch's own default buffer of 2000 is for backends that record themselves cheaply).
- **A hang says who.** Each backend counts its collectives (`Ledger.seq`, the number torch's
  recorder gives them as `collective_seq_id` when it records them). When one fails (timeout, peer
  lost), `Ledger.explain` names the collective and its number, trades progress with the peers
  through the group's store (each failing rank posts what it was in; a rank that posts nothing
  within a short grace had not reached it), writes torch's flight-recorder dump where
  `TORCH_FR_DUMP_TEMP_FILE` says, and says where the dump is.
"""
from __future__ import annotations

import functools
import inspect
import os
import time
import weakref

import torch
import torch.autograd.profiler as _ap
import torch.distributed as dist

from .. import _native
from .watch import Poller

_Span = torch._C._profiler._RecordFunctionFast
_FR_VARS = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
_DUMP_VARS = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
_FR_BACKEND = "wirespeed"                     # the recorder instance torch's hook files our ops under
_STUCK_KEY = "wirespeed/obs/failed/"          # + rank: "<seq> <collective>" of a failed collective
_DUMP_KEY = "wirespeed/obs/dump"              # set by the first rank that dumps: every rank dumps
_WATCH_PERIOD_S = 1.0                         # how often a recorded group's store is asked for it
_GRACE_S = 2.0                                # how long a failing rank waits for its peers' posts


# The failures a report is added to: the group's own (a usage error or a refused stranger is not
# about the collective's progress, and a broken group's error carries the first failure's report).
_EXPLAINED = (_native.CollectiveTimeout, _native.PeerAbortedError, _native.PeerDiedError, _native.MismatchError)


def _waited_in_vain(err: Exception) -> bool:
    """This rank's own timeout, or a peer's that aborted the group (its reason travels as text)."""
    return isinstance(err, _native.CollectiveTimeout) or (
        isinstance(err, _native.PeerAbortedError) and "timed out" in str(err))


def fr_requested() -> bool:
    """The user asked for torch's flight recorder by its variable, above 0 (read at group
    creation, as torch reads it when it attaches its hook)."""
    for var in _FR_VARS:
        value = os.environ.get(var)
        if value:
            try:
                return int(value) > 0
            except ValueError:
                return False
    return False


def dump_prefix() -> str | None:
    """Where a failure writes torch's flight-recorder dump (the rank number is appended), or None
    when the user set no dump file."""
    for var in _DUMP_VARS:
        value = os.environ.get(var)
        if value:
            return value
    return None


def _global_rank(fallback: int) -> int:
    """This process's rank in the job (what names torch's dump file), or the group's."""
    try:
        return dist.get_rank() if dist.is_initialized() else fallback
    except RuntimeError:
        return fallback


class Ledger:
    """One group's count of collectives and point-to-point ops, and its failure report."""

    __slots__ = ("seq", "p2p", "rank", "size", "store", "group", "recorded", "closed", "_reported",
                 "__weakref__")

    def __init__(self, store, rank: int, size: int):
        self.seq = 0          # collectives entered in this group (torch's collective_seq_id)
        self.p2p = 0          # sends and receives entered (torch's p2p_seq_id)
        self.rank, self.size, self.store = rank, size, store
        self.group = None     # a weak reference to the ProcessGroup, set by it (process_group.py)
        self.recorded = fr_requested()
        self.closed = False   # the backend shut down: its store is not read any more
        self._reported: str | None = None
        if self.recorded and dump_prefix() is not None:
            _WATCH.add(_DumpWatched(self))

    @property
    def group_name(self) -> str:
        """The name torch gave the group (after the backend was built), or ""."""
        pg = self.group() if self.group is not None else None
        try:
            return pg.group_name if pg is not None else ""
        except RuntimeError:
            return ""

    def _group_label(self) -> str:
        """" of group '0' (default_pg)": torch's name and description, as fr_trace prints them."""
        pg = self.group() if self.group is not None else None
        try:
            name, desc = pg.group_name, pg.group_desc
        except (AttributeError, RuntimeError):
            return ""
        return f" of group {name!r}" + (f" ({desc})" if desc else "")

    # ---- a failure, explained ----
    def explain(self, err: Exception, name: str, seq: int) -> Exception:
        """`err` (a native error from collective `name`, number `seq` in this group) as the same
        type of error, its message extended with who had not reached the collective and where
        torch's flight-recorder dump is. Best effort: the report never hides the original error."""
        if not isinstance(err, _EXPLAINED):
            return err
        self.ask_peers_to_dump()
        try:
            # Who had not reached it: asked of the peers when this rank waited in vain (its own
            # timeout, or a peer's that aborted the group); a dead peer is named by the error itself.
            where = self._who(name, seq) if seq > 0 and _waited_in_vain(err) else ""
        except Exception as e:  # noqa: BLE001 - the store may be gone with the peer that held it
            where = f"; peers' progress unknown ({type(e).__name__}: {e})"
        label = f"{name} #{seq}" if seq > 0 else name
        msg = f"{err} [in {label}{self._group_label()}{where}; {self._dump()}]"
        new = type(err)(msg)
        new.__cause__ = err
        return new

    def _who(self, name: str, seq: int) -> str:
        """Post this rank's failed collective to the store and read the others' posts for a short
        grace: a rank that posts nothing is not in a failed collective (it had not reached this
        one, or is stuck elsewhere); one in another collective, or an earlier one, is named."""
        store = self.store
        store.set(f"{_STUCK_KEY}{self.rank}", f"{seq} {name}")
        peers = [p for p in range(self.size) if p != self.rank]
        posts: dict[int, str] = {}
        deadline = time.monotonic() + _GRACE_S
        lost = ""
        while True:
            try:
                for p in peers:
                    if p not in posts and store.check([f"{_STUCK_KEY}{p}"]):
                        posts[p] = store.get(f"{_STUCK_KEY}{p}").decode()
            except Exception as e:  # noqa: BLE001 - the store left with its rank: say what was seen
                lost = f" (the store closed after {len(posts)} of {len(peers)} peers posted: {type(e).__name__})"
                break
            if len(posts) == len(peers) or time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        silent = [p for p in peers if p not in posts]
        elsewhere = []
        for p, post in sorted(posts.items()):
            s, _, n = post.partition(" ")
            if int(s) != seq or n != name:
                elsewhere.append(f"rank {p} in {n} #{s}")
        parts = []
        if silent:
            parts.append(f"ranks that had not reached it: {', '.join(map(str, silent))} "
                         + (lost or f"(no failed collective posted within {_GRACE_S:.0f} s)"))
        if elsewhere:
            parts.append("; ".join(elsewhere))
        if not parts:
            parts.append("every rank reached it")
        return "; " + "; ".join(parts)

    def _dump(self) -> str:
        """Write torch's flight-recorder dump once (if the user named a file) and say where it is."""
        if not self.recorded:
            return ("torch's flight recorder did not record this group: set TORCH_FR_BUFFER_SIZE "
                    "(docs/debugging.md)")
        rank = _global_rank(self.rank)
        prefix = dump_prefix()
        if prefix is None:
            return ('flight recorder: torch._C._distributed_c10d._dump_fr_trace_json(backend="wirespeed"), '
                    "or set TORCH_FR_DUMP_TEMP_FILE to have it written here")
        self._reported = self.dump(rank, prefix)   # at every failure: a later dump holds more
        return self._reported

    def ask_peers_to_dump(self) -> None:
        """Have every rank of the group write its dump (their watch reads this): a rank that is not
        inside a collective of this group (the one that skipped it) never fails, so never dumps."""
        if self.recorded and dump_prefix() is not None:
            try:
                self.store.set(_DUMP_KEY, str(self.rank))
            except Exception:  # noqa: BLE001 - the store may be gone with the peer that held it
                pass

    def dump(self, rank: int, prefix: str) -> str:
        try:
            torch._C._distributed_c10d._dump_fr_trace_file(rank, backend=_FR_BACKEND)
            return f"flight recorder dump: {prefix}{rank}"
        except Exception as e:  # noqa: BLE001 - the error being reported matters more
            return f"flight recorder dump failed: {e}"


class _DumpWatched:
    """A recorded group's watch for a peer's dump (started only when the user asked for torch's
    recorder and a dump file): its store asked about once a second whether a peer dumped, and then
    this rank's dump written too (as torch's NCCL backend does on a peer's timeout), once. It
    leaves the watch (watch.Poller) then, or when the group is collected or closed, or its store
    is gone (the job is over)."""
    __slots__ = ("ledger",)

    def __init__(self, ledger: Ledger):
        self.ledger = weakref.ref(ledger)

    def poll(self, _now: float) -> bool:
        led = self.ledger()
        if led is None or led.closed:
            return True
        if not led.store.check([_DUMP_KEY]):
            return False
        if led._reported is None:
            led._reported = led.dump(_global_rank(led.rank), dump_prefix() or "")
        return True


_WATCH = Poller("wirespeed-fr-dump-watch", _WATCH_PERIOD_S)


# ---- the backend's methods, wrapped ----

def _tensors(x, out: list) -> list:
    if isinstance(x, torch.Tensor):
        out.append(x)
    elif isinstance(x, (list, tuple)):
        for y in x:
            _tensors(y, out)
    return out


def _span(backend, name: str, seq: int, args: tuple, ins: int | None, outs: int | None):
    """An open profiler span for one call (profiling only: costs microseconds)."""
    tin = _tensors(args[ins], []) if ins is not None and ins < len(args) else []
    tout = _tensors(args[outs], []) if outs is not None and outs < len(args) else []
    led = backend._ledger
    kw = {"Collective name": name.partition(":")[2], "Seq": seq, "Rank": led.rank, "Group size": led.size,
          "Process Group Name": led.group_name, "In msg nelems": sum(t.numel() for t in tin),
          "Out msg nelems": sum(t.numel() for t in tout),
          "dtype": str((tin or tout)[0].dtype).removeprefix("torch.") if tin or tout else ""}
    span = _Span(name, tin + tout, kw)
    span.__enter__()
    return span


def _profiled(f, self, name: str, seq: int, args: tuple, ins: int | None, outs: int | None):
    """The call `f(self, *args)` as a profiler span (see the module doc)."""
    led = self._ledger
    span = _span(self, "wirespeed:" + name, seq if seq else led.p2p, args, ins, outs)
    try:
        work = f(self, *args)
    except _native.WirespeedError as e:
        span.__exit__(None, None, None)
        raise led.explain(e, name, seq) from None
    except BaseException:
        span.__exit__(None, None, None)
        raise
    if work is None:
        span.__exit__(None, None, None)
    else:
        work._op = (led, name, seq, span)     # the wait closes it
    return work


# One wrapper per method, written out with the method's own parameters: forwarding `*args` costs
# ~0.3 us a call here (a tuple packed, an unspecialized call), fixed parameters ~0.07 us. Point-to-
# point ops are numbered apart, as torch numbers them, and a failure of one reports no number.
_WRAPPER = """
def observed_{method}(self, {params}):
    led = self._ledger
    {count}
    if not _ap._is_profiler_enabled:
        try:
            work = raw(self, {params})
        except WirespeedError as e:
            raise led.explain(e, name, seq) from None
        if work is not None:
            work._op = (led, name, seq, None)
        return work
    return profiled(raw, self, name, seq, ({params},), ins, outs)
"""


def _observed(raw, method: str, name: str, p2p: bool, ins: int | None, outs: int | None):
    params = list(inspect.signature(raw).parameters)[1:]
    count = "led.p2p += 1; seq = 0" if p2p else "led.seq = seq = led.seq + 1"
    scope = {"_ap": _ap, "WirespeedError": _native.WirespeedError, "raw": raw, "name": name,
             "profiled": _profiled, "ins": ins, "outs": outs}
    exec(_WRAPPER.format(method=method, params=", ".join(params), count=count), scope)  # noqa: S102
    return functools.wraps(raw)(scope["observed_" + method])


def instrument(cls, table: dict) -> None:
    """Wrap each method of `cls` named in `table` (method: (collective, p2p, inputs' argument,
    outputs' argument)); the unwrapped method stays reachable as `_raw_<method>` for calls made
    from inside another (a coalesced call's parts), which must not count twice."""
    for method, (name, p2p, ins, outs) in table.items():
        raw = getattr(cls, method)
        setattr(cls, "_raw_" + method, raw)
        setattr(cls, method, _observed(raw, method, name, p2p, ins, outs))


def finished(work, err: BaseException | None) -> BaseException | None:
    """Called by a Work's wait once its ops are done or failed: closes its profiler span and turns
    a native error into the explained one (returned, for the caller to raise)."""
    op = work._op
    if op is None:
        return err
    led, name, seq, span = op
    if span is not None:
        work._op = (led, name, seq, None)
        span.__exit__(None, None, None)
    if err is not None and isinstance(err, _native.WirespeedError):
        return led.explain(err, name, seq)
    return err
