//! all_gather, reduce_scatter, barrier and reduce across hosts through the host leaders, so that
//! a rank talks to its own leader only and a leader to its host's ranks plus O(log H) leaders,
//! for any number of hosts H (a direct exchange makes every rank talk to every remote rank).
//!
//! The layout is data: `hosts[g]` lists host g's ranks, its first the leader (hosts/layout.rs
//! makes them ascending, but nothing here needs it). Host g's leader is "leader g"; leader
//! arithmetic is modulo H. Every host's data is kept in a rotated host order: on host h,
//! position i holds host (h + i) mod H's block, its ranks in local order, contiguous; so the
//! blocks a round moves are always one contiguous run, whatever the sizes of the blocks.
//!
//! all_gather (Bruck's algorithm among leaders):
//! 1. every non-leader sends its piece to its leader, which assembles its host's block at
//!    position 0 of a scratch buffer;
//! 2. ceil(log2 H) rounds: in round k (d = 2^k) leader h sends its first m = min(d, H - d)
//!    positions to leader h - d and receives leader h + d's first m positions into its positions
//!    d..d+m (they are blocks h+d..h+d+m-1 either way); after round k it holds min(2d, H) blocks;
//! 3. the leader sends the whole rotated buffer to each of its ranks (one message each), which
//!    copy the pieces out; the leader copies them out too.
//!
//! reduce_scatter (the transpose of Bruck's all_gather):
//! 1. every non-leader packs its chunks in the rotated host order and sends them to its leader,
//!    which folds them into its own, in local-rank order: ((r0 op r1) op r2)...;
//! 2. the rounds of the all_gather run backwards: in round k (d = 2^k, from the largest down)
//!    leader h sends its positions d..d+m to leader h + d and folds what leader h - d sends
//!    (blocks h..h+m-1: its positions 0..m) as `mine (op) theirs`. Each block's partials meet
//!    along the all_gather's tree reversed, each host's contribution once, in an order fixed by
//!    positions; position 0 ends with this host's block fully reduced;
//! 3. the leader divides for avg (once, by avg_world) and sends each of its ranks its chunk.
//!
//! barrier: non-leaders notify their leader; the leaders run the dissemination barrier
//! (direct.rs); each leader releases its ranks.
//!
//! reduce: each leader folds its host's buffers in local-rank order (non-root inputs are left
//! untouched: the fold runs in scratch), the leaders reduce along a binomial tree rooted at the
//! root's leader (the order of tree.rs: children in increasing order, `partial (op) child`), and
//! that leader hands the result to the root if the root is another rank of its host.
//!
//! Every buffer posted to the transport is the caller's or the caller's scratch, never a local
//! allocation: after an error the caller shuts the transport down while they still exist
//! (algo/mod.rs, "Buffers and errors"). Receives are posted before the sends they wait with.
use super::direct::Region;
use super::{combine, divide, scratch, summing};
use crate::dtype::{DType, ReduceOp};
use crate::error::{Error, Result};
use crate::transport::{Handle, Transport};

/// (host, local index) of `rank` in `hosts`.
pub(crate) fn locate(hosts: &[Vec<usize>], rank: usize) -> Result<(usize, usize)> {
    for (g, rs) in hosts.iter().enumerate() {
        if let Some(l) = rs.iter().position(|&r| r == rank) {
            return Ok((g, l));
        }
    }
    Err(Error::Unsupported(format!("rank {rank} is on none of the {} hosts", hosts.len())))
}

/// The leader of host `g` (its first rank).
fn leader(hosts: &[Vec<usize>], g: usize) -> usize {
    hosts[g][0]
}

/// Byte offsets of the rotated host order seen from host `h`: off[i] is where position i (host
/// (h + i) mod H) starts, off[H] the total; `block(g)` is host g's bytes.
fn rotated(hosts: &[Vec<usize>], h: usize, block: impl Fn(usize) -> usize) -> Vec<usize> {
    let n = hosts.len();
    let mut off = Vec::with_capacity(n + 1);
    off.push(0);
    for i in 0..n {
        off.push(off[i] + block((h + i) % n));
    }
    off
}

