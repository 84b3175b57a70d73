"""The store rendezvous that makes a connected native group.

Through whatever store torch hands the backend (TCPStore, FileStore, already prefixed per group),
so torchrun, SLURM and `wirespeed bench -N` launches work unchanged: rank 0 publishes a random job
token; every rank publishes its host id (hostname + boot id) with its open-file room (the core's
hosts/fds.rs), and rank 0 publishes them all as one compact layout, so all agree on which ranks
share a host and on the TCP streams per peer that every rank's open-file limit holds; then every
rank publishes (pid, memfd, TCP listening address when the group spans hosts, host) and reads
those it needs through its host leaders (below).

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

What each rank reads: O(world) bytes per job for the layout, not O(world^2). Every rank publishes
its host record (room, job digest, host id); rank 0 alone reads them all (one `multi_get`) and
publishes the layout as one short key (layout.py: host labels, rooms and digests run-length
encoded, ~100 bytes for ranks in blocks per host at any size), which every other rank reads and
expands into the lists the core takes, and every rank checks every digest against its own job.
The host ids become labels: the core only compares them (hosts/layout.rs); a rank's own record,
and its host mates', still carry the real id, which the shared-memory side checks.
Then the (pid, memfd, address) records go through the host leaders (a host's lowest rank): each
rank publishes its own, each leader reads its host's and publishes them as two keys, the (pid,
memfd) pairs with the host id once for its host mates (`host_records`) and the listening
addresses with the IP once for the other hosts (`host_addresses`, ~12 + 7 x ranks per host
bytes); a rank reads its host's first key (to map its segments) and the second key of every host
that holds a higher rank than it (it dials those first: a lower rank dials a higher one,
hosts/mesh.rs). It needs the lower ranks' addresses too, to dial a lower rank whose first dial
is late (one that died before its first message is then found at once, not at the timeout):
those come in its host's first key, where its leader, which reads every other host's second
key, puts the lower hosts' (so the leader publishes it after reading them). So a job of H hosts
x K ranks reads about N x H / 2 + H^2 / 2 keys, not 1.5 x N^2 (`scalemodel.store_load` counts
them exactly), and about 7 N^2 bytes of addresses, not ~130 N^2 bytes of host ids and records:
still N^2. Reading only the partners a job's collectives use
would need the core to ask for an address on its first dial to a rank; not done.

The store's load is counted (`StoreCounter`): the keys this rank wrote and read and its requests,
for the last setup in this process in `last_setup()`, and on stderr with WIRESPEED_SETUP_STATS=1.
"""
from __future__ import annotations

import datetime
import json
import os
import sys
import threading
import time

from .. import _native
from . import admission, layout

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
# The same, per thread: benchmarks/scale_rehearsal.py runs many ranks as threads of one process.
_LAST_HERE = threading.local()


def last_setup() -> dict:
    """What the last rendezvous of this process cost: rank, world, the store's keys written and
    read, requests and bytes read, the records it read, and its seconds (empty before any)."""
    return dict(_LAST)


def last_setup_here() -> dict:
    """`last_setup` for the last rendezvous made by the calling thread."""
    return dict(getattr(_LAST_HERE, "counts", {}))


def _members(hosts: list[str]) -> dict[str, list[int]]:
    """Each host's ranks, in rank order (the first is its leader)."""
    out: dict[str, list[int]] = {}
    for r, h in enumerate(hosts):
        out.setdefault(h, []).append(r)
    return out


def needed_hosts(rank: int, hosts: list[str]) -> list[str]:
    """The hosts whose gathered records `rank` reads itself: its own where it is not the leader
    (its host mates' segments to map, and the lower hosts' addresses: below), every other host
    holding a rank above it (it dials those), and, on a leader, every host below its own too
    (their addresses, which it passes on to its mates in its host's key). A rank needs the lower
    ranks' addresses to dial one whose first dial is late (mesh.rs: a rank that died before its
    first message is found at once by both sides). In host order."""
    members = _members(hosts)
    mine = hosts[rank]
    leader = members[mine][0] == rank
    return [h for h, rs in members.items()
            if (h == mine and not leader) or (h != mine and (leader or rs[-1] > rank))]


def lower_hosts(host: str, hosts: list[str]) -> list[str]:
    """The hosts entirely below `host` in host order (a host's lowest rank orders it): whose
    addresses its leader reads and passes on to its mates."""
    order = list(_members(hosts))
    return order[:order.index(host)]


def needed_records(rank: int, hosts: list[str]) -> list[int]:
    """The ranks whose (pid, memfd, address) record reaches `rank` (through `needed_hosts`' keys,
    or read by itself as a leader): every other rank of the job."""
    return [r for r in range(len(hosts)) if r != rank]


def rank_host_id(knobs: dict[str, str]) -> str:
    """This rank's host id as its group will take it: WIRESPEED_HOSTID given as data where not
    empty (the core reads knobs before the environment), else the environment's or the machine's."""
    return _native.host_id(knobs)


def host_records(infos: list[tuple[int, int, str, str]], lower: list[str] = ()) -> str:
    """What a host's other ranks need of its ranks' records, as one short text: the host id once
    (the shared-memory side checks it) and each rank's (pid, memfd); then the address keys of the
    hosts below it (`host_addresses`' texts, in host order), which its leader read."""
    return json.dumps([infos[0][2], [[p, f] for p, f, _, _ in infos], [json.loads(t) for t in lower]],
                      separators=(",", ":"))


def read_host_records(text: str) -> tuple[list[tuple[int, int, str, str]], list[list[str]]]:
    """`host_records`' text: the host's records, and the lower hosts' addresses, host by host."""
    host, recs, lower = json.loads(text)
    return ([(int(p), int(f), host, "") for p, f in recs],
            [read_host_addresses(json.dumps(t)) for t in lower])


