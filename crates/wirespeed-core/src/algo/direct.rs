//! Direct exchanges: every member talks to every other at once. Right for all_to_all (whose data
//! is pairwise anyway), for gathers and scatters, for reduce_scatter and all_gather among few
//! members or small messages (larger ones across 3+ hosts take the ring: hosts/mod.rs), and for
//! the barrier.
//!
//! Exchange (all_gather, all_to_all, gather, scatter): post every receive, then every send (to
//! the nearest member first, p+1, p+2, ...: each link has one message at a time early on), copy
//! this member's own piece locally, wait the receives in posting order, then the sends. Posting
//! everything before waiting anything is what keeps rendezvous transports from deadlocking.
//!
//! reduce_scatter: the same exchange, piece by piece (`PIECE` bytes, bounding the scratch to
//! (k-1)·PIECE): member p receives every member's chunk p, then combines them in member order
//! (the member's own chunk in its place), so every chunk is reduced in one order everywhere.
//!
//! Barrier (dissemination): in round d member p sends an empty message to p + 2^d and receives
//! one from p - 2^d; after ceil(log2 k) rounds every member has heard, directly or not, from all.
use super::{divide, position, scratch, summing};
use crate::dtype::{DType, ReduceOp};
use crate::error::{Error, Result};
use crate::kernels::reduce::reduce_many;
use crate::transport::{Handle, Transport};

/// Bytes per reduce_scatter round: the receiver reduces piece k while piece k+1 is in flight.
pub const PIECE: usize = 4 << 20;

/// A region of this process's memory: start and length in bytes.
#[derive(Clone, Copy, Debug)]
pub struct Region {
    pub ptr: *mut u8,
    pub len: usize,
}

impl Region {
    pub const EMPTY: Region = Region { ptr: std::ptr::null_mut(), len: 0 };
}

/// recv[j] = what member j sends to this member (send[j] goes to member j); `None` entries are
/// neither sent nor received. This member's own send[p] is copied to recv[p].
///
/// # Safety
/// Until this returns (after an error: until the caller shuts the transport, algo/mod.rs) every
/// region is valid for its length, sends readable, receives writable and ours; a receive overlaps
/// no other region, except send[p] == recv[p] (in place).
pub unsafe fn exchange<T: Transport + ?Sized>(t: &mut T, members: &[usize], tag: u64, send: &[Option<Region>], recv: &[Option<Region>]) -> Result<()> {
    let k = members.len();
    let p = position(members, t.rank())?;
    let mut recvs: Vec<Handle> = Vec::with_capacity(k);
    for d in 1..k {
        let j = (p + k - d) % k;
        if let Some(r) = recv[j] {
            // SAFETY: post_recv's contract (transport/mod.rs): recv[j] is writable and ours until
            // the wait below, or the caller's shutdown after an error (this fn's contract).
            recvs.push(unsafe { t.post_recv(members[j], r.ptr, r.len, tag)? });
        }
    }
    let mut sends: Vec<Handle> = Vec::with_capacity(k);
    for d in 1..k {
        let j = (p + d) % k;
        if let Some(s) = send[j] {
            // SAFETY: post_send's contract (transport/mod.rs): send[j] is readable and unwritten
            // until the wait below, or the caller's shutdown after an error (this fn's contract).
            sends.push(unsafe { t.post_send(members[j], s.ptr, s.len, tag)? });
        }
    }
    if let (Some(s), Some(r)) = (send[p], recv[p]) {
        if s.len != r.len {
            return Err(Error::Mismatch(format!("rank {} sends {} bytes to itself but receives {}", t.rank(), s.len, r.len)));
        }
        if s.ptr != r.ptr && s.len > 0 {
            // SAFETY: send[p] and recv[p] hold s.len bytes (this fn's contract); they are not the
            // same region, so by the contract they do not overlap at all.
            unsafe { std::ptr::copy_nonoverlapping(s.ptr, r.ptr, s.len) };
        }
    }
    t.wait_all(&recvs)?;
    t.wait_all(&sends)
}

