"""`wirespeed links` without ranks: which pairs to time in which round, the matrices as text, and the
rule that names what is slow. Pure functions of host names and measured figures.

Rounds. Two pairs timed at once must not share a link, or each would read half of it. With one
rank per host a pair's traffic crosses exactly its two hosts' links, so a round is a set of pairs
that share no host; the circle method (fix one player, rotate the others) splits the n(n-1)/2 pairs
of n hosts into n-1 such rounds (n rounds for odd n), the fewest possible. Several ranks of one
host are measured in the same way, one pair per host per round, placed greedily in circle order.

The rule (docs/links.md). Compare like with like: pairs that cross hosts when there are several
hosts (pairs inside one host ride shared memory or loopback, another class), else the pairs inside
the one host. Each host (each rank, on one host) gets a score, the median GB/s over its pairs in
both directions; a host is slow when its score is below half the median of all scores. A slow link
between two hosts whose other links are fine (a bad cable between switches) is a pair below half
the median pair. With two hosts there is one link and nothing to hold it against: no verdict.
"""
from __future__ import annotations

from dataclasses import dataclass
from statistics import median

SLOW_FRACTION = 0.5


def circle_order(n: int) -> list[list[tuple[int, int]]]:
    """Round-robin tournament over 0..n-1: rounds of disjoint pairs covering every pair once."""
    players = list(range(n)) + ([None] if n % 2 else [])
    m = len(players)
    rounds = []
    for _ in range(m - 1):
        pairs = []
        for i in range(m // 2):
            a, b = players[i], players[m - 1 - i]
            if a is not None and b is not None:
                pairs.append((min(a, b), max(a, b)))
        rounds.append(pairs)
        players = [players[0], players[-1], *players[1:-1]]
    return rounds


def schedule(host_of: list[int]) -> list[list[tuple[int, int]]]:
    """Rounds of pairs of units (ranks) in which no host takes part twice."""
    order = [p for rnd in circle_order(len(host_of)) for p in rnd]
    rounds: list[list[tuple[int, int]]] = []
    busy: list[set[int]] = []
    for a, b in order:
        hosts = {host_of[a], host_of[b]}
        for rnd, used in zip(rounds, busy):
            if not hosts & used:
                rnd.append((a, b))
                used |= hosts
                break
        else:
            rounds.append([(a, b)])
            busy.append(set(hosts))
    return rounds


@dataclass
class Verdict:
    slow: list[tuple[str, float]]           # (what, its GB/s)
    median_gbps: float | None
    compared: str                           # what was compared, for the explanation line
    note: str = ""

    def line(self) -> str:
        if not self.slow:
            return "slow: none"
        return "slow: " + ", ".join(f"{what} ({v:.3g} GB/s vs {self.median_gbps:.3g} median)"
                                    for what, v in self.slow)


def find_slow(labels: list[str], host_of: list[int], gbps: dict[tuple[int, int], float],
              host_names: list[str] | None = None) -> Verdict:
    """Name the slow hosts (or ranks, on one host) and links from directed pair bandwidths.
    labels: one per unit (rank); host_of: the unit's host index; host_names: per host index."""
    cross = {k: v for k, v in gbps.items() if host_of[k[0]] != host_of[k[1]]}
    if cross:
        hosts = sorted(set(host_of))
        host_label = {h: (host_names[h] if host_names else labels[host_of.index(h)]) for h in hosts}
        if len(hosts) < 3:
            return Verdict([], median(cross.values()), "links between hosts",
                           note="two hosts share one link: there is no other link to hold it against")
        units = {h: host_label[h] for h in hosts}
        unit_of = host_of
        pairs, compared = cross, "links between hosts"
    else:
        if len(labels) < 3:
            return Verdict([], median(gbps.values()) if gbps else None, "pairs inside the host",
                           note="two ranks: one pair, nothing to hold it against")
        units = {i: labels[i] for i in range(len(labels))}
        unit_of = list(range(len(labels)))
        pairs, compared = gbps, "pairs of ranks inside the host"
    scores = {}
    for u in units:
        mine = [v for (a, b), v in pairs.items() if unit_of[a] == u or unit_of[b] == u]
        if mine:
            scores[u] = median(mine)
    mid = median(scores.values())
    slow = [(units[u], s) for u, s in scores.items() if s < SLOW_FRACTION * mid]
    slow_units = {u for u, s in scores.items() if s < SLOW_FRACTION * mid}
    # Links: the slower direction of each unordered pair of units neither of which is slow.
    link: dict[tuple, float] = {}
    for (a, b), v in pairs.items():
        ua, ub = unit_of[a], unit_of[b]
        key = (min(ua, ub), max(ua, ub))
        link[key] = min(link.get(key, v), v)
    link_mid = median(link.values())
    for (ua, ub), v in sorted(link.items()):
        if ua not in slow_units and ub not in slow_units and v < SLOW_FRACTION * link_mid:
            slow.append((f"{units[ua]}<->{units[ub]}", v))
    return Verdict(slow, mid, compared)


def matrix_text(labels: list[str], values: dict[tuple[int, int], float], fmt: str) -> str:
    """Rows send, columns receive; '-' on the diagonal and for pairs not measured."""
    w = max(8, max(len(s) for s in labels) + 1)
    lines = [" " * w + "".join(f"{s:>{w}}" for s in labels)]
    for i, src in enumerate(labels):
        row = f"{src:>{w}}"
        for j in range(len(labels)):
            v = values.get((i, j))
            row += f"{'-' if v is None else format(v, fmt):>{w}}"
        lines.append(row)
    return "\n".join(lines)
