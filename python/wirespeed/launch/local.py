"""Spawn N ranks of a wirespeed command on this host, on loopback, and supervise them.

Each child runs the same command with torchrun's variables set, so a rank cannot tell a local spawn
from torchrun. If any rank fails, the survivors normally fail on their own within moments (their
peer is gone); whatever still runs a few seconds later is killed, so nothing is left behind. The
children also die with the launcher (PR_SET_PDEATHSIG), even when it is killed with SIGKILL.
"""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time

from ..errors import (EXIT_FAILED, EXIT_MEANING, EXIT_MISMATCH, EXIT_PEER_LOST, EXIT_TIMEOUT,
                      EXIT_USAGE)
from .environment import check_port_free, free_port, local_spawn_env, torch_log_env, with_job_secret

# After the first rank fails, how long the others get to report their own error before being
# killed. Ranks share one --timeout, so a fault that stalls the job makes them all time out within
# a tick of each other, and a dead peer is seen at once: a rank still silent after this is stopped
# or stuck, and waiting longer would only push the job's end past its timeout.
SURVIVOR_GRACE_S = 2.0
POLL_S = 0.02


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """In a child, before it runs its program: the kernel sends it `sig` when its parent dies."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, sig)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def rank_env(rank: int, nproc: int, port: int, base=None) -> dict:
    env = dict(os.environ if base is None else base)
    env.update(RANK=str(rank), WORLD_SIZE=str(nproc), LOCAL_RANK=str(rank),
               LOCAL_WORLD_SIZE=str(nproc), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
               **local_spawn_env(), OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "1"),
               **torch_log_env(env))
    return env


def spawn(argv: list[str], nproc: int, master_port: int | None = None) -> int:
    """Run `python -m wirespeed.cli.main *argv` as nproc ranks; return the job's exit code."""
    if master_port is None:
        port = free_port()
    else:
        check_port_free(master_port)
        port = master_port
    cmd = [sys.executable, "-m", "wirespeed.cli.main", *argv]
    base = with_job_secret(dict(os.environ))
    procs = [subprocess.Popen(cmd, env=rank_env(r, nproc, port, base), preexec_fn=die_with_parent)
             for r in range(nproc)]
    return supervise(procs)


def _signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


def _stopped(pid: int) -> bool:
    """True when the process is stopped (SIGSTOP, a debugger): alive, but it cannot report."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("T", "t")
    except (OSError, IndexError):
        return False


def rank_status(code: int) -> int:
    """A rank's exit status as the kind of failure it stands for: a rank killed by a signal that
    the launcher did not send is a lost peer to the others."""
    return EXIT_PEER_LOST if code < 0 else code


def job_status(failures: list[tuple[int, int, int]]) -> int:
    """The job's exit status from its ranks' failures (poll tick, rank, code), in the order they
    were seen: the first failure's kind, whichever rank it was. The faults this launcher sees
    first are causes (a killed rank, a timeout), those after are their echoes (a peer of a rank
    that timed out sees it leave). Failures seen in the same tick are ranked cause-first."""
    if not failures:
        return 0
    first_tick = min(t for t, _, _ in failures)
    firsts = [rank_status(c) for t, _, c in failures if t == first_tick]
    return min(firsts, key=lambda c: _CAUSE_ORDER.index(c) if c in _CAUSE_ORDER else len(_CAUSE_ORDER))


# Which of several failures seen at once is the cause: a refusal or a disagreement makes ranks
# time out or leave, a timeout makes its peers see it leave; never the other way round.
_CAUSE_ORDER = (EXIT_USAGE, EXIT_MISMATCH, EXIT_TIMEOUT, EXIT_PEER_LOST, EXIT_FAILED)


def _how(code: int) -> str:
    if code < 0:
        return f"was killed by {_signal_name(-code)}"
    meaning = EXIT_MEANING.get(code)
    return f"exited with status {code}" + (f" ({meaning})" if meaning else "")


def supervise(procs: list[subprocess.Popen], explain=None) -> int:
    """Wait for every rank; once one fails, give the others SURVIVOR_GRACE_S to report their own
    error, then kill the rest. Returns the job's exit status (job_status). `explain`, when given,
    returns lines saying what in the environment caused a failure (a link that is down)."""
    def kill_all(*_):
        for p in procs:
            if p.poll() is None:
                p.kill()

    old = {s: signal.signal(s, lambda signum, frame: (kill_all(), sys.exit(128 + signum)))
           for s in (signal.SIGINT, signal.SIGTERM)}
    failures: list[tuple[int, int, int]] = []
    killed: dict[int, str] = {}
    try:
        failed_at = None
        seen: set[int] = set()
        tick = 0
        while True:
            tick += 1
            codes = [p.poll() for p in procs]
            for r, c in enumerate(codes):
                if c is not None and r not in seen:
                    seen.add(r)
                    if c != 0 and r not in killed:
                        failures.append((tick, r, c))
            if all(c is not None for c in codes):
                break
            if failed_at is None and failures:
                failed_at = time.monotonic()
                # Of failures seen in one poll, a rank killed by a signal is named first: the
                # others' "peer lost" is usually its echo.
                _, r, c = min(failures, key=lambda f: (f[0], f[2] >= 0))
                sys.stderr.write(f"wirespeed: error: rank {r} {_how(c)}; ending the job\n")
            elif failed_at is not None:
                # A survivor gets the grace to report its own error; a stopped one cannot report
                # anything, so it is killed at once (the job ends within a rank's timeout + 1 s).
                late = time.monotonic() - failed_at > SURVIVOR_GRACE_S
                for r, p in enumerate(procs):
                    if p.poll() is not None or r in killed:
                        continue
                    if _stopped(p.pid):
                        killed[r] = "stopped"
                        sys.stderr.write(f"wirespeed: error: rank {r} is stopped, so it cannot end "
                                         "by itself; killing it\n")
                        p.kill()
                    elif late:
                        killed[r] = "silent"
                        sys.stderr.write(f"wirespeed: error: rank {r} did not report an error of "
                                         f"its own {SURVIVOR_GRACE_S:g} s after another rank failed"
                                         "; killing it\n")
                        p.kill()
            time.sleep(POLL_S)
        for p in procs:
            p.wait()
    finally:
        kill_all()
        for s, h in old.items():
            signal.signal(s, h)
    code = job_status(failures)
    if code:
        _summarize(code, failures, killed, explain)
    return code


def _summarize(code: int, failures, killed: dict[int, str], explain) -> None:
    """One last line naming every rank by what happened to it, then the environment's part."""
    groups: dict[str, list[int]] = {}
    for _, r, c in failures:
        how = f"killed by {_signal_name(-c)}" if c < 0 else f"exited with status {c}"
        groups.setdefault(how, []).append(r)
    for r, why in killed.items():
        groups.setdefault("killed by the launcher" + (", stopped" if why == "stopped" else ""),
                          []).append(r)
    parts = [("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, sorted(ranks)))
             + f": {how}" for how, ranks in groups.items()]
    lines = [f"wirespeed: error: the job failed with status {code} "
             f"({EXIT_MEANING.get(code, 'failed')}); {'; '.join(parts)}"]
    if explain is not None:
        try:
            lines += [f"wirespeed: error: {line}" for line in explain()]
        except Exception:  # noqa: BLE001 (an explanation must never hide the failure itself)
            pass
    sys.stderr.write("\n".join(lines) + "\n")