#[allow(clippy::too_many_arguments)]
/// out = op over members j (in member order) of send[j]'s chunk for this member; send[j] is this
/// member's chunk for member j, `count` elements each.
///
/// # Safety
/// Until this returns (after an error: until the caller shuts the transport, algo/mod.rs) send
/// regions and `out` hold `count` elements aligned for `dtype`, sends readable, `out` writable and
/// ours, overlapping no send region but send[p], and that one only at the same address.
pub unsafe fn reduce_scatter<T: Transport + ?Sized>(t: &mut T, members: &[usize], tag: u64, send: &[Region], out: *mut u8, count: usize, dtype: DType, op: ReduceOp, avg_world: usize, scratch_buf: &mut Vec<u8>) -> Result<()> {
    let k = members.len();
    let p = position(members, t.rank())?;
    let es = dtype.size();
    let bytes = count * es;
    for (j, s) in send.iter().enumerate() {
        if s.len != bytes {
            return Err(Error::Mismatch(format!("rank {} contributes {} bytes to rank {}, expected {bytes}", t.rank(), s.len, members[j])));
        }
    }
    let per = (PIECE / es).max(1) * es;
    let tmp = scratch(scratch_buf, per.min(bytes.max(1)) * k).as_mut_ptr();
    let mut off = 0;
    loop {
        let n = per.min(bytes - off);
        let mut recvs: Vec<Option<Region>> = vec![None; k];
        let mut sends: Vec<Option<Region>> = vec![None; k];
        for j in 0..k {
            if j != p {
                // SAFETY: the scratch holds k slots of per.min(bytes.max(1)) >= n bytes, so slot j
                // starts inside it.
                recvs[j] = Some(Region { ptr: unsafe { tmp.add(j * per.min(bytes.max(1))) }, len: n });
                // SAFETY: send[j] holds `bytes` (checked above) and off + n <= bytes.
                sends[j] = Some(Region { ptr: unsafe { send[j].ptr.add(off) }, len: n });
            }
        }
        // SAFETY: the receives are disjoint scratch slots of n bytes that nothing else uses; the
        // sends are n-byte pieces of send[j], readable under this fn's contract, and none lies in
        // the scratch. Errors: this fn's contract carries exchange's to the caller.
        unsafe { exchange(t, members, tag, &sends, &recvs)? };
        let srcs: Vec<*const u8> = (0..k)
            // SAFETY: in the unsafe arm, off + n <= bytes keeps the pointer inside send[p].
            .map(|j| if j == p { unsafe { send[p].ptr.add(off) as *const u8 } } else { recvs[j].unwrap().ptr as *const u8 })
            .collect();
        // SAFETY: `out + off` is writable for n bytes (this fn's contract); each source holds n
        // bytes: this member's piece of send[p] or a scratch slot that exchange has waited.
        // `out` aliases only send[p], at the same offset. Slots start at multiples of `per`, a
        // multiple of the element size, in the scratch Vec (malloc'd: 16-byte aligned in practice).
        unsafe { reduce_many(out.add(off), &srcs, n / es, dtype, summing(op), k) };
        off += n;
        if off >= bytes {
            break;
        }
    }
    if op == ReduceOp::Avg && bytes > 0 {
        // SAFETY: `out` is writable for `bytes` and ours (this fn's contract); every exchange was
        // waited, so nothing else touches it now.
        divide(unsafe { std::slice::from_raw_parts_mut(out, bytes) }, dtype, avg_world);
    }
    Ok(())
}

pub fn barrier<T: Transport + ?Sized>(t: &mut T, members: &[usize], tag: u64) -> Result<()> {
    let k = members.len();
    let p = position(members, t.rank())?;
    let mut d = 1;
    let mut token = [0u8; 1];
    while d < k {
        // SAFETY: zero-length messages; the pointer is never read or written.
        let r = unsafe { t.post_recv(members[(p + k - d) % k], token.as_mut_ptr(), 0, tag)? };
        // SAFETY: as for the receive: zero bytes of `token`, which outlives the waits below.
        let s = unsafe { t.post_send(members[(p + d) % k], token.as_ptr(), 0, tag)? };
        t.wait(r)?;
        t.wait(s)?;
        d <<= 1;
    }
    Ok(())
}
