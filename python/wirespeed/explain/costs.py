"""The cost of a collective under a named algorithm, as counts the latency/bandwidth model prices.

For a job layout (which host each rank is on) and a size S, an algorithm is reduced to four
numbers, per link class (shm: inside a host; net: between hosts):

    steps  how many times a message must arrive before the next can start (each costs a latency)
    bytes  the bytes the busiest link of that class carries, one way

and the model's time is  shm_steps*a_shm + shm_bytes*b_shm + net_steps*a_net + net_bytes*b_net.

A step in which some messages cross hosts and others stay inside one is priced as a network step
only: messages of one step travel at the same time, and the network is the slower class. Several
ranks of a host sending across in the same step share that host's link, so their bytes add up on
it (this is how oversubscription of a host's link enters the model).

The algorithms are the textbook ones the libraries use: ring (reduce-scatter + all-gather for
all_reduce, n-1 steps of S/n for all_gather), binomial tree, recursive doubling, direct (every
message posted at once), and wirespeed's own across hosts, `hier` (its hierarchical all_reduce and
broadcast; for all_gather and reduce_scatter a ring host by host or direct, by size and host
count: docs/transport.md). Which one a
backend uses is in DEFAULTS; `--algo` names another.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import UsageError
from .fields import Layout

# wirespeed's core switches its leaders' all_reduce to recursive doubling at and below this size
# on a power of two of hosts (docs/transport.md, "Algorithms across hosts").
WIRESPEED_DOUBLING_MAX = 256 * 1024
# ... and runs all_gather and reduce_scatter on a ring, host by host, from this many bytes per
# rank's chunk on 3 hosts or more (below, and on 2 hosts, a direct exchange).
WIRESPEED_GATHER_RING_MIN = 64 * 1024


@dataclass(frozen=True)
class Terms:
    shm_steps: float = 0.0
    shm_bytes: float = 0.0
    net_steps: float = 0.0
    net_bytes: float = 0.0

    def __add__(self, o: "Terms") -> "Terms":
        return Terms(self.shm_steps + o.shm_steps, self.shm_bytes + o.shm_bytes,
                     self.net_steps + o.net_steps, self.net_bytes + o.net_bytes)

    def scaled(self, k: float) -> "Terms":
        return Terms(self.shm_steps * k, self.shm_bytes * k, self.net_steps * k, self.net_bytes * k)

    @property
    def uses_shm(self) -> bool:
        return self.shm_steps > 0 or self.shm_bytes > 0

    @property
    def uses_net(self) -> bool:
        return self.net_steps > 0 or self.net_bytes > 0


def step(layout: Layout, pairs, nbytes: float) -> Terms:
    """One step in which every (src, dst) pair sends nbytes at the same time."""
    pairs = [(a, b) for a, b in pairs if a != b]
    if not pairs:
        return Terms()
    out: dict[int, float] = {}
    into: dict[int, float] = {}
    for a, b in pairs:
        ha, hb = layout.host_of[a], layout.host_of[b]
        if ha != hb:
            out[ha] = out.get(ha, 0.0) + nbytes
            into[hb] = into.get(hb, 0.0) + nbytes
    if out:
        return Terms(net_steps=1, net_bytes=max(max(out.values()), max(into.values())))
    # Inside hosts only: ranks of one host share its memory system, pairs of different hosts not.
    per_host: dict[int, float] = {}
    for a, _ in pairs:
        per_host[layout.host_of[a]] = per_host.get(layout.host_of[a], 0.0) + nbytes
    return Terms(shm_steps=1, shm_bytes=max(per_host.values()) if nbytes else 0.0)


def ring_steps(layout: Layout, steps: int, chunk: float) -> Terms:
    """`steps` rounds in which rank r sends `chunk` bytes to rank r+1 (mod n), all at once."""
    n = layout.world
    return step(layout, [(r, (r + 1) % n) for r in range(n)], chunk).scaled(steps) if n > 1 else Terms()


def binomial(layout: Layout, nbytes: float, root: int = 0) -> Terms:
    """A binomial tree from `root` (broadcast; a reduce is the same tree run backwards)."""
    n = layout.world
    total = Terms()
    k = 1
    while k < n:
        pairs = [((root + i) % n, (root + i + k) % n) for i in range(k) if i + k < n]
        total = total + step(layout, pairs, nbytes)
        k *= 2
    return total


def doubling(layout: Layout, nbytes: float) -> Terms:
    """Recursive doubling all_reduce: log2(n) whole-buffer swaps; ranks beyond the largest power of
    two fold into a partner first and get the result back at the end."""
    n = layout.world
    p = 1 << (n.bit_length() - 1)
    total = Terms()
    extra = [(p + i, i) for i in range(n - p)]
    if extra:
        total = total + step(layout, extra, nbytes)
    k = 1
    while k < p:
        total = total + step(layout, [(i, i ^ k) for i in range(p)], nbytes)
        k *= 2
    if extra:
        total = total + step(layout, [(b, a) for a, b in extra], nbytes)
    return total


def chain(layout: Layout, nbytes: float) -> Terms:
    """A pipelined chain 0 -> 1 -> ... -> n-1 (broadcast as a ring): every link carries the buffer
    once, in pieces, and the last piece arrives n-1 hops after the first left."""
    n = layout.world
    once = step(layout, [(r, r + 1) for r in range(n - 1)], nbytes)
    hops = n - 2
    return once + (Terms(net_steps=hops) if once.uses_net else Terms(shm_steps=hops))


def direct(layout: Layout, pairs, nbytes: float) -> Terms:
    """Every message posted at once: one step."""
    return step(layout, pairs, nbytes)


def all_pairs(layout: Layout, nbytes: float) -> Terms:
    """Every rank sends `nbytes` to every other, all at once (`direct` over all n(n-1) pairs),
    counted per host instead of per pair: a host of k ranks sends and receives k(n-k) messages
    across, or k(k-1) inside when there is one host. Listing the pairs would take minutes from
    about 10,000 ranks on (n^2 of them); this takes one pass over the ranks."""
    ranks = layout.ranks_of_host()
    n = layout.world
    if n < 2:
        return Terms()
    if len(ranks) > 1:
        return Terms(net_steps=1, net_bytes=max(k * (n - k) for k in ranks.values()) * nbytes)
    return Terms(shm_steps=1, shm_bytes=n * (n - 1) * nbytes if nbytes else 0.0)


def _leaders(layout: Layout) -> Layout:
    return Layout(tuple(range(layout.hosts)))


def _shm_part(layout: Layout, nbytes: float, phases: int) -> Terms:
    """A shared-memory reduce or broadcast inside each host (wirespeed: about 2(K-1)/K of the
    buffer per phase through memory, one sync each)."""
    k = layout.per_host
    if k < 2:
        return Terms()
    return Terms(shm_steps=phases, shm_bytes=phases * (k - 1) / k * nbytes)


def _is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def hier_all_reduce(layout: Layout, nbytes: float) -> tuple[Terms, str]:
    """wirespeed's all_reduce across hosts: shm reduce onto each host's leader, an all_reduce among
    the leaders (recursive doubling for small messages on a power of two of hosts, else the
    pipelined ring), shm broadcast from the leader."""
    h = layout.hosts
    leaders = _leaders(layout)
    if h > 1 and _is_pow2(h) and nbytes <= WIRESPEED_DOUBLING_MAX:
        among, name = doubling(leaders, nbytes), "doubling"
    else:
        among, name = ring_steps(leaders, 2 * (h - 1), nbytes / h), "ring"
    return _shm_part(layout, nbytes, 2) + among, f"hier: shm + {name} among {h} host leaders"


def hier_broadcast(layout: Layout, nbytes: float) -> tuple[Terms, str]:
    """wirespeed's broadcast: the data crosses once to each other host's leader, shm inside hosts
    (modelled as direct sends from the root host's leader; the code runs a binomial tree)."""
    h = layout.hosts
    net = direct(_leaders(layout), [(0, j) for j in range(1, h)], nbytes)
    return net + _shm_part(layout, nbytes, 1), f"hier: root to {h - 1} leaders + shm"


def host_ring(layout: Layout, steps: int, chunk: float) -> Terms:
    """`steps` rounds of a ring that visits the ranks host by host (wirespeed's order): only one
    hop leaves each host, so a host's link carries one chunk per round each way, whatever the
    placement, where the rank-order ring (`ring_steps`) crosses at every hop of a round-robin
    placement."""
    if layout.world < 2:
        return Terms()
    if layout.hosts < 2:
        return ring_steps(layout, steps, chunk)
    # Every round, each host sends one chunk out and takes one in; messages inside hosts travel
    # in the same round (a network step, as `step` counts it).
    return Terms(net_steps=1, net_bytes=chunk).scaled(steps)


def hier_gather(layout: Layout, nbytes: float) -> tuple[Terms, str]:
    """wirespeed's all_gather and reduce_scatter across hosts: on 3 hosts or more, from
    WIRESPEED_GATHER_RING_MIN bytes per rank's chunk, a pipelined ring host by host (n-1 steps of
    S/n); otherwise every message at once (direct)."""
    n = layout.world
    if layout.hosts >= 3 and nbytes / n >= WIRESPEED_GATHER_RING_MIN:
        return host_ring(layout, n - 1, nbytes / n), f"hier: ring over {n} ranks, host by host"
    return all_pairs(layout, nbytes / n), "hier: direct (every message at once)"


def _one(fn):
    return lambda lay, s, name: (fn(lay, s), name)


# collective -> algorithm -> f(layout, S) -> Terms. S is the record's `bytes` (docs/metrics.md):
# the buffer for all_reduce/broadcast/reduce/send_recv, the gathered (all_gather) or scattered
# (reduce_scatter) total, the whole send buffer of all_to_all.
ALGORITHMS = {
    "all_reduce": {
        "ring": _one(lambda lay, s: ring_steps(lay, 2 * (lay.world - 1), s / lay.world)),
        "tree": _one(lambda lay, s: binomial(lay, s).scaled(2)),
        "doubling": _one(doubling),
        "hier": lambda lay, s, name: hier_all_reduce(lay, s),
    },
    "all_gather": {
        "ring": _one(lambda lay, s: ring_steps(lay, lay.world - 1, s / lay.world)),
        "direct": _one(lambda lay, s: all_pairs(lay, s / lay.world)),
        "hier": lambda lay, s, name: hier_gather(lay, s),
    },
    "reduce_scatter": {
        "ring": _one(lambda lay, s: ring_steps(lay, lay.world - 1, s / lay.world)),
        "direct": _one(lambda lay, s: all_pairs(lay, s / lay.world)),
        "hier": lambda lay, s, name: hier_gather(lay, s),
    },
    "broadcast": {
        "tree": _one(binomial),
        "ring": _one(lambda lay, s: chain(lay, s)),
        "direct": _one(lambda lay, s: direct(lay, [(0, j) for j in range(1, lay.world)], s)),
        "hier": lambda lay, s, name: hier_broadcast(lay, s),
    },
    "reduce": {
        "tree": _one(binomial),
        "direct": _one(lambda lay, s: direct(lay, [(j, 0) for j in range(1, lay.world)], s)),
    },
    "all_to_all": {
        "direct": _one(lambda lay, s: all_pairs(lay, s / lay.world)),
    },
    "send_recv": {
        "direct": _one(lambda lay, s: direct(lay, [(r, (r + 1) % lay.world) for r in range(lay.world)], s)),
    },
    "barrier": {
        "tree": _one(lambda lay, s: binomial(lay, 0).scaled(2)),
        "direct": _one(lambda lay, s: all_pairs(lay, 0)),
    },
}

# What each backend runs, as far as its documentation and source say (docs/predict.md).
DEFAULTS = {
    "gloo": {"all_reduce": "ring", "all_gather": "ring", "reduce_scatter": "ring",
             "broadcast": "tree", "reduce": "tree", "all_to_all": "direct",
             "send_recv": "direct", "barrier": "tree"},
    "wirespeed": {"all_reduce": "hier", "all_gather": "hier", "reduce_scatter": "hier",
                  "broadcast": "hier", "reduce": "direct", "all_to_all": "direct",
                  "send_recv": "direct", "barrier": "direct"},
}
FALLBACK = {"all_reduce": "ring", "all_gather": "ring", "reduce_scatter": "ring", "broadcast": "tree",
            "reduce": "tree", "all_to_all": "direct", "send_recv": "direct", "barrier": "tree"}

ALGO_NAMES = ("ring", "tree", "doubling", "hier", "direct")


def algorithm_for(backend: str, collective: str, algo: str | None) -> tuple[str, str]:
    """(algorithm, why): the one named by --algo, else the backend's own."""
    known = ALGORITHMS.get(collective)
    if known is None:
        raise UsageError(f"no cost model for collective {collective!r}")
    if algo and algo != "auto":
        if algo not in known:
            raise UsageError(f"--algo {algo} does not apply to {collective}: choose from "
                             f"{', '.join(known)} (or auto)")
        return algo, "--algo"
    table = DEFAULTS.get(backend)
    if table:
        return table[collective], f"{backend}'s"
    return FALLBACK[collective], f"assumed for {backend}"


def terms(collective: str, algo: str, layout: Layout, nbytes: float) -> tuple[Terms, str]:
    """The counts of `algo` for this collective, layout and size, and a short name of what ran."""
    if layout.world < 2:
        return Terms(), "one rank"
    return ALGORITHMS[collective][algo](layout, float(nbytes), algo)


def busbw_factor(collective: str, world: int) -> float:
    """nccl-tests' bus-bandwidth factor (docs/metrics.md); the same table as bench/collectives,
    here without torch (tests/unit/test_predict.py checks the two agree)."""
    n = world
    return {"all_reduce": 2 * (n - 1) / n, "all_gather": (n - 1) / n, "reduce_scatter": (n - 1) / n,
            "all_to_all": (n - 1) / n, "broadcast": 1.0, "reduce": 1.0, "send_recv": 1.0,
            "barrier": 0.0}[collective]


def count_for(collective: str, nbytes: int, itemsize: int, world: int) -> int:
    """The count column for a size, as the bench harness computes it (bench/collectives)."""
    if collective == "barrier":
        return 0
    if collective in ("all_gather", "reduce_scatter", "all_to_all"):
        return nbytes // itemsize // world * (world if collective == "all_to_all" else 1)
    return nbytes // itemsize
