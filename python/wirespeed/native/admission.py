"""Who may be a rank of this job: the claims on rank numbers, the job's identity, and the watch
that stops a job whose rank was claimed twice after it started computing.

A process joins a native group by claiming a rank number in the store and proving the job's
token. Two ways a process that is not the job's own could get in, and what stops each:

- **A process of another job** (a stale rank, another job given this job's MASTER_PORT): the
  launcher's identity of the job (torchrun's run id, SLURM's job and step, Open MPI's namespace,
  or WIRESPEED_JOB_ID) and the job secret, where there is one, are folded into the token every
  rank proves, over shared memory and TCP alike, so the other job's process proves another token
  and is refused. Every rank also publishes a digest of the identity with its host id and
  compares everyone's before connecting, so a process of another job is refused by name on
  every rank of both jobs before any of them computes.
- **A rank number claimed twice within one identity** (a launcher that started a rank twice, two
  jobs that carry no launcher identity): the later claimant fails at once and leaves a note in
  the store. Ranks that already checked their claims before the later claim came learn of it
  from the watch: a thread that reads the note every few seconds, for the group's timeout after
  setup (two minutes at least), and breaks the group with it, so the next collective fails on
  every rank with that line (over shared memory the core hands the reason to peers waiting on
  the rank that broke; over TCP they see the connection close until their own watch reads it).

Nothing here stops a process that can read the store *and* sets itself up as the job's own
(same identity, no secret): only WIRESPEED_JOB_SECRET, which the store does not hold, does; a
group across hosts without one says so once at set-up (docs/transport.md, "Who can join").
"""
from __future__ import annotations

import hashlib
import os
import socket
import sys
import time
import weakref
from dataclasses import dataclass

from ..errors import RankClaimedTwice
from .watch import Poller

SECRET = "WIRESPEED_JOB_SECRET"
JOB_ID = "WIRESPEED_JOB_ID"

# The process's environment, as rendezvous.py (one of the few files that read WIRESPEED_*
# variables from it, tests/unit/test_knobs.py) hands it over.
_ENV: dict = {}


def read_environment(env) -> None:
    """What this module reads: the launcher's names of the job, the secret, the restart count."""
    global _ENV
    _ENV = env

# How often the watch reads the store's note, at the least; a larger job reads less often, so
# the store serves about world / period requests a second for it (100 at 1,000 ranks).
WATCH_PERIOD_S = 2.0
WATCH_REQUESTS_PER_S = 100.0
# How long after setup a group is watched, at the least; the group's timeout where longer. A real
# rank comes late by the time its launcher takes to start it, not by hours, and a watch that ran
# for the whole job would read the store while its server (rank 0, under env://) leaves at the
# end of the job, which torch's client reports with a stack trace.
WATCH_LEAST_S = 120.0


def claims_round() -> str:
    # torchrun's store outlives its workers and torch reuses the group's prefix after a restart.
    return _ENV.get("TORCHELASTIC_RESTART_COUNT", "0")


def me() -> str:
    return f"{socket.gethostname()} pid {os.getpid()}"


def job_identity(env=None) -> str:
    """The job as the launcher that started this rank names it, e.g. "torchrun run 5f2c"; "" when
    none does. Only the innermost launcher counts (torchrun, then MPI, then SLURM): the outer ones'
    variables reach some ranks of a job and not others (an mpirun inside an sbatch script, a
    torchrun started over ssh from an salloc shell). WIRESPEED_JOB_ID, when set, is the whole
    identity (ranks started by several launches of one job give it the same value)."""
    env = _ENV if env is None else env
    if env.get(JOB_ID):
        return f"job {env[JOB_ID]}"
    if env.get("TORCHELASTIC_RUN_ID"):
        return f"torchrun run {env['TORCHELASTIC_RUN_ID']}"
    mpi = env.get("PMIX_NAMESPACE") or env.get("OMPI_MCA_ess_base_jobid")
    if mpi:
        return f"mpi job {mpi}"
    if env.get("SLURM_JOB_ID") and env.get("SLURM_STEP_ID"):
        return f"slurm job {env['SLURM_JOB_ID']} step {env['SLURM_STEP_ID']}"
    return ""


def identity_digest(identity: str) -> str:
    """What a rank publishes of its identity: short, fixed-length, no comma."""
    return hashlib.sha256(identity.encode()).hexdigest()[:16]


