//! Binomial trees for broadcast and reduce: log2(k) rounds, the root's data crossing each
//! member's link once.
//!
//! Numbering: member at position p has relative number v = (p - root + k) mod k; the root is 0.
//! The parent of v is v with its lowest set bit cleared; its children are v + 2^j for each 2^j
//! below v's lowest set bit (all 2^j for the root) with v + 2^j < k.
//!
//! Broadcast: a member receives from its parent, then sends to its children, largest subtree
//! first, so the far half of the tree starts as early as possible.
//!
//! Reduce: a member combines what its children send, in increasing child order, as
//! `partial (op) child`, into a scratch copy of its input (inputs of non-root members are left
//! untouched), then sends the partial to its parent. The root writes the result into its buffer
//! and, for avg, divides once. The reduction order is fixed by the tree, not by arrival.
use super::{combine, divide, position, scratch, summing};
use crate::dtype::{DType, ReduceOp};
use crate::error::Result;
use crate::transport::Transport;

fn lowbit(v: usize, k: usize) -> usize {
    if v == 0 { k.next_power_of_two() } else { v & v.wrapping_neg() }
}

pub fn broadcast<T: Transport + ?Sized>(t: &mut T, members: &[usize], tag: u64, buf: &mut [u8], root: usize) -> Result<()> {
    let k = members.len();
    let p = position(members, t.rank())?;
    let rp = position(members, root)?;
    let v = (p + k - rp) % k;
    let at = |w: usize| members[(w + rp) % k];
    let low = lowbit(v, k);
    if v != 0 {
        // SAFETY: `buf` is our &mut slice, untouched until this receive is waited on the next
        // line (or the caller's shutdown after an error: algo/mod.rs).
        let r = unsafe { t.post_recv(at(v - low), buf.as_mut_ptr(), buf.len(), tag)? };
        t.wait(r)?;
    }
    let mut sends = Vec::new();
    let mut m = low >> 1;
    while m >= 1 {
        if v + m < k {
            // SAFETY: buf is only read until the sends are waited below.
            sends.push(unsafe { t.post_send(at(v + m), buf.as_ptr(), buf.len(), tag)? });
        }
        m >>= 1;
    }
    t.wait_all(&sends)
}

#[allow(clippy::too_many_arguments)]
pub fn reduce<T: Transport + ?Sized>(t: &mut T, members: &[usize], tag: u64, buf: &mut [u8], dtype: DType, op: ReduceOp, root: usize, avg_world: usize, scratch_buf: &mut Vec<u8>) -> Result<()> {
    let k = members.len();
    let bytes = buf.len();
    let count = bytes / dtype.size();
    let p = position(members, t.rank())?;
    let rp = position(members, root)?;
    let v = (p + k - rp) % k;
    let at = |w: usize| members[(w + rp) % k];
    let low = lowbit(v, k);
    let children: Vec<usize> = (0..usize::BITS).map(|j| 1usize << j).take_while(|&m| m < low).filter(|&m| v + m < k).map(|m| v + m).collect();
    let s = scratch(scratch_buf, 2 * bytes);
    let (acc, tmp) = s.split_at_mut(bytes);
    let rop = summing(op);
    // The running partial: the root reduces into its own buffer, others into a scratch copy.
    let part: *mut u8 = if v == 0 { buf.as_mut_ptr() } else { acc.copy_from_slice(buf); acc.as_mut_ptr() };
    for c in children {
        // SAFETY: tmp holds `bytes` and is waited before use.
        let r = unsafe { t.post_recv(at(c), tmp.as_mut_ptr(), bytes, tag)? };
        t.wait(r)?;
        // SAFETY: `part` (`buf`, or the scratch copy `acc`) and `tmp` hold `count` elements and
        // are disjoint (acc and tmp are halves of the scratch); dst is `part` itself.
        unsafe { combine(part, part, tmp.as_ptr(), count, dtype, rop) };
    }
    if v == 0 {
        if op == ReduceOp::Avg {
            divide(buf, dtype, avg_world);
        }
        return Ok(());
    }
    // SAFETY: the partial is not touched until the send is waited.
    let s = unsafe { t.post_send(at(v - low), part, bytes, tag)? };
    t.wait(s)
}