/// The rounds' distances of Bruck's algorithm on `n` members: 1, 2, 4, ... below n.
fn distances(n: usize) -> Vec<usize> {
    std::iter::successors(Some(1usize), |d| d.checked_mul(2)).take_while(|&d| d < n).collect()
}

/// recv[j] = rank j's piece (every rank knows every recv[j].len); recv[rank] may be `send` itself
/// (in place). `scratch_buf` holds the leaders' blocks.
///
/// # Safety
/// `direct::exchange`'s: `send` readable, every recv region writable and ours, receives disjoint
/// from each other and from `send` unless recv[rank] is `send`, until this returns (after an
/// error: until the caller shuts the transport, before the regions and the scratch go).
pub unsafe fn all_gather<T: Transport + ?Sized>(t: &mut T, hosts: &[Vec<usize>], tag: u64, send: Region, recv: &[Region], scratch_buf: &mut Vec<u8>) -> Result<()> {
    let me = t.rank();
    let (h, l) = locate(hosts, me)?;
    let n = hosts.len();
    if recv.len() <= me || send.len != recv[me].len {
        return Err(Error::Mismatch(format!("rank {me} sends {} bytes but its own output holds {:?}", send.len, recv.get(me).map(|r| r.len))));
    }
    let off = rotated(hosts, h, |g| hosts[g].iter().map(|&r| recv[r].len).sum());
    let total = off[n];
    let buf = scratch(scratch_buf, total).as_mut_ptr();
    let ours = &hosts[h];
    let mut sends: Vec<Handle> = Vec::new();
    if l == 0 {
        // 1. The host's block at position 0, in local order: ours copied, the others received.
        let mut recvs = Vec::with_capacity(ours.len());
        let mut at = 0;
        for (i, &r) in ours.iter().enumerate() {
            let len = recv[r].len;
            if i == 0 {
                // SAFETY: the scratch holds `total` >= at + len bytes; `send` holds len bytes
                // (checked above) and lies outside the scratch, which is ours.
                unsafe { copy(send.ptr, buf.add(at), len) };
            } else {
                // SAFETY: bytes at..at+len of the scratch, disjoint from every other posted
                // region, ours until waited (or the caller's shutdown after an error).
                recvs.push(unsafe { t.post_recv(r, buf.add(at), len, tag)? });
            }
            at += len;
        }
        t.wait_all(&recvs)?;
        // 2. Bruck's rounds among the leaders.
        for d in distances(n) {
            let m = d.min(n - d);
            // SAFETY: positions d..d+m of the scratch (off[d+m] <= total), disjoint from the
            // prefix the send reads (m <= d), ours until waited.
            let r = unsafe { t.post_recv(leader(hosts, (h + d) % n), buf.add(off[d]), off[d + m] - off[d], tag)? };
            // SAFETY: positions 0..m, complete since the previous round (m <= d blocks held),
            // only read until the send is waited.
            let s = unsafe { t.post_send(leader(hosts, (h + n - d) % n), buf, off[m], tag)? };
            t.wait(r)?;
            t.wait(s)?;
        }
        // 3. Every rank of the host gets the whole buffer.
        for &r in &ours[1..] {
            // SAFETY: the complete scratch, only read until these sends are waited below.
            sends.push(unsafe { t.post_send(r, buf, total, tag)? });
        }
    } else {
        let lead = ours[0];
        // SAFETY: the scratch (`total` bytes) is ours until the wait below, or the caller's
        // shutdown after an error.
        let r = unsafe { t.post_recv(lead, buf, total, tag)? };
        // SAFETY: `send` is readable for its length until this returns (this fn's contract).
        let s = unsafe { t.post_send(lead, send.ptr, send.len, tag)? };
        t.wait(s)?;
        t.wait(r)?;
    }
    // Every piece out of the rotated buffer; our own from `send`.
    for i in 0..n {
        let mut at = off[i];
        for &r in &hosts[(h + i) % n] {
            let len = recv[r].len;
            if r != me {
                // SAFETY: bytes at..at+len lie in the scratch (complete: waited above, only read
                // by the sends still in flight); recv[r] holds len writable bytes outside it.
                unsafe { copy(buf.add(at), recv[r].ptr, len) };
            } else if send.ptr != recv[r].ptr {
                // SAFETY: both hold len bytes and, being different regions, do not overlap
                // (this fn's contract).
                unsafe { copy(send.ptr, recv[r].ptr, len) };
            }
            at += len;
        }
    }
    t.wait_all(&sends)
}