def job_token(store_token: bytes, identity: str, env=None) -> bytes:
    """The 16-byte token this rank proves: the store's random token with the job's identity and
    secret folded in, so a process that read the store but belongs to another job (or lacks the
    secret) holds another token. Two halves: the first of the store's token and the identity
    alone, the second with the secret too, so a listener refusing a dial can tell a rank of this
    very job whose secret differs (first half equal: it fails its wait on that rank, with that
    line, hosts/mesh.rs) from a process of another job (a stale address: refused, the job goes on).
    The first half is no secret: a process that reads the store can compute the whole token
    anyway where there is no secret, and where there is one the handshake's proof admits."""
    env = _ENV if env is None else env
    job = hashlib.sha256(b"wirespeed job token\0" + store_token + b"\0" + identity.encode()).digest()
    h = hashlib.sha256(b"wirespeed job secret\0" + store_token)
    h.update(b"\0" + identity.encode())
    h.update(b"\0" + env.get(SECRET, "").encode())
    return job[:8] + h.digest()[:8]


_SAID = []


def say_what_the_store_admits() -> None:
    """Once a process, on rank 0 of a group across hosts without a job secret: what admits a
    rank, and how to close it."""
    if _ENV.get(SECRET) or _SAID:
        return
    _SAID.append(True)
    sys.stderr.write(
        f"wirespeed: note: no {SECRET}: any process that can read this job's store can join it as a "
        f"rank over TCP; export one random value of {SECRET} to every rank (e.g. "
        f"{SECRET}=$(openssl rand -hex 16)) to admit only this job's ranks\n")
    sys.stderr.flush()


def check_identities(rank: int, digests: list[str], identity: str) -> None:
    """Refuse, naming it, a rank whose job identity is not this rank's (every rank reads every
    digest, so every rank of both jobs refuses)."""
    mine = identity_digest(identity)
    for r, d in enumerate(digests):
        if d != mine:
            raise RankClaimedTwice(
                f"rank {r} of this rendezvous belongs to another job than rank {rank} ({me()}, "
                f"{identity or 'no launcher names this job'}): a rank of another job uses this job's "
                "rendezvous; end it, or give each job its own MASTER_PORT (ranks of one job that "
                f"several launches started: give them all one {JOB_ID})")


def claim(store, rank: int) -> int:
    """Claim `rank`; returns this claim's number (for check_claims)."""
    g = claims_round()
    n = store.add(f"wirespeed/{g}/claims/{rank}", 1)
    store.set(f"wirespeed/{g}/claimant/{rank}/{n}", me())
    if n > 1:
        before = store.get(f"wirespeed/{g}/claimant/{rank}/{n - 1}").decode()
        if before != me():  # else this process re-initialises: a new round of its own
            _claimed_twice(store, rank, before, me())
    return n


def _note_key() -> str:
    return f"wirespeed/{claims_round()}/duplicate"


def _claimed_twice(store, rank: int, first: str, second: str):
    msg = (f"rank {rank} was claimed twice, by {first} and by {second}: a rank of another job (or "
           "a second copy of one) uses this job's rendezvous; end it, or give this job its own "
           "MASTER_PORT")
    store.set(_note_key(), msg)  # every rank's check, and the watch, see it
    raise RankClaimedTwice(msg)


def _note(store, key: str) -> str | None:
    """The claim's line a late claimant left in the store, or None."""
    return store.get(key).decode() if store.check([key]) else None


def check_claims(store, rank: int, n: int) -> None:
    note = _note(store, _note_key())
    if note is not None:
        raise RankClaimedTwice(note)
    last = store.add(f"wirespeed/{claims_round()}/claims/{rank}", 0)
    if last > n:  # claimed again after this process did
        other = store.get(f"wirespeed/{claims_round()}/claimant/{rank}/{last}").decode()
        if other != me():
            _claimed_twice(store, rank, me(), other)


@dataclass(eq=False)
class _Watched:
    """One group's watch: its job's note read every `period` seconds, and the group broken with it.
    It leaves the watch (watch.Poller) when the group is collected, closed or dropped, when its
    time is up, or when its store cannot be read any more (its job is over)."""
    group: weakref.ref   # the native group
    store: object        # its job's store
    key: str             # the note's key
    period: float        # seconds between two reads
    due: float           # the next read (time.monotonic)
    until: float         # the last

    def poll(self, now: float) -> bool:
        if self.due > now:
            return False
        self.due = now + self.period
        group = self.group()
        if group is None or group.closed or now > self.until:
            return True
        note = _note(self.store, self.key)
        if note is None:
            return False
        group.abort(note)
        return True


_WATCH = Poller("wirespeed-claims-watch", 0.5)


def watch(group, store, world: int, for_s: float) -> None:
    """Break `group` with the store's note if a rank of its job is claimed again within `for_s`
    seconds (the group's timeout, WATCH_LEAST_S at least)."""
    period = max(WATCH_PERIOD_S, world / WATCH_REQUESTS_PER_S)
    now = time.monotonic()
    _WATCH.add(_Watched(weakref.ref(group), store, _note_key(), period, now + period,
                        now + max(for_s, WATCH_LEAST_S)))


def unwatch(group) -> None:
    """The group is shut down: stop reading its job's store at once."""
    _WATCH.drop(lambda w: w.group() in (group, None))
