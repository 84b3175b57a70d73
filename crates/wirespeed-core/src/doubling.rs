//! Recursive doubling all_reduce (the latency algorithm across hosts): with k members, k a power
//! of two, log2(k) rounds; in round d each member swaps its whole buffer with the member whose
//! position differs in bit d and reduces what it receives. One message per round where the ring
//! needs 2(k-1), at the price of moving the whole buffer every round: best for small messages,
//! which is what the cost model (algo.rs) gives it.
//!
//! Identical bits on every member: in a round both partners combine the same two partial results
//! in the same order (the lower position's first), so even min/max of -0.0 and +0.0 or a NaN, and
//! float16/bfloat16 rounding, come out the same on both.
use crate::dtype::{DType, ReduceOp};
use crate::error::Result;
use crate::hosts::HostsComm;
use crate::reduce::reduce_many;

impl HostsComm {
    /// In-place all_reduce of `count` elements at `buf` among `members` (a power of two of global
    /// ranks, this rank among them); avg divides by the group's world size.
    pub(crate) fn doubling_all_reduce(&mut self, tag: u64, members: &[usize], buf: usize, count: usize, dtype: DType, op: ReduceOp) -> Result<()> {
        let k = members.len();
        debug_assert!(k.is_power_of_two());
        let es = dtype.size();
        let bytes = count * es;
        let p = members.iter().position(|&r| r == self.rank).expect("this rank is a member");
        let rop = if op == ReduceOp::Avg { ReduceOp::Sum } else { op };
        let scratch = self.scratch(bytes.max(1));
        let mut d = 1;
        while d < k {
            let partner = members[p ^ d];
            let ticket = self.post(partner, (buf, bytes), tag)?;
            self.take(partner, (scratch, bytes), tag)?;
            // The send may still be reading `buf` (a TCP writer, or the partner over shm): it must
            // be complete before the reduction overwrites it.
            ticket.wait()?;
            let (dst, theirs) = (buf as *mut u8, scratch as *const u8);
            let srcs = if p < p ^ d { [dst as *const u8, theirs] } else { [theirs, dst as *const u8] };
            unsafe { reduce_many(dst, &srcs, count, dtype, rop, 2) };
            d <<= 1;
        }
        if op == ReduceOp::Avg {
            let b = buf as *mut u8;
            unsafe { reduce_many(b, &[b as *const u8], count, dtype, ReduceOp::Avg, self.world) };
        }
        Ok(())
    }
}
