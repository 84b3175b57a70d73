"""tc programs that cap a host's link, and optionally each TCP flow on it, with htb.

Why htb: it exists on every kernel we met, where fq, sfq, fq_codel, netem and the `flow` classifier
may not (the development kernel has htb, tbf, pfifo/bfifo and u32 only). One qdisc kind for the
link cap and the per-flow caps keeps the two consistent.

A link is capped in both directions: the host's own veth end shapes what it sends (its NIC's
transmit rate), and the switch's end shapes what reaches the host (the switch port's rate). A host
that receives from three peers at once therefore gets R in total, as on a real full-duplex link.

Per-flow caps (--flow-rate): the kernel here has no flow-hashing classifier, so u32 hashes the TCP
ports in two levels: FLOW_BITS bits of the source port pick one of 2**FLOW_BITS tables, the same bits
of the destination port pick a bucket inside it, and each bucket is its own htb class with
ceil = flow rate. The bits are 1..FLOW_BITS, not 0..: Linux gives connect() even ports and bind(0)
odd ones, so bit 0 carries no information, while successive connections to one peer get ports 2
apart, which bits 1.. tell apart.
Two flows share a class only if both port hashes collide: 1 in 2**(2*FLOW_BITS) for unrelated ports,
1 in 2**FLOW_BITS for flows that share one port (many clients of one listener). Every per-flow class
borrows from the link class, whose ceil is the link rate, so the flows together never exceed it.
The hash assumes a 20-byte IPv4 header (Linux sends no IP options); other packets use the default
class, capped at the link rate only.
"""
from __future__ import annotations

from .units import tc_rate

FLOW_BITS = 5                  # 32 x 32 = 1024 per-flow classes per host
LINK_CLASS = "1:1"
DEFAULT_CLASS = "1:2"          # everything not hashed as a TCP flow
FIRST_FLOW_CLASS = 0x100
L1_TABLE = 0x2                 # u32 hash table ids (12-bit handles)
L2_TABLE0 = 0x100
QUANTUM = 30000                # DRR quantum in bytes: same for every class, so sharing is fair


def _queue_limit_bytes(rate_bps: int) -> int:
    """A bounded queue (bfifo) of ~20 ms at the link rate, at least a few 64 KB GSO packets.

    Unbounded queues (pfifo with 1000 GSO packets = 64 MB) would let TCP build seconds of
    queueing delay at low rates; too small ones make TCP back off below the cap.
    """
    return max(rate_bps // 8 // 50, 4 * 65536)


SEGMENTS_PER_S = 20_000  # what the 2-core machine switches beside the ranks' own work


def segment_limit_bytes(rate_bps: int, cluster_bps: int) -> int:
    """The largest packet TCP may hand a capped device at once (its gso_max_size): about 100 us
    of the link's rate, but no smaller than lets every link of the cluster (`cluster_bps`, their
    sum) run full at SEGMENTS_PER_S in all; at least two full frames, at most the kernel's
    default of 64 KiB.

    htb lets a packet through whenever its bucket is not empty and charges it afterwards, so one
    64 KiB GSO packet crosses at the veth's speed: on a 200 Mbit/s link a loop of 160 KiB measured
    3% above the cap, and a 12.5 KiB segment still let a 40 KiB loop claim 10% more. The floor
    from the packet budget: 8 hosts of 1 Gbit/s with 100 us segments (80,000 a second) were
    CPU-bound on two cores and ran 45% slower than their links."""
    by_time = rate_bps // 8 // 10_000
    by_budget = cluster_bps // 8 // SEGMENTS_PER_S
    return max(2 * 1514, min(65536, max(by_time, by_budget)))


def link_program(dev: str, rate_bps: int, delay_s: float | None = None) -> list[str]:
    """Cap everything leaving `dev` at rate_bps; add netem delay in the queue when asked."""
    r = tc_rate(rate_bps)
    lines = [
        f"qdisc add dev {dev} root handle 1: htb default 1",
        f"class add dev {dev} parent 1: classid {LINK_CLASS} htb rate {r} ceil {r} quantum {QUANTUM}",
    ]
    if delay_s:
        # netem both delays and queues; its limit is in packets, sized like the bfifo above.
        limit = max(_queue_limit_bytes(rate_bps) // 1500, 100)
        lines.append(f"qdisc add dev {dev} parent {LINK_CLASS} handle 10: netem "
                     f"delay {int(round(delay_s * 1e6))}us limit {limit}")
    else:
        lines.append(f"qdisc add dev {dev} parent {LINK_CLASS} handle 10: bfifo "
                     f"limit {_queue_limit_bytes(rate_bps)}")
    return lines


def flow_classes() -> int:
    return 1 << (2 * FLOW_BITS)


def host_egress_program(dev: str, rate_bps: int, flow_rate_bps: int | None) -> list[str]:
    """The host's transmit side: a link cap, and per-flow caps below it when flow_rate_bps is set."""
    if not flow_rate_bps:
        return link_program(dev, rate_bps)
    n = 1 << FLOW_BITS
    r, f = tc_rate(rate_bps), tc_rate(flow_rate_bps)
    # Guaranteed rates sum to at most the link rate (else htb lets classes under their own rate send
    # past the parent's ceil); everything above the share is borrowed from the link class.
    share = tc_rate(max(rate_bps // (flow_classes() + 1), 8000))
    limit = _queue_limit_bytes(flow_rate_bps)
    lines = [
        f"qdisc add dev {dev} root handle 1: htb default 2",
        f"class add dev {dev} parent 1: classid {LINK_CLASS} htb rate {r} ceil {r} quantum {QUANTUM}",
        f"class add dev {dev} parent {LINK_CLASS} classid {DEFAULT_CLASS} htb rate {share} ceil {r} "
        f"quantum {QUANTUM}",
        f"qdisc add dev {dev} parent {DEFAULT_CLASS} handle 2: bfifo limit {_queue_limit_bytes(rate_bps)}",
        f"filter add dev {dev} parent 1: prio 1 handle {L1_TABLE:x}: protocol ip u32 divisor {n}",
    ]
    for i in range(n):
        lines.append(f"filter add dev {dev} parent 1: prio 1 handle {L2_TABLE0 + i:x}: protocol ip "
                     f"u32 divisor {n}")
    # TCP with a plain 20-byte IP header: hash bits 1.. of the source port (bytes 20-21).
    lines.append(f"filter add dev {dev} parent 1: prio 1 protocol ip u32 ht 800:: "
                 f"match ip protocol 6 0xff match ip ihl 5 0xf "
                 f"hashkey mask 0x{(n - 1) << 17:08x} at 20 link {L1_TABLE:x}:")
    for i in range(n):
        # Then bits 1.. of the destination port (bytes 22-23) pick the bucket inside table i.
        lines.append(f"filter add dev {dev} parent 1: prio 1 protocol ip u32 ht {L1_TABLE:x}:{i:x}: "
                     f"match u32 0 0 hashkey mask 0x{(n - 1) << 1:08x} at 20 link {L2_TABLE0 + i:x}:")
        for j in range(n):
            cid = FIRST_FLOW_CLASS + i * n + j
            lines += [
                f"class add dev {dev} parent {LINK_CLASS} classid 1:{cid:x} htb rate {share} ceil {f} "
                f"quantum {QUANTUM}",
                f"qdisc add dev {dev} parent 1:{cid:x} handle {cid:x}: bfifo limit {limit}",
                f"filter add dev {dev} parent 1: prio 1 protocol ip u32 ht {L2_TABLE0 + i:x}:{j:x}: "
                f"match u32 0 0 flowid 1:{cid:x}",
            ]
    return lines
