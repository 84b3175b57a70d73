"""One rank of a soak run (benchmarks/soak.py): random checked collectives, and, on the rank the
run's plan names, its own SIGKILL at the planned point.

Every rank of a run draws the same sequence of ops from one seeded generator (`draw`), fills fresh
buffers with the harness's verifiable data and checks each result exactly (bench/verifiable.py).
It ends as a `wirespeed` command's rank does: a library error becomes wirespeed's one-line typed
error (`wirespeed: error: rank R: ...`, faults.rank_error) and the rank leaves at once with that
error's status (os._exit, as cli.main.run does), so what a survivor prints here is what a survivor
of `wirespeed bench` prints.

What it leaves in the run's folder for the driver to judge (the driver cannot see inside a rank):
  rank-R.json     ops checked, wrong elements, and the error it ended with (written before exit;
                  a rank that the watchdog ends has none, its stderr says why)
  start-R         CLOCK_MONOTONIC when the rank began to meet its peers (a peer killed before
                  that can only be noticed by this rank's own deadline, which starts here)
  wrong-R.txt     one line per op with wrong elements, written at once
  kill.json       on the victim, just before it kills itself: when (CLOCK_MONOTONIC, the same
                  clock in every process of the machine, namespaces included) and where it landed
"""
from __future__ import annotations

import json
import math
import os
import random
import signal
import sys
import threading
import time

# Phases a run's victim can die in (the driver draws one). "mid" and "large" kill from a thread a
# seeded moment after the op started, so the kill lands inside the transport's work (or just
# after, when the op was quicker: kill.json says where it landed).
PHASES = ("before-init", "setup", "between", "mid", "large")


def draw(rng: random.Random, world: int, max_bytes: int):
    """One op's description, the same on every rank (same generator, same calls)."""
    from wirespeed.bench.collectives import COLLECTIVES
    from wirespeed.bench.dtypes import DTYPES, OPS
    coll = COLLECTIVES[rng.choice(sorted(COLLECTIVES))]
    dtype = DTYPES[rng.choice(sorted(DTYPES))]
    op = rng.choice(OPS) if coll.reduces else None
    root = rng.randrange(world) if coll.rooted else -1
    inplace = rng.choice(coll.variants)
    if rng.random() < 0.05:
        nbytes = 0
    else:  # log-uniform, then any byte count (odd ones included) up to that
        nbytes = rng.randint(1, int(math.exp(rng.uniform(0, math.log(max_bytes)))))
    return coll, dtype, op, root, inplace, nbytes


class Where:
    """Where this rank is, for a kill from another thread to say where it landed."""

    def __init__(self):
        self.text = "before init"
        self.op_started = threading.Event()


def _write(path: str, obj) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f)
    os.replace(tmp, path)


def die(folder: str, rank: int, phase: str, landed: str) -> None:
    """SIGKILL this process, after saying when and where (the driver times the survivors from it)."""
    _write(os.path.join(folder, "kill.json"), {"rank": rank, "phase": phase, "landed": landed,
                                               "t": time.monotonic()})
    os.kill(os.getpid(), signal.SIGKILL)


def kill_later(folder: str, rank: int, phase: str, where: Where, delay_s: float,
               after: threading.Event | None = None) -> None:
    """From a thread: once `after` is set (at once if None), wait delay_s, then die wherever the
    rank is by then."""
    def run():
        if after is not None:
            after.wait()
        time.sleep(delay_s)
        die(folder, rank, phase, where.text)
    threading.Thread(target=run, name="soak-kill", daemon=True).start()


