//! A group whose ranks live on several hosts: ranks are grouped by host id; the ranks of one host
//! form a shared-memory `Comm` (its own local numbering), and every pair of ranks on different
//! hosts is joined by TCP (mesh.rs). Point-to-point goes over whichever of the two joins a pair.
//!
//! Streams per pair (`HostLayout::pair_streams`). The bandwidth paths get WIRESPEED_NSTREAMS streams:
//! a rank and its counterpart on every other host (same local index: the host leaders, which
//! carry the hierarchical all_reduce and broadcast, and the pairs pipeline parallelism sends
//! between) and its neighbours in rank order (the flat ring). Every other pair gets one stream:
//! it carries direct exchanges, which already spread over many pairs. Sockets per rank are then
//! about (hosts + 2) x nstreams + remote ranks, instead of nstreams x remote ranks (at 64 hosts
//! x 8 ranks and 12 streams: 1,244 instead of 6,048). Before any is opened, fds.rs budgets them
//! against every rank's open-file limit and may give the bandwidth pairs fewer streams. These
//! are the most a pair opens: connected on first use, a pair opens one stream and the rest only
//! on its first message large enough to use them (mesh.rs, "Streams opened by use").
//!
//! The group's algorithms (algo/, hier.rs, probe.rs) run over its `Route` (route.rs), the one
//! `Transport` of the group: shared memory to peers of its host, the mesh's own `Transport` to
//! the others. The route holds no collective, so an algorithm never calls back into the group.
//! Collectives across hosts:
//! - all_reduce: hierarchical (shm reduce to each host's leader, ring or recursive doubling among
//!   leaders, shm broadcast from the leader; hier.rs), or a flat ring over all ranks with
//!   WIRESPEED_ALGO=ring (algo/ring.rs).
//! - broadcast: a shm broadcast inside the root's host, a binomial
//!   tree over the hosts' leaders (algo/tree.rs), then a shm broadcast inside every other host,
//!   so the payload crosses each host's link once, between leaders.
//! - all_gather, reduce_scatter: across 3 hosts or more, from `Tuning::gather_ring_min` bytes per
//!   rank's chunk, a ring over every rank (algo/ring.rs) in `Group::ring_order`
//!   (`Tuning::gather_on_ring` says why); below it, through the host leaders (algo/leaders.rs):
//!   each rank hands its piece or chunks to its leader over shared memory, the leaders run
//!   Bruck's all_gather (or its transpose, a reduce_scatter) among themselves, and each leader
//!   hands its ranks the result. A rank then talks to its leader only, a leader to its host's
//!   ranks and at most 2 ceil(log2 hosts) - 1 leaders: 20 peers at 1,024 hosts x 2 and 18 at
//!   64 x 8 in the simulator (tests/sim_peers.rs), where a direct exchange reaches every rank.
//!   Direct exchanges (algo/direct.rs) on one host (a group of this kind with a single host
//!   id) and across two hosts from the threshold on (no ring there, and the leaders would stage
//!   whole outputs in scratch).
//! - barrier: non-leaders notify their leader, the leaders run the dissemination barrier, each
//!   leader releases its ranks (algo/leaders.rs; on one host, dissemination over all ranks).
//! - reduce: each leader folds its host's buffers, a binomial tree over the leaders toward the
//!   root's leader, which hands the result to the root (algo/leaders.rs; on one host, a binomial
//!   tree over all ranks, algo/tree.rs).
//! - all_to_all: through the host leaders (algo/leaders_a2a.rs: non-leaders to their leader,
//!   Bruck's exchange among leaders, back) when the largest piece anywhere is at most
//!   `Tuning::a2a_leaders_max` (the ranks agree on it first: `Group::a2a_through_leaders`);
//!   larger, a direct exchange (algo/direct.rs), its data being pairwise.
//! - gather, scatter: through the host leaders (algo/leaders_gs.rs): each rank hands its leader
//!   its length and piece over shared memory, a binomial tree over the leaders rooted at the
//!   root's leader carries each subtree's pieces up with their length table, and the root's
//!   leader hands the root everything (scatter: the same paths backwards). A rank talks to its
//!   leader only, a leader to its host's ranks and at most ceil(log2 hosts) leaders (its tree
//!   parent and children): 11 peers at 1,024 hosts x 2 in the simulator (tests/sim_peers.rs),
//!   where the direct exchange makes the root talk to every rank. At any size
//!   (`Group::rooted_algo` says why); the direct exchange with only the root's pieces
//!   (algo/direct.rs) on one host.
//!
//! Every message of a collective carries a tag made of the collective, dtype, op, root and a
//! sequence number, so ranks that call different collectives (or the same one with a different
//! dtype, op or root) get a `Mismatch` on the receiving side instead of mixed data; sizes are
//! checked by every receive. Such an error is seen by the receiver only, so any error breaks the
//! group: the local segment says why (local peers raise at once) and the TCP connections are shut
//! (remote peers raise at once).
pub mod fds;
mod group;
pub mod hier;
mod layout;
mod links;
pub mod mesh;
pub mod probe;
mod route;
#[cfg(test)]
mod lazy_tests;

// The group by its folder's name; outside the core only the testing door names these two.
#[cfg_attr(not(feature = "testing"), allow(unused_imports))]
pub use group::{Group, Setup};
#[cfg_attr(not(feature = "testing"), allow(unused_imports))]
pub use layout::HostLayout;