/// A table of lengths as the leaders' bundles carry it (leaders_a2a.rs, leaders_gs.rs): each a
/// u64, little-endian.
pub(super) fn encode(lens: &[u64]) -> Vec<u8> {
    lens.iter().flat_map(|l| l.to_le_bytes()).collect()
}

/// The lengths of a table `encode` wrote (whole 8-byte slots; a trailing remainder is ignored).
pub(super) fn decode(b: &[u8]) -> Vec<u64> {
    b.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap())).collect()
}

/// Copy `len` bytes (none when 0, whatever the pointers).
///
/// # Safety
/// For len > 0, `std::ptr::copy_nonoverlapping`'s contract.
pub(super) unsafe fn copy(from: *const u8, to: *mut u8, len: usize) {
    if len > 0 {
        // SAFETY: this fn's contract.
        unsafe { std::ptr::copy_nonoverlapping(from, to, len) };
    }
}

#[allow(clippy::too_many_arguments)]
/// out = op over every rank j of rank j's send[rank]; send[j] is this rank's chunk for rank j,
/// `count` elements each; avg divides once by `avg_world`.
///
/// # Safety
/// `direct::reduce_scatter`'s: send regions and `out` hold `count` elements aligned for `dtype`,
/// sends readable, `out` writable and ours, overlapping no send region but send[rank] at its own
/// address, until this returns (after an error: until the caller shuts the transport, algo/mod.rs).
pub unsafe fn reduce_scatter<T: Transport + ?Sized>(t: &mut T, hosts: &[Vec<usize>], tag: u64, send: &[Region], out: *mut u8, count: usize, dtype: DType, op: ReduceOp, avg_world: usize, scratch_buf: &mut Vec<u8>) -> Result<()> {
    let me = t.rank();
    let (h, l) = locate(hosts, me)?;
    let n = hosts.len();
    let es = dtype.size();
    let cb = count * es;
    let world: usize = hosts.iter().map(Vec::len).sum();
    if send.len() != world {
        return Err(Error::Mismatch(format!("rank {me} has {} chunks for a world of {world}", send.len())));
    }
    if let Some(j) = send.iter().position(|s| s.len != cb) {
        return Err(Error::Mismatch(format!("rank {me} contributes {} bytes to rank {j}, expected {cb}", send[j].len)));
    }
    let off = rotated(hosts, h, |g| hosts[g].len() * cb);
    let total = off[n];
    let ours = &hosts[h];
    // The leader's scratch: its running partials, then room for what it receives.
    let s = scratch(scratch_buf, if l == 0 { 2 * total } else { total }).as_mut_ptr();
    // Our chunks, packed in the rotated host order.
    let mut at = 0;
    for i in 0..n {
        for &r in &hosts[(h + i) % n] {
            // SAFETY: send[r] holds cb bytes (checked above) outside the scratch, which holds
            // `total` >= at + cb bytes and is ours.
            unsafe { copy(send[r].ptr, s.add(at), cb) };
            at += cb;
        }
    }
    if l != 0 {
        let lead = ours[0];
        // SAFETY: `out` is writable for cb bytes and ours (this fn's contract); send[me], the one
        // region it may share, was read into the packed copy above.
        let r = unsafe { t.post_recv(lead, out, cb, tag)? };
        // SAFETY: the packed scratch, only read until this send is waited.
        let snd = unsafe { t.post_send(lead, s, total, tag)? };
        t.wait(snd)?;
        return t.wait(r);
    }
    let rop = summing(op);
    // SAFETY: the scratch holds 2·total bytes: `tmp` is its second half.
    let tmp = unsafe { s.add(total) };
    // 1. The host's ranks folded in local order.
    for &r in &ours[1..] {
        // SAFETY: tmp (total bytes) is ours until waited on the next line.
        let hd = unsafe { t.post_recv(r, tmp, total, tag)? };
        t.wait(hd)?;
        // SAFETY: both halves hold world·count elements, aligned (the scratch Vec is malloc'd;
        // total is a multiple of the element size); dst is the first source itself.
        unsafe { combine(s, s, tmp, total / es, dtype, rop) };
    }
    // 2. Bruck's rounds backwards: send positions d..d+m ahead, fold positions 0..m.
    for &d in distances(n).iter().rev() {
        let m = d.min(n - d);
        // SAFETY: tmp holds total >= off[m] bytes, ours until waited.
        let r = unsafe { t.post_recv(leader(hosts, (h + n - d) % n), tmp, off[m], tag)? };
        // SAFETY: positions d..d+m of the partials, only read until waited; the fold below
        // writes positions 0..m only (m <= d).
        let snd = unsafe { t.post_send(leader(hosts, (h + d) % n), s.add(off[d]), off[d + m] - off[d], tag)? };
        t.wait(r)?;
        t.wait(snd)?;
        // SAFETY: positions 0..m (off[m] bytes) of the partials and of tmp, element-aligned and
        // disjoint halves of the scratch; dst is the first source.
        unsafe { combine(s, s, tmp, off[m] / es, dtype, rop) };
    }
    // 3. Position 0 is this host's block, reduced: each rank its chunk.
    let block = ours.len() * cb;
    if op == ReduceOp::Avg && block > 0 {
        // SAFETY: position 0 of the partials, every transfer into it waited, nothing else
        // touches it.
        divide(unsafe { std::slice::from_raw_parts_mut(s, block) }, dtype, avg_world);
    }
    let mut sends = Vec::with_capacity(ours.len());
    for (i, &r) in ours.iter().enumerate().skip(1) {
        // SAFETY: chunk i of position 0, complete, only read until the sends are waited.
        sends.push(unsafe { t.post_send(r, s.add(i * cb), cb, tag)? });
    }
    // SAFETY: `out` is writable for cb bytes (this fn's contract), outside the scratch; send[me]
    // was read into the packed copy already.
    unsafe { copy(s, out, cb) };
    t.wait_all(&sends)
}