def rank_main(args) -> int:
    from wirespeed.bench.collectives import Case
    from wirespeed.bench.watchdog import Watchdog
    from wirespeed.cli.rankjob import start_backend
    from wirespeed.faults import rank_error
    from wirespeed.launch.environment import rank_info

    info = rank_info()
    rank, folder = info.rank, args.folder
    victim = args.kill_rank == rank
    where = Where()
    counts = {"rank": rank, "ops": 0, "skipped": 0, "bytes": 0, "wrong": 0, "error": None,
              "status": 0}
    if victim and args.kill_phase == "before-init":
        die(folder, rank, args.kill_phase, "before init")
    # What start_backend imports, imported first: the mark below is when the rank begins to meet
    # its peers, which a rank's own deadline counts from, not when it begins to load torch.
    import torch.distributed  # noqa: F401
    import wirespeed.backends.native  # noqa: F401
    import wirespeed.native  # noqa: F401
    with open(os.path.join(folder, f"start-{rank}"), "w") as f:
        f.write(repr(time.monotonic()))
    if victim and args.kill_phase == "setup":
        kill_later(folder, rank, args.kill_phase, where, args.kill_delay)
    where.text = "in setup"
    backend = start_backend("wirespeed", "cpu", info, args.timeout)
    where.text = "set up, before op #0"
    rng = random.Random(args.seed)
    watchdog = Watchdog(args.timeout, rank)
    try:
        for i in range(args.ops):
            coll, dtype, op, root, inplace, nbytes = draw(rng, info.world_size, args.max_bytes)
            if i == args.large_op:
                nbytes = args.large_bytes
            if coll.name == "barrier":
                nbytes = 0
            if backend.unsupported(coll.name, dtype.name, op, inplace, "cpu"):
                inplace = not inplace
                if inplace not in coll.variants or backend.unsupported(coll.name, dtype.name, op,
                                                                       inplace, "cpu"):
                    counts["skipped"] += 1
                    continue
            count, send, recv = coll.counts(nbytes, dtype.itemsize, info.world_size)
            case = Case(coll.name, dtype, op, root, inplace, count, send, recv, rank,
                        info.world_size, "cpu")
            what = (f"#{i} barrier" if coll.name == "barrier" else
                    f"#{i} {coll.name} {case.nbytes} B {dtype.name}{' ' + op if op else ''}"
                    f"{f' root {root}' if root >= 0 else ''}{' in-place' if inplace else ''}")
            watchdog.step(f"soaking {what}")
            bufs = coll.alloc(case)
            coll.fill_inputs(case, bufs)
            if victim and i == args.kill_op and args.kill_phase in ("mid", "large"):
                kill_later(folder, rank, args.kill_phase, where, args.kill_delay, where.op_started)
            where.text = f"in op {what}"
            if i == args.kill_op:
                where.op_started.set()
            try:
                coll.run(backend, case, bufs)
                backend.synchronize()
            except Exception as e:  # noqa: BLE001 (reported as a wirespeed command reports it)
                raise rank_error(rank, e) from None
            where.text = f"after op {what}"
            bad = coll.wrong(case, bufs)
            if bad:
                with open(os.path.join(folder, f"wrong-{rank}.txt"), "a") as f:
                    f.write(f"{what}: {bad} wrong elements\n")
            counts["wrong"] += bad
            counts["ops"] += 1
            counts["bytes"] += case.nbytes
            if victim and i == args.kill_op and args.kill_phase == "between":
                die(folder, rank, args.kill_phase, f"between op #{i} and #{i + 1}")
        if victim and args.kill_phase == "setup":
            # Setup was quicker than the planned moment, and the ops too: die now, at shutdown.
            die(folder, rank, args.kill_phase, "after the last op, before shutdown")
    finally:
        watchdog.close()
        _write(os.path.join(folder, f"rank-{rank}.json"), counts)
    backend.shutdown()
    return 0


def run_rank(args) -> None:
    """rank_main as `wirespeed`'s own entry point runs a command: wirespeed's errors as one line
    and their status, anything else as the traceback it is (a soak finding), and out at once."""
    from wirespeed.errors import WirespeedError
    try:
        code = rank_main(args)
    except WirespeedError as e:
        path = os.path.join(args.folder, f"rank-{os.environ.get('RANK')}.json")
        try:
            with open(path) as f:
                counts = json.load(f)
        except (OSError, ValueError):
            counts = {"rank": int(os.environ.get("RANK", -1)), "ops": 0, "skipped": 0, "bytes": 0,
                      "wrong": 0}
        counts.update(error=str(e), status=e.exit_code)
        _write(path, counts)
        sys.stderr.write(f"wirespeed: error: {e}\n")
        code = e.exit_code
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
