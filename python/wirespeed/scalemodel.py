"""What a wirespeed group costs each rank at setup, as a function of the layout: the exact parts
(sockets, store keys) in closed form, and the measured parts (threads, memory, setup time) as
fitted lines. benchmarks/scale_setup.py measures and fits; docs/scale.md has the figures.

The exact parts mirror the core and rendezvous.py, so a change there shows here as a test failure
(tests/netem/test_scale_sockets.py counts the sockets of real ranks against these):
- `pair_streams` is `Layout::pair_streams` (crates/wirespeed-core/src/hosts/mod.rs): the most
  streams a pair may open. A pair connected on first use opens one, and the rest on its first
  message of `grow_at` bytes or more (hosts/mesh.rs): `opened` says which, from the largest
  message the pair carried;
- `small_all_reduce_peers` is what the planner (plan.rs) and hosts/hier.rs make of a small
  all_reduce: connections are made on first use (hosts/mesh.rs), so a rank holds streams only
  with the peers its collectives used, and `tcp_sockets` (every remote pair) is the bound the
  open-file budget counts, reached once something like a large all_to_all has used every pair;
- `collective_peers` is what the four collectives across hosts (all_reduce, all_gather,
  reduce_scatter, all_to_all, small and mid) and the barrier leave a rank connected to, now
  that each goes through the host leaders (`streams_after_collectives` counts their streams);
- `store_load` follows rendezvous.py's requests one by one.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable


def blocked(hosts: int, per_host: int) -> list[int]:
    """Host of each rank when ranks fill hosts in blocks (0..K-1 on host 0, ...), as launchers
    place them by default."""
    return [r // per_host for r in range(hosts * per_host)]


def _locals(host_of: list[int]) -> list[int]:
    seen: dict[int, int] = {}
    out = []
    for h in host_of:
        out.append(seen.get(h, 0))
        seen[h] = out[-1] + 1
    return out


# transport/tcp/mod.rs MIN_SPLIT: the smallest chunk the engine cuts a message into.
MIN_SPLIT = 32 << 10


def grow_at(cap: int, grow: int | None = None) -> int:
    """`tcp::grow_at`: the least bytes of a message that open all `cap` streams of a pair
    (WIRESPEED_GROW_BYTES where given as `grow`; by default one chunk per stream)."""
    if cap <= 1:
        return 0
    return MIN_SPLIT * cap if grow is None else grow


def opened(cap: int, largest: int | None, grow: int | None = None) -> int:
    """Streams a pair that may have `cap` holds once connected on first use, after messages of at
    most `largest` bytes (None: all of them, as eager connections and the open-file budget
    count)."""
    if cap == 0 or largest is None:
        return cap
    return cap if largest >= grow_at(cap, grow) else 1


def pair_streams(host_of: list[int], local_of: list[int], a: int, b: int, nstreams: int) -> int:
    """TCP streams between ranks a and b: none on one host; `nstreams` between counterparts
    (same local index) and rank-order neighbours; one for every other remote pair."""
    world = len(host_of)
    if host_of[a] == host_of[b]:
        return 0
    if local_of[a] == local_of[b] or (a + 1) % world == b or (b + 1) % world == a:
        return nstreams
    return 1


def tcp_sockets(host_of: list[int], rank: int, nstreams: int = 12) -> int:
    """The TCP stream sockets `rank` holds once connected to every rank (its listener not
    included; a rank on its own host, itself too, counts none)."""
    return tcp_sockets_to(host_of, rank, range(len(host_of)), nstreams)


def small_all_reduce_peers(host_of: list[int], rank: int) -> list[int]:
    """The remote ranks the default all_reduce of a small buffer (up to ~50 KB on 8 hosts, ~75 KB
    on 4, any size on 2; the benchmark's 4 KiB) talks to, for ranks spread evenly over the hosts.
    The planner takes the hierarchy across hosts whenever a host holds more than one rank (and
    with one rank per host it is the same ring), so only host leaders (the lowest rank of each
    host) use TCP: among them recursive doubling when their number is a power of two (partners
    at distance 1, 2, 4, ... in host order), else the ring (both neighbours)."""
    local_of = _locals(host_of)
    if local_of[rank] != 0:
        return []
    leaders = [r for r in range(len(host_of)) if local_of[r] == 0]  # host order
    n, i = len(leaders), leaders.index(rank)
    if n < 2:
        return []
    if n & (n - 1) == 0:
        return sorted(leaders[i ^ (1 << k)] for k in range(n.bit_length() - 1))
    return sorted({leaders[(i + 1) % n], leaders[(i - 1) % n]})


def leader_partners(n: int, i: int) -> set[int]:
    """Positions (in host order) of the leaders that leader `i` of `n` exchanges with in the
    leaders' log-partner collectives: Bruck's all_to_all (algo/leaders_a2a.rs; round k: to i + 2^k,
    from i - 2^k) and all_gather (to i - 2^k, from i + 2^k), the dissemination barrier (to
    i + 2^k, from i - 2^k) and reduce_scatter's exchange among leaders, for 2^k < n. The other
    collectives' leader partners fall inside it: recursive doubling's i XOR 2^k is i + 2^k or
    i - 2^k at a power of two of leaders (otherwise its fold's partners are added), the ring's
    neighbours are i +- 1, the broadcast tree's parent and children (from host 0: setup's
    broadcast; gather's and scatter's, algo/leaders_gs.rs, from any root: i - low and i + 2^k
    modulo n) and setup's probe (leaders 0 and 1) differ by a power of two. The one place to
    change when a collective's partners change."""
    out: set[int] = set()
    d = 1
    while d < n:
        out |= {(i + d) % n, (i - d) % n}
        d *= 2
    out |= _doubling_partners(n, i)
    out.discard(i)
    return out


def _doubling_partners(n: int, i: int) -> set[int]:
    """Position i's partners in recursive doubling among n (algo/doubling.rs), which the
    all_to_all's agreement on its largest piece runs among the leaders at any n (hosts/hier.rs
    `agree`): with q = n minus the largest power of two <= n, positions 2j < 2q hand over to
    2j + 1, and the rest are renumbered 0..2^m for the rounds; at a power of two these are
    i XOR 2^k, inside the +-2^k above."""
    pow2 = 1 << (n.bit_length() - 1)
    q = n - pow2

    def real(v: int) -> int:
        return 2 * v + 1 if v < q else v + q

    if i < 2 * q and i % 2 == 0:
        return {i + 1}
    out = {i - 1} if i < 2 * q else set()
    v = i // 2 if i < 2 * q else i - q
    d = 1
    while d < pow2:
        out.add(real(v ^ d))
        d *= 2
    return out


def collective_peers(host_of: list[int], rank: int) -> list[int]:
    """The remote ranks `rank` holds TCP streams with after setup and every collective across
    hosts at the sizes the rehearsal runs (4 and 64 KiB: all_reduce hierarchical; all_gather,
    reduce_scatter and all_to_all through the leaders below their thresholds, gather and scatter
    through them at any size) and a barrier: a
    non-leader none (its collectives go to its leader over shared memory), a leader its
    `leader_partners`. Where the flat ring runs instead (WIRESPEED_ALGO=ring, all_gather and
    reduce_scatter from WIRESPEED_GATHER_RING_MIN on 3+ hosts) a rank adds its ring neighbours;
    a large all_to_all (pieces above WIRESPEED_A2A_LEADERS_MAX) every remote rank: not modelled
    here."""
    local_of = _locals(host_of)
    if local_of[rank] != 0:
        return []
    leaders = [r for r in range(len(host_of)) if local_of[r] == 0]  # host order
    return sorted(leaders[j] for j in leader_partners(len(leaders), leaders.index(rank)))


def streams_after_collectives(host_of: list[int], rank: int, nstreams: int = 12, largest: int | None = None) -> int:
    """The TCP streams `rank` holds after `collective_peers`' collectives, whose largest message
    between two leaders is `largest` bytes (`opened`; None: every stream of every partner)."""
    return tcp_sockets_to(host_of, rank, collective_peers(host_of, rank), nstreams, largest)


def leaders_largest_message(hosts: int, per_host: int, nbytes: int) -> int:
    """The largest message two host leaders exchange in the rehearsal's collectives across
    `hosts` hosts of `per_host` ranks, when each rank's buffer is `nbytes` (its all_reduce
    buffer, all_gather output, reduce_scatter input, all_to_all send, gather output): the
    all_reduce's whole buffer (doubling among the leaders; the ring's pieces are smaller), the
    other collectives' bundles at most a rank's buffer (they move host blocks of the output), and
    the all_to_all's Bruck rounds (algo/leaders_a2a.rs), whose round d moves the blocks of the
    destination hosts at an offset with bit d set, each block per_host^2 pieces of
    nbytes / ranks: half the hosts' blocks, per_host times a rank's buffer over two."""
    ranks = hosts * per_host
    piece = max(nbytes // 4 // ranks, 1) * 4
    a2a, d = 0, 1
    while d < hosts:
        a2a = max(a2a, sum(1 for i in range(1, hosts) if i & d) * per_host * per_host * piece)
        d *= 2
    return max(nbytes, a2a)


def tcp_sockets_to(host_of: list[int], rank: int, peers: Iterable[int], nstreams: int = 12,
                   largest: int | None = None) -> int:
    """The TCP stream sockets `rank` holds once it has used (or been used by) exactly `peers`,
    with messages of at most `largest` bytes (`opened`; None: every stream of every pair)."""
    local_of = _locals(host_of)
    return sum(opened(pair_streams(host_of, local_of, rank, p, nstreams), largest) for p in peers)


def tcp_sockets_blocked(hosts: int, per_host: int, rank: int, nstreams: int = 12) -> int:
    """`tcp_sockets` in closed form for the blocked layout, O(1): a rank has hosts-1
    counterparts and one neighbour on another host at each end of its host's block (2 when the
    host holds one rank and there are 3+ hosts: both neighbours are counterparts then); every
    other remote rank is one stream."""
    if hosts < 2:
        return 0
    world = hosts * per_host
    local = rank % per_host
    full = hosts - 1  # counterparts
    for n in ((rank - 1) % world, (rank + 1) % world):
        if n // per_host != rank // per_host and n % per_host != local:
            full += 1
    remote = world - per_host
    return full * nstreams + (remote - full)


@dataclass
class StoreLoad:
    written: int
    read: int
    requests: int


def _members(host_of: list[int]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for r, h in enumerate(host_of):
        out.setdefault(h, []).append(r)
    return out


def hosts_read(host_of: list[int], rank: int) -> int:
    """Host keys of gathered records `rank` reads (rendezvous.needed_hosts): its own host's unless
    it leads it, every other host's that holds a higher rank, and on a leader every other host's."""
    mine = host_of[rank]
    members = _members(host_of)
    leader = members[mine][0] == rank
    return sum(1 for h, rs in members.items()
               if (h == mine and not leader) or (h != mine and (leader or rs[-1] > rank)))


def records_read(host_of: list[int], rank: int) -> int:
    """Peers' (pid, memfd, address) records that reach `rank` (rendezvous.needed_records): all."""
    return len(host_of) - 1


def store_load(host_of: list[int], rank: int) -> StoreLoad:
    """wirespeed's own store traffic for `rank` at setup (torch's init adds its own; not here),
    following rendezvous.py request by request:
    writes: claim counter, claimant, host record, rooms-read counter, record; + token and layout
    on rank 0; + on a host leader, its host's (pid, memfd) pairs where it has mates, and its
    host's addresses where the job spans hosts;
    reads: token; every host record (rank 0, one multi_get) or the layout (the others); a
    leader its host mates' records (one multi_get); the host keys it needs (one multi_get); two
    claim checks of two keys each."""
    members = _members(host_of)
    here = members[host_of[rank]]
    leader = here[0] == rank
    w = 5 + 2 * (rank == 0) + leader * ((len(here) > 1) + (len(members) > 1))
    hk = hosts_read(host_of, rank)
    mates = len(here) - 1 if leader else 0
    read = 1 + (len(host_of) if rank == 0 else 1) + mates + hk + 4
    requests = w + 1 + 1 + (1 if mates else 0) + (1 if hk else 0) + 4
    return StoreLoad(w, read, requests)


def job_store_reads(hosts: int, per_host: int) -> int:
    """Keys read from the store by all ranks of a blocked job, in closed form: 5N for tokens and
    claim checks, 2N - 1 for the host records (rank 0) and the layout (the others), H(K - 1) by
    the leaders and H(K - 1) by the others for their host's records, K(H - 1 - h) host keys
    by each rank of host h, and h more by host h's leader (the lower hosts' addresses): N x H / 2
    + H^2 / 2 in all, the part that grows."""
    n = hosts * per_host
    return (7 * n - 1 + 2 * hosts * (per_host - 1) + per_host * hosts * (hosts - 1) // 2
            + hosts * (hosts - 1) // 2)


def fit_line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least squares y = a + b x."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    return my - b * mx, b


def rel_errors(pred: list[float], meas: list[float]) -> list[float]:
    return [(p - m) / m if m else 0.0 for p, m in zip(pred, meas)]