/// No rank leaves before every rank has entered.
pub fn barrier<T: Transport + ?Sized>(t: &mut T, hosts: &[Vec<usize>], tag: u64) -> Result<()> {
    let me = t.rank();
    let (h, l) = locate(hosts, me)?;
    let ours = &hosts[h];
    let mut token = [0u8; 1];
    if l != 0 {
        // SAFETY: zero-length messages; the pointer is never read or written.
        let r = unsafe { t.post_recv(ours[0], token.as_mut_ptr(), 0, tag)? };
        // SAFETY: as for the receive.
        let s = unsafe { t.post_send(ours[0], token.as_ptr(), 0, tag)? };
        t.wait(s)?;
        return t.wait(r);
    }
    let mut hs = Vec::with_capacity(ours.len());
    for &r in &ours[1..] {
        // SAFETY: zero-length messages; the pointer is never read or written.
        hs.push(unsafe { t.post_recv(r, token.as_mut_ptr(), 0, tag)? });
    }
    t.wait_all(&hs)?;
    let leaders: Vec<usize> = hosts.iter().map(|rs| rs[0]).collect();
    super::direct::barrier(t, &leaders, tag)?;
    hs.clear();
    for &r in &ours[1..] {
        // SAFETY: as above.
        hs.push(unsafe { t.post_send(r, token.as_ptr(), 0, tag)? });
    }
    t.wait_all(&hs)
}

