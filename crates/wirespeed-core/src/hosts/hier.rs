//! Hierarchical all_reduce, the default across hosts: shm reduce onto each host's leader (its
//! lowest rank), an all_reduce among the leaders over TCP, shm broadcast from the leader. Each
//! host's link carries the buffer about twice whatever the number of ranks per host, where a flat
//! ring over ranks placed round robin sends every hop over a link.
//!
//! Among the leaders the planner (plan.rs) picks the ring (algo/ring.rs: 2(H-1) messages, each link
//! carries 2·S·(H-1)/H each way) or, for small messages and a power-of-two number of hosts,
//! recursive doubling (algo/doubling.rs: log2(H) messages of the whole buffer).
use super::route::Route;
use crate::dtype::{DType, ReduceOp};
use crate::error::Result;
use crate::api::Collectives;
use crate::plan::{NetAlgo, Tuning};

pub(super) fn all_reduce(r: &mut Route, tuning: &Tuning, scratch: &mut Vec<u8>, tag: u64, buf: &mut [u8], dtype: DType, op: ReduceOp) -> Result<()> {
    let among = tuning.pick_among_leaders(buf.len(), r.lay.hosts.len());
    all_reduce_with(r, among, scratch, tag, buf, dtype, op)
}

/// An all_reduce of a few bytes that the ranks must agree on before an op (all_to_all's largest
/// piece, group.rs): as `all_reduce`, with recursive doubling among the leaders whatever their
/// number (doubling.rs folds a non-power of two in two more steps), log2(hosts) + 2 latencies
/// where the planner's ring among a non-power of two of leaders would take 2(hosts - 1).
pub(super) fn agree(r: &mut Route, scratch: &mut Vec<u8>, tag: u64, buf: &mut [u8], dtype: DType, op: ReduceOp) -> Result<()> {
    all_reduce_with(r, NetAlgo::Doubling, scratch, tag, buf, dtype, op)
}

/// `all_reduce` with `among` (Ring or Doubling) among the leaders.
fn all_reduce_with(r: &mut Route, among: NetAlgo, scratch: &mut Vec<u8>, tag: u64, buf: &mut [u8], dtype: DType, op: ReduceOp) -> Result<()> {
    let count = buf.len() / dtype.size();
    // avg: sum inside hosts; the leaders' all_reduce divides by the whole world once.
    let local_op = if op == ReduceOp::Avg { ReduceOp::Sum } else { op };
    let nlocal = r.lay.hosts[r.my_host()].len();
    let addr = buf.as_mut_ptr() as usize;
    if nlocal > 1 {
        // SAFETY: `buf` is our &mut slice of `count` elements for this whole call, and
        // nothing else touches it: reduced in place on the leader (local rank 0), input
        // elsewhere, as Comm::reduce's contract asks.
        unsafe { r.local.reduce(addr, count, dtype, local_op, 0)? };
    }
    if r.is_leader() {
        leaders_all_reduce(r, among, scratch, tag, buf, dtype, op)?;
    }
    if nlocal > 1 {
        // SAFETY: as for the reduce: `buf`, ours for the call, is read on the leader and
        // written on the host's other ranks.
        unsafe { r.local.broadcast((addr, buf.len()), 0)? };
    }
    Ok(())
}

/// The all_reduce among host leaders inside the hierarchy: ring or doubling.
fn leaders_all_reduce(r: &mut Route, among: NetAlgo, scratch: &mut Vec<u8>, tag: u64, buf: &mut [u8], dtype: DType, op: ReduceOp) -> Result<()> {
    let leaders: Vec<usize> = r.lay.hosts.iter().map(|h| h[0]).collect();
    let world = r.world;
    match among {
        NetAlgo::Doubling => crate::algo::doubling::all_reduce(r, &leaders, tag, buf, dtype, op, world, scratch),
        NetAlgo::Ring | NetAlgo::Hier => crate::algo::ring::all_reduce(r, &leaders, tag, buf, dtype, op, world, scratch),
    }
}
