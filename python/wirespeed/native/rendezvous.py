"""The store rendezvous that makes a connected native group.

Through whatever store torch hands the backend (TCPStore, FileStore, already prefixed per group),
so torchrun, SLURM and `wirespeed bench -N` launches work unchanged: rank 0 publishes a random job
token; every rank publishes its host id (hostname + boot id) with its open-file room (the core's
hosts/fds.rs) and reads everyone's, so all agree on which ranks share a host and on the TCP
streams per peer that every rank's open-file limit holds; then every rank publishes (pid, memfd,
TCP listening address when the group spans hosts, host) and reads everyone's.

Every rank first claims its number (a counter in the store). A number claimed by two processes (a
stale rank of another job on the same port, a launcher that started a rank twice) is an error on
every rank that sees it, naming both claimants, before connecting and again once connected, and
through the claims watch on every rank of a job already computing (admission.py): never a silent
first-come, where the job would compute with whichever process answered. A process of another job
is refused by its launcher's job identity, which every rank publishes and proves (admission.py).
The same process claiming again (destroy_process_group, then init on the same store) is a new
round, not a duplicate, and torchrun's restarts count as rounds of their own
(TORCHELASTIC_RESTART_COUNT), since its store outlives the workers. The checks cost each rank O(1)
store requests, whatever the world size.

What each rank reads. Every rank needs every rank's host id and room (the layout and the stream
count are computed alike everywhere from all of them), fetched in one request (`multi_get`, where
the store has it). Of the (pid, memfd, address) records it needs only its own host's (to map their
segments) and those of the ranks on other hosts that it dials, the higher-numbered ones (a lower
rank dials a higher one, hosts/mesh.rs); a rank that dials it needs no look-up, its listener
knows it by the key in its hello. So a rank reads world + (its host's ranks) + (higher remote
ranks) keys in a handful of requests, and a job about 1.5 x world^2 keys instead of 2 x world^2.
The host ids stay O(world) per rank: the layout needs them all.

The store's load is counted (`StoreCounter`): the keys this rank wrote and read and its requests,
for the last setup in this process in `last_setup()`, and on stderr with WIRESPEED_SETUP_STATS=1.
"""
from __future__ import annotations

import datetime
import os
import sys
import time

from .. import _native
from . import admission

admission.read_environment(os.environ)


class StoreCounter:
    """The store, counted: every request this rank's setup makes passes through here.

    `requests` counts calls into the store client, each a round trip or more to the server (a
    `multi_get` of many keys is one call; a call that waits for its keys may take torch's client
    more than one exchange). Anything not counted here is passed through as it is."""

    def __init__(self, store):
        self._store = store
        self.written = 0
        self.read = 0
        self.requests = 0
        self.bytes_read = 0

    def set(self, key, value):
        self.written += 1
        self.requests += 1
        return self._store.set(key, value)

    def get(self, key):
        self.read += 1
        self.requests += 1
        v = self._store.get(key)
        self.bytes_read += len(v)
        return v

    def get_many(self, keys: list[str]) -> list[bytes]:
        """The values of `keys` (waiting for each), in one request where the store can."""
        if not keys:
            return []
        many = getattr(self._store, "multi_get", None)
        if many is not None:
            try:
                vals = many(keys)
            except NotImplementedError:  # a store written in Python that lacks it
                vals = None
            if vals is not None:
                self.read += len(keys)
                self.requests += 1
                self.bytes_read += sum(len(v) for v in vals)
                return vals
        return [self.get(k) for k in keys]

    def add(self, key, amount):
        # add(key, 0) is a read of a counter; any other amount a write
        if amount:
            self.written += 1
        else:
            self.read += 1
        self.requests += 1
        return self._store.add(key, amount)

    def check(self, keys):
        self.read += len(keys)
        self.requests += 1
        return self._store.check(keys)

    def __getattr__(self, name):
        return getattr(self._store, name)

    def counts(self) -> dict:
        return {"keys_written": self.written, "keys_read": self.read, "requests": self.requests,
                "bytes_read": self.bytes_read}


_LAST: dict = {}


def last_setup() -> dict:
    """What the last rendezvous of this process cost: rank, world, the store's keys written and
    read, requests and bytes read, the records it read, and its seconds (empty before any)."""
    return dict(_LAST)


def needed_records(rank: int, hosts: list[str]) -> list[int]:
    """The ranks whose (pid, memfd, address) record `rank` reads: its host's (segments to map)
    and the higher-numbered ranks of other hosts (it dials them; lower ones dial it)."""
    mine = hosts[rank]
    return [r for r in range(len(hosts)) if r != rank and (hosts[r] == mine or r > rank)]


def _wait_count(store, key: str, seen: int, want: int, most_s: float) -> None:
    """Until the counter `key` (at `seen` when last read) reaches `want`, or `most_s` passed."""
    end = time.monotonic() + most_s
    try:
        while seen < want and time.monotonic() < end:
            time.sleep(0.01)
            seen = store.add(key, 0)
    except Exception:  # noqa: BLE001 (the store went away: nobody is left to wait for)
        pass


