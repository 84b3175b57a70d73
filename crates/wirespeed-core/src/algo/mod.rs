//! Collective algorithms, each written once over the `Transport` trait (transport/mod.rs), so the
//! same code runs over TCP between hosts, over shared memory and TCP mixed (hosts/), and over
//! the in-memory simulator in tests. Each file opens with its protocol, step by step.
//!
//! - ring.rs: pipelined ring all_reduce, all_gather and reduce_scatter (bandwidth-optimal);
//! - doubling.rs: recursive doubling all_reduce (latency-optimal, any member count);
//! - tree.rs: binomial broadcast and reduce;
//! - leaders_a2a.rs: all_to_all across hosts through the host leaders (Bruck's exchange among
//!   them: O(log hosts) partners each);
//! - direct.rs: every pair at once: all_gather, all_to_all, reduce_scatter, gather, scatter
//!   (on one host), and the dissemination barrier;
//! - leaders.rs: all_gather, reduce_scatter, barrier and reduce across hosts through the host
//!   leaders (a rank talks to its leader, a leader to O(log hosts) leaders);
//! - leaders_gs.rs: gather and scatter across hosts through the host leaders (a binomial tree
//!   over them, rooted at the root's leader).
//!
//! Conventions: `members` lists the global ranks taking part (this rank among them) in a fixed
//! order every member agrees on; `avg_world` is what avg divides by (the whole group's size,
//! which is more than the members when the algorithm runs among host leaders). Buffers are
//! element-aligned byte slices. A reduction combines partial results in an order fixed by
//! positions, never by arrival, so every rank ends with identical bits.
//!
//! Buffers and errors. An algorithm posts its buffers (and its scratch) to the transport, which
//! may read or write them until each handle is waited or the transport is shut down
//! (`Transport`'s contract). On success every handle is waited before the function returns. On an
//! error it returns at once (`?`), possibly with handles still posted: its caller must then shut
//! the transport down before those buffers go. `hosts::Group::guarded` does (it shuts every
//! connection), and the simulator stops a rank whose program fails. The functions taking
//! `&mut [u8]` are safe to call only under that rule; the SAFETY lines below rely on it.
use crate::dtype::{DType, ReduceOp};
use crate::kernels::reduce::reduce_many;

pub mod direct;
pub mod doubling;
pub mod leaders;
pub mod leaders_a2a;
pub mod leaders_gs;
pub mod ring;
pub mod tree;

/// Position of `rank` in `members`.
pub(crate) fn position(members: &[usize], rank: usize) -> crate::error::Result<usize> {
    members.iter().position(|&r| r == rank).ok_or_else(|| crate::error::Error::Unsupported(format!("rank {rank} is not among the members {members:?}")))
}

/// dst = a (op) b, elementwise, in that order; dst may alias a or b.
///
/// # Safety
/// Each pointer covers `count` elements of `dtype`, aligned for it; `dst` is `a`, `b` or
/// disjoint from both; nothing else writes them during the call.
pub(crate) unsafe fn combine(dst: *mut u8, a: *const u8, b: *const u8, count: usize, dtype: DType, op: ReduceOp) {
    // SAFETY: this fn's contract is reduce_many's, for the sources [a, b].
    unsafe { reduce_many(dst, &[a, b], count, dtype, op, 2) }
}

/// buf /= n (avg's division, done once on the sum).
pub(crate) fn divide(buf: &mut [u8], dtype: DType, n: usize) {
    let p = buf.as_mut_ptr();
    // SAFETY: `buf` is a live &mut slice: dst and its one source (itself, the same offset) hold
    // buf.len() / size elements that nothing else touches. Callers pass element-aligned buffers
    // (the conventions above: a piece of a `Collectives` buffer, or the scratch).
    unsafe { reduce_many(p, &[p as *const u8], buf.len() / dtype.size(), dtype, ReduceOp::Avg, n) }
}

/// The op partial results are combined with: avg sums, and divides once at the end.
pub(crate) fn summing(op: ReduceOp) -> ReduceOp {
    if op == ReduceOp::Avg { ReduceOp::Sum } else { op }
}

/// A scratch buffer of at least `n` bytes, kept by the caller between calls.
pub(crate) fn scratch(s: &mut Vec<u8>, n: usize) -> &mut [u8] {
    if s.len() < n {
        *s = vec![0u8; n.next_power_of_two()];
    }
    &mut s[..n]
}