/// The root's buffer = op over every rank's buffer (avg divided once by `avg_world`); the others'
/// buffers are left untouched.
#[allow(clippy::too_many_arguments)]
pub fn reduce<T: Transport + ?Sized>(t: &mut T, hosts: &[Vec<usize>], tag: u64, buf: &mut [u8], dtype: DType, op: ReduceOp, root: usize, avg_world: usize, scratch_buf: &mut Vec<u8>) -> Result<()> {
    let me = t.rank();
    let (h, l) = locate(hosts, me)?;
    let (rh, _) = locate(hosts, root)?;
    let n = hosts.len();
    let bytes = buf.len();
    let count = bytes / dtype.size();
    let ours = &hosts[h];
    if l != 0 {
        // SAFETY: `buf` is our &mut slice, only read until this send is waited.
        let s = unsafe { t.post_send(ours[0], buf.as_ptr(), bytes, tag)? };
        t.wait(s)?;
        if me == root {
            // SAFETY: the send that read `buf` is complete; `buf` is ours until this receive is
            // waited on the next line (or the caller's shutdown after an error).
            let r = unsafe { t.post_recv(ours[0], buf.as_mut_ptr(), bytes, tag)? };
            t.wait(r)?;
        }
        return Ok(());
    }
    let rop = summing(op);
    let sc = scratch(scratch_buf, 2 * bytes);
    let (acc, tmp) = sc.split_at_mut(bytes);
    let tmp = tmp.as_mut_ptr();
    // The running partial: the root's own buffer, else a scratch copy of ours.
    let part: *mut u8 = if me == root {
        buf.as_mut_ptr()
    } else {
        acc.copy_from_slice(buf);
        acc.as_mut_ptr()
    };
    let fold = |t: &mut T, from: usize| -> Result<()> {
        // SAFETY: tmp (`bytes`, the scratch's second half) is ours until waited on the next line.
        let r = unsafe { t.post_recv(from, tmp, bytes, tag)? };
        t.wait(r)?;
        // SAFETY: `part` (`buf` or the scratch's first half) and `tmp` hold `count` elements and
        // are disjoint; dst is `part` itself.
        unsafe { combine(part, part, tmp, count, dtype, rop) };
        Ok(())
    };
    for &r in &ours[1..] {
        fold(t, r)?;
    }
    // The binomial tree among leaders (tree.rs's numbering), rooted at the root's leader.
    let v = (h + n - rh) % n;
    let low = if v == 0 { n.next_power_of_two() } else { v & v.wrapping_neg() };
    let at = |w: usize| leader(hosts, (w + rh) % n);
    let mut m = 1;
    while m < low && v + m < n {
        fold(t, at(v + m))?;
        m <<= 1;
    }
    if v != 0 {
        // SAFETY: the partial is not touched until this send is waited.
        let s = unsafe { t.post_send(at(v - low), part, bytes, tag)? };
        return t.wait(s);
    }
    if op == ReduceOp::Avg && bytes > 0 {
        // SAFETY: `part` holds `bytes`, every transfer into it waited; ours.
        divide(unsafe { std::slice::from_raw_parts_mut(part, bytes) }, dtype, avg_world);
    }
    if me != root {
        // SAFETY: the complete partial, only read until this send is waited.
        let s = unsafe { t.post_send(root, part, bytes, tag)? };
        t.wait(s)?;
    }
    Ok(())
}