def host_addresses(addrs: list[str]) -> str:
    """What ranks on other hosts need of a host's ranks' records: their listening addresses, the
    common part (the host's IP) once."""
    parts = [a.rpartition(":") for a in addrs]
    ip = parts[0][0] + parts[0][1]
    same = all(p[0] + p[1] == ip for p in parts)
    return json.dumps([ip if same else "", [a[len(ip):] if same else a for a in addrs]], separators=(",", ":"))


def read_host_addresses(text: str) -> list[str]:
    ip, rest = json.loads(text)
    return [ip + a for a in rest]


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
               knob_defaults: dict[str, str] | None = None, fd_room: str | None = None):
    """A connected native group for `rank` of `size`, met through `store`. `knob_defaults`: core
    knobs (WIRESPEED_NSTREAMS, WIRESPEED_HOSTID, ...) for this group where the environment does
    not set them, handed to the core as data (its fd room and its group read them alike on every
    rank). `fd_room`: the open-file room this rank publishes (`_native.fd_room`'s text), measured
    here when None; benchmarks/scale_rehearsal.py, which runs many ranks in one process, passes
    what one rank's own process would hold."""
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
    room = _native.fd_room(knobs) if fd_room is None else fd_room
    store.set(f"{at}/host/{rank}", f"{room},{admission.identity_digest(identity)},{rank_host_id(knobs)}")
    # Rank 0 alone reads every host record and publishes the layout compactly (layout.py); the
    # others read that one key: O(world) bytes through the store per job, not O(world^2).
    if rank == 0:
        got = store.get_many([f"{at}/host/{r}" for r in range(size)])
        rooms, jobs, ids = zip(*(v.decode().split(",", 2) for v in got))
        text = layout.encode(list(ids), list(rooms), list(jobs))
        store.set(f"{at}/layout", text)
    else:
        text = store.get(f"{at}/layout").decode()
    hosts, rooms, jobs = layout.decode(text, size)
    read = store.add(f"{at}/rooms-read", 1)
    try:
        # Every rank compares every digest with its own identity, so each names its own job in
        # its error (a rank of another job refuses this one's alike).
        admission.check_identities(rank, jobs, identity)
        group = _native.Group(rank, size, token, max(timeout.total_seconds(), 0.001), hosts, rooms, knobs)
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
    # The records through the host leaders: each gathers its host's and publishes them as two
    # keys, its ranks' (pid, memfd) for each other (host_records) and their addresses for the
    # other hosts (host_addresses). A rank reads its own host's first key (segments to map) and
    # the second of every host holding a rank above it (it may dial those; lower ones dial it,
    # mesh.rs).
    members = _members(hosts)
    mine = hosts[rank]
    here = members[mine]
    infos = [(0, -1, hosts[r], "") for r in range(size)]
    infos[rank] = (pid, fd, host, addr)
    want = needed_hosts(rank, hosts)
    keys = [f"{at}/hostrecs/{here[0]}" if h == mine else f"{at}/hostaddrs/{members[h][0]}" for h in want]
    if rank == here[0]:
        # The leader publishes its host's addresses first (they depend on nothing else), then
        # reads every other host's, and passes the lower hosts' on to its mates with their
        # (pid, memfd) pairs: a mate reads one key for all of them.
        for r, v in zip(here[1:], store.get_many([f"{at}/rank/{r}" for r in here[1:]])):
            p, f, a, h = v.decode().split(",", 3)
            infos[r] = (int(p), int(f), h, a)
        if len(members) > 1:
            store.set(f"{at}/hostaddrs/{rank}", host_addresses([infos[r][3] for r in here]))
        got = dict(zip(want, (v.decode() for v in store.get_many(keys))))
        if len(here) > 1:
            store.set(f"{at}/hostrecs/{rank}", host_records([infos[r] for r in here],
                                                            [got[h] for h in lower_hosts(mine, hosts)]))
    else:
        got = dict(zip(want, (v.decode() for v in store.get_many(keys))))
    for h, v in got.items():
        if h == mine:
            recs, lower = read_host_records(v)
            for r, info in zip(here, recs):
                if r != rank:
                    infos[r] = info
            for lh, addrs in zip(lower_hosts(mine, hosts), lower):
                for r, a in zip(members[lh], addrs):
                    infos[r] = (0, -1, lh, a)
        else:
            for r, a in zip(members[h], read_host_addresses(v)):
                infos[r] = (0, -1, h, a)
    admission.check_claims(store, rank, n)
    group.connect(infos)
    admission.check_claims(store, rank, n)
    admission.watch(group, store._store, size, timeout.total_seconds())
    # Across hosts, the TCP streams per peer the core chose at setup (a probe between the first
    # two hosts, or WIRESPEED_NSTREAMS): (opened, used, forced, seconds, steps), else None.
    streams = group.streams
    c = dict(rank=rank, world=size, records_read=len(needed_records(rank, hosts)),
             hosts_read=len(want), seconds=time.monotonic() - t0,
             streams_used=streams[1] if streams else None,
             streams_opened=streams[0] if streams else None, **store.counts())
    _LAST_HERE.counts = c
    _LAST.clear()
    _LAST.update(c)
    if os.environ.get("WIRESPEED_SETUP_STATS") == "1":
        # One write with its newline: ranks sharing a pipe otherwise run their lines together.
        sys.stderr.write(f"wirespeed: rank {rank} of {size} set up in {c['seconds']:.3f} s: store keys "
                         f"written {c['keys_written']}, read {c['keys_read']} ({c['records_read']} peers' "
                         f"records), {c['requests']} requests, {c['bytes_read']} bytes read"
                         + (f"; {streams_line(streams)}" if streams else "") + "\n")
        sys.stderr.flush()
    return group
