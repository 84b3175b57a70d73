//! Recursive doubling all_reduce: the latency algorithm. With k members, log2(k) rounds (plus two
//! for a k that is not a power of two), one message of the whole buffer per round, where the ring
//! needs 2(k-1) messages: best for small messages, which is what the planner gives it.
//!
//! 1. Fold (only when k is not a power of two; q = k minus the largest power of two <= k): the
//!    member at even position 2i < 2q sends its buffer to position 2i+1, which combines
//!    `theirs (op) mine` and stands for both; the even one sits out until step 3. The members
//!    left (positions 2i+1 for i < q, and every position >= 2q) are renumbered 0..2^m.
//! 2. Doubling: in round d each remaining member swaps its buffer with the member whose new
//!    number differs in bit d and combines the two, the lower number's partial first, so both
//!    partners compute identical bits (even min/max of -0.0 and +0.0, NaNs, half-precision
//!    rounding). For avg every member divides the final sum once.
//! 3. Unfold: position 2i+1 sends the result to 2i.
//!
//! A receive goes to scratch while the same buffer is being sent; the send is waited before the
//! buffer is overwritten.
use super::{combine, divide, position, scratch, summing};
use crate::dtype::{DType, ReduceOp};
use crate::error::Result;
use crate::transport::Transport;

pub fn all_reduce<T: Transport + ?Sized>(t: &mut T, members: &[usize], tag: u64, buf: &mut [u8], dtype: DType, op: ReduceOp, avg_world: usize, scratch_buf: &mut Vec<u8>) -> Result<()> {
    let k = members.len();
    let es = dtype.size();
    let bytes = buf.len();
    let count = bytes / es;
    let p = position(members, t.rank())?;
    let rop = summing(op);
    let pow = if k.is_power_of_two() { k } else { k.next_power_of_two() / 2 };
    let q = k - pow;
    let tmp = scratch(scratch_buf, bytes).as_mut_ptr();
    let base = buf.as_mut_ptr();
    // The position that stands for new number v after the fold.
    let real = |v: usize| if v < q { 2 * v + 1 } else { v + q };
    if p < 2 * q && p % 2 == 0 {
        // Step 1 and 3 for a member that sits out: hand over, then take the result.
        let to = members[p + 1];
        // SAFETY: buf lives until the waits below; the receive is posted after the send completes.
        let s = unsafe { t.post_send(to, base, bytes, tag)? };
        t.wait(s)?;
        // SAFETY: the send that read `buf` is complete; `buf` is ours and untouched until this
        // receive is waited on the next line.
        let r = unsafe { t.post_recv(to, base, bytes, tag)? };
        return t.wait(r);
    }
    if p < 2 * q {
        let from = members[p - 1];
        // SAFETY: the scratch holds `bytes`; waited before use.
        let r = unsafe { t.post_recv(from, tmp, bytes, tag)? };
        t.wait(r)?;
        // SAFETY: `tmp` (the receive just waited) and `buf` hold `count` elements; dst is `buf`,
        // a source at the same offset. The lower position's partial goes first.
        unsafe { combine(base, tmp, base, count, dtype, rop) };
    }
    let v = if p < 2 * q { p / 2 } else { p - q };
    let mut d = 1;
    while d < pow {
        let pv = v ^ d;
        let partner = members[real(pv)];
        // SAFETY: buf is only read by the send and tmp only written by the receive until both
        // are waited; then buf is overwritten.
        let r = unsafe { t.post_recv(partner, tmp, bytes, tag)? };
        // SAFETY: see the receive: `buf` is only read until this send is waited.
        let s = unsafe { t.post_send(partner, base, bytes, tag)? };
        t.wait(r)?;
        t.wait(s)?;
        // SAFETY: as for the fold: both transfers are waited; `buf` and `tmp` hold `count`
        // elements, and dst is `buf`, a source at the same offset.
        unsafe {
            if v < pv { combine(base, base, tmp, count, dtype, rop) } else { combine(base, tmp, base, count, dtype, rop) }
        }
        d <<= 1;
    }
    if op == ReduceOp::Avg {
        divide(buf, dtype, avg_world);
    }
    if p < 2 * q {
        let to = members[p - 1];
        // SAFETY: buf is not written until the send is waited.
        let s = unsafe { t.post_send(to, buf.as_ptr(), bytes, tag)? };
        t.wait(s)?;
    }
    Ok(())
}