def streams_line(streams) -> str:
    """One line for users (WIRESPEED_SETUP_STATS) from the TCP streams a group chose at setup, as
    the group reports them: (opened, used, forced, probe seconds, steps of (streams, bytes/s))."""
    opened, used, forced, secs, steps = streams
    if forced:
        how = "WIRESPEED_NSTREAMS is set"
    elif not steps:
        how = "one stream opened, nothing to probe"
    else:
        by = ", ".join(f"{k}: {r * 8 / 1e9:.3f}" for k, r in steps)
        how = f"probe {secs * 1e3:.0f} ms, Gbit/s each way by streams {by}"
    return f"TCP streams per peer: {used} used of {opened} opened ({how})"


def knobs_under_environment(defaults: dict[str, str] | None) -> dict[str, str]:
    """`defaults` for core knobs, less those the environment sets (the user's setting wins): the
    knobs a group is given as data, which the core reads before the environment."""
    return {k: v for k, v in (defaults or {}).items() if k not in os.environ}


def rendezvous(store, rank: int, size: int, timeout: datetime.timedelta,
               knob_defaults: dict[str, str] | None = None):
    """A connected native group for `rank` of `size`, met through `store`. `knob_defaults`: core
    knobs (WIRESPEED_NSTREAMS, ...) for this group where the environment does not set them,
    handed to the core as data (its fd room and its group read them alike on every rank)."""
    t0 = time.monotonic()
    knobs = knobs_under_environment(knob_defaults)
    store = StoreCounter(store)
    n = admission.claim(store, rank)
    # This round's keys: a re-init on the same store must not read the last round's token or
    # addresses (every rank of a re-initialising job is at the same claim number).
    at = f"wirespeed/{admission.claims_round()}/{n}"
    if rank == 0:
        store.set(f"{at}/token", _native.random_token().hex())
    identity = admission.job_identity()
    token = admission.job_token(bytes.fromhex(store.get(f"{at}/token").decode()), identity)
    # With the host id, what this rank's open files allow (the core's FdRoom, text without a
    # comma): every rank hands all of them to the core, which picks the same TCP stream count on
    # every rank from them, or fails every rank alike when some rank's limit is too low. And the
    # digest of its job's identity, which every rank compares.
    store.set(f"{at}/host/{rank}", f"{_native.fd_room(knobs)},{admission.identity_digest(identity)},{_native.host_id()}")
    got = store.get_many([f"{at}/host/{r}" for r in range(size)])
    rooms, jobs, hosts = zip(*(v.decode().split(",", 2) for v in got))
    read = store.add(f"{at}/rooms-read", 1)
    try:
        admission.check_identities(rank, list(jobs), identity)
        group = _native.Group(rank, size, token, max(timeout.total_seconds(), 0.001), list(hosts), list(rooms), knobs)
    except Exception:
        # Every rank fails alike here (a limit too low, ranks that disagree, a rank of another
        # job), but rank 0, which serves the store under wirespeed's launchers and torch's
        # tcp:// init, must not leave before the others have read what they decide from: they
        # would meet a closed store instead of the same one-line error. (Only rank 0 waits: a
        # rank polling a store whose server leaves gets torch's stack trace on stderr.)
        if rank == 0:
            _wait_count(store, f"{at}/rooms-read", read, size, min(timeout.total_seconds(), 10.0))
        raise
    if rank == 0 and len(set(hosts)) > 1:
        admission.say_what_the_store_admits()
    pid, fd, host, addr = group.info()
    store.set(f"{at}/rank/{rank}", f"{pid},{fd},{addr},{host}")
    # Only the records this rank connects with (needed_records); the core reads no other entry
    # (a host's own ranks' segments, the addresses of the ranks it dials), so the rest stand in
    # as empty records of their host.
    want = needed_records(rank, list(hosts))
    infos = [(0, -1, hosts[r], "") for r in range(size)]
    infos[rank] = (pid, fd, host, addr)
    for r, v in zip(want, store.get_many([f"{at}/rank/{r}" for r in want])):
        p, f, a, h = v.decode().split(",", 3)
        infos[r] = (int(p), int(f), h, a)
    admission.check_claims(store, rank, n)
    group.connect(infos)
    admission.check_claims(store, rank, n)
    admission.watch(group, store._store, size, timeout.total_seconds())
    _LAST.clear()
    # Across hosts, the TCP streams per peer the core chose at setup (a probe between the first
    # two hosts, or WIRESPEED_NSTREAMS): (opened, used, forced, seconds, steps), else None.
    streams = group.streams
    _LAST.update(rank=rank, world=size, records_read=len(want), seconds=time.monotonic() - t0,
                 streams_used=streams[1] if streams else None,
                 streams_opened=streams[0] if streams else None, **store.counts())
    if os.environ.get("WIRESPEED_SETUP_STATS") == "1":
        c = _LAST
        # One write with its newline: ranks sharing a pipe otherwise run their lines together.
        sys.stderr.write(f"wirespeed: rank {rank} of {size} set up in {c['seconds']:.3f} s: store keys "
                         f"written {c['keys_written']}, read {c['keys_read']} ({c['records_read']} peers' "
                         f"records), {c['requests']} requests, {c['bytes_read']} bytes read"
                         + (f"; {streams_line(streams)}" if streams else "") + "\n")
        sys.stderr.flush()
    return group
