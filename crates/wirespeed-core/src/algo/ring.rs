//! The ring all_reduce (and, at the end of this file, all_gather and reduce_scatter):
//! bandwidth-optimal among the members it joins.
//!
//! Ring over members m_0..m_{k-1} (this rank is m_p). The buffer is cut into slices of k pieces
//! of at most `PIECE` bytes; each slice runs the textbook ring on its own:
//! 1. reduce-scatter, k-1 steps: at step s send piece (p-s) to m_{p+1}; receive piece (p-s-1)
//!    from m_{p-1} into scratch and combine it into the buffer as `mine (op) theirs`. After k-1
//!    steps piece (p+1) is complete here; for avg it is divided by `avg_world` here, once.
//! 2. all-gather, k-1 steps: at step s send piece (p+1-s) and receive piece (p-s) straight into
//!    the buffer. Every piece is reduced on one rank and copied everywhere: identical bits.
//!
//! Pipelining. Step j of slice i is scheduled at wave i + LOOKAHEAD·j, so a step's send waits only
//! for the previous step's receive of the same slice while sends of later slices keep the link
//! busy. Receives are posted up to RECV_AHEAD items ahead of the one being waited (each reducing
//! step into its own scratch slot), so a multi-stream transport places arriving chunks straight
//! where they belong instead of parking them.
//!
//! Deadlock freedom: every member walks the same schedule; its sends to m_{p+1} come in the order
//! m_{p+1} receives them; a send is posted as soon as the receive it depends on is done. A member
//! waiting for its predecessor therefore waits for a member that is further ahead or waiting
//! further round the ring, which cannot close into a cycle. Buffer safety: a region is received
//! into only after the data arriving for it passed through every earlier send of it (the ring's
//! causality), so no send still reading it can see it overwritten; scratch slot r % RECV_AHEAD is
//! reposted only after item r was waited and reduced.
use super::{combine, divide, position, scratch, summing};
use crate::dtype::{DType, ReduceOp};
use crate::error::Result;
use crate::transport::{Handle, Transport};

/// Largest piece one ring step moves: small enough that several are in flight on a link.
pub const PIECE: usize = 1 << 20;
/// How many waves ahead of a slice the next slice runs.
const LOOKAHEAD: usize = 4;
/// Receives posted ahead of the one being waited: at least as many as the sends a member can
/// have posted beyond its predecessor's receive (step 0 of LOOKAHEAD slices and the steps those
/// release, about 2·LOOKAHEAD items). Fewer, and the engine parks the streams carrying the later
/// messages; on per-flow capped links a parked flow's lost time never comes back (with 4, a
/// 2-host all_reduce got 0.75-0.86 of the link where this gets 0.85-0.92). Costs one scratch
/// piece (1 MiB) each.
const RECV_AHEAD: usize = 2 * LOOKAHEAD + 2;

/// This member's place on the ring over `members`: k members, this one m_p, sending to m_{p+1}
/// (`next`) and receiving from m_{p-1} (`prev`), both ranks.
#[derive(Clone, Copy)]
struct Ring {
    k: usize,
    p: usize,
    next: usize,
    prev: usize,
}

impl Ring {
    /// `rank`'s place; an error if it is not among `members`.
    fn of(members: &[usize], rank: usize) -> Result<Ring> {
        let k = members.len();
        let p = position(members, rank)?;
        Ok(Ring { k, p, next: members[(p + 1) % k], prev: members[(p + k - 1) % k] })
    }
}

/// In-place all_reduce of `buf` (elements of `dtype`) among `members`.
pub fn all_reduce<T: Transport + ?Sized>(t: &mut T, members: &[usize], tag: u64, buf: &mut [u8], dtype: DType, op: ReduceOp, avg_world: usize, scratch_buf: &mut Vec<u8>) -> Result<()> {
    let Ring { k, p, next, prev } = Ring::of(members, t.rank())?;
    let es = dtype.size();
    let count = buf.len() / es;
    let rop = summing(op);
    if k == 1 {
        if op == ReduceOp::Avg {
            divide(buf, dtype, avg_world);
        }
        return Ok(());
    }
    // Slices of k pieces; piece `c` of slice `i` is elements [i·slice + c·per, ..) clipped.
    let per = (PIECE / es).max(1).min(count.div_ceil(k).max(1));
    let slice = per * k;
    let nslices = count.div_ceil(slice).max(1);
    let piece = |i: usize, c: usize| -> (usize, usize) {
        let s = (i * slice + c * per).min(count);
        let e = (i * slice + (c + 1) * per).min(count).min((i + 1) * slice);
        (s * es, (e.max(s) - s) * es)
    };
    let steps = 2 * (k - 1);
    // (slice, step) in schedule order: by wave, then by step.
    let mut items: Vec<(usize, usize)> = (0..nslices).flat_map(|i| (0..steps).map(move |j| (i, j))).collect();
    items.sort_by_key(|&(i, j)| (i + LOOKAHEAD * j, j));
    let mut pos = vec![0usize; nslices * steps];
    for (r, &(i, j)) in items.iter().enumerate() {
        pos[i * steps + j] = r;
    }
    let send_piece = |j: usize| if j < k - 1 { (p + k - j) % k } else { (p + 1 + k - (j - (k - 1))) % k };
    let recv_piece = |j: usize| if j < k - 1 { (p + 2 * k - j - 1) % k } else { (p + k - (j - (k - 1))) % k };
    let slot_bytes = per * es;
    let scratch = scratch(scratch_buf, slot_bytes * RECV_AHEAD).as_mut_ptr();
    let base = buf.as_mut_ptr();
    let mut sends: Vec<Handle> = Vec::with_capacity(items.len());
    let mut recvs: Vec<Handle> = Vec::with_capacity(items.len());
    let mut sent = 0usize;
    // Where item r's receive lands: its scratch slot (reducing steps) or the buffer.
    let dest = |r: usize| -> (*mut u8, usize) {
        let (i, j) = items[r];
        let (off, len) = piece(i, recv_piece(j));
        // SAFETY: in both arms, slot r % RECV_AHEAD starts inside the scratch of RECV_AHEAD slots
        // of slot_bytes; `off` is a piece's offset, inside `buf`.
        if j < k - 1 { (unsafe { scratch.add((r % RECV_AHEAD) * slot_bytes) }, len) } else { (unsafe { base.add(off) }, len) }
    };
    for r in 0..items.len().min(RECV_AHEAD) {
        let (d, len) = dest(r);
        // SAFETY: post_recv's contract (transport/mod.rs): `d` is `len` bytes of the scratch or of
        // `buf`, both ours and alive until this receive is waited below (or the caller's shutdown
        // after an error: algo/mod.rs), and nothing else touches them before that wait.
        recvs.push(unsafe { t.post_recv(prev, d, len, tag)? });
    }
    for r in 0..items.len() {
        // Post every send whose input is complete: step 0 reads the rank's own data, step j the
        // piece received at step j-1 of the same slice (received iff its position < r).
        while sent < items.len() {
            let (i, j) = items[sent];
            if j > 0 && pos[i * steps + j - 1] >= r {
                break;
            }
            let (off, len) = piece(i, send_piece(j));
            // SAFETY: the piece lies in `buf`, not written again before this send completes
            // (buffer-safety argument above); all sends are waited before returning.
            sends.push(unsafe { t.post_send(next, base.add(off), len, tag)? });
            sent += 1;
        }
        t.wait(recvs[r])?;
        let (i, j) = items[r];
        if j < k - 1 {
            let (off, len) = piece(i, recv_piece(j));
            let (src, _) = dest(r);
            // SAFETY: dst and `a` are the same piece of `buf` (allowed), `src` the scratch slot
            // just received into, `len` bytes each, element-aligned (offsets are multiples of
            // the element size); no send reads this piece now (buffer-safety argument above).
            unsafe { combine(base.add(off), base.add(off), src, len / es, dtype, rop) };
            if j == k - 2 && op == ReduceOp::Avg {
                // Piece (p+1) of this slice is now complete here: divide once, before it is sent.
                // SAFETY: the piece lies inside `buf`, and no transfer touches it now: its send
                // is the next step's, posted after this.
                divide(unsafe { std::slice::from_raw_parts_mut(base.add(off), len) }, dtype, avg_world);
            }
        }
        if r + RECV_AHEAD < items.len() {
            let (d, len) = dest(r + RECV_AHEAD);
            // SAFETY: as for the first receives; slot (r + RECV_AHEAD) % RECV_AHEAD was just
            // consumed.
            recvs.push(unsafe { t.post_recv(prev, d, len, tag)? });
        }
    }
    while sent < items.len() {
        let (i, j) = items[sent];
        let (off, len) = piece(i, send_piece(j));
        // SAFETY: as for the sends in the loop: the piece lies in `buf` and is not written
        // again; every send is waited below.
        sends.push(unsafe { t.post_send(next, base.add(off), len, tag)? });
        sent += 1;
    }
    t.wait_all(&sends)
}

// ---------------------------------------------------------------------------------------------
// all_gather and reduce_scatter on the ring.
//
// Member m_p owns chunk p (all_gather: its piece; reduce_scatter: the chunk it ends with). Each
// chunk is cut into `m` pieces of at most PIECE bytes; k-1 steps move one chunk each, piece by
// piece, always to m_{p+1} and from m_{p-1}:
// - all_gather, step j: send chunk (p-j), receive chunk (p-j-1) straight into its place;
// - reduce_scatter, step j: send the partial sum of chunk (p-j-1) (at step 0 this member's own
//   contribution), receive the partial sum of chunk (p-j-2) and combine this member's
//   contribution into it. At the last step that is chunk p, combined straight into `out`.
// Every link carries (k-1)/k of the data once, the least any schedule can, and only between
// ring neighbours, which hosts/ joins with the full stream count, while a direct exchange has
// every member send to all others at once.
//
// Pipelining: items (step j, piece i) run in step-major order; the send of (j+1, i) is posted as
// soon as (j, i) is received (and combined), so a step starts piece by piece while the previous
// one finishes. Receives are posted up to RECV_AHEAD items ahead. Deadlock freedom is the
// all_reduce's argument: every send needs only receives of earlier items from the predecessor.
// ---------------------------------------------------------------------------------------------

#[allow(clippy::too_many_arguments)]
/// The pipelined k-1 steps shared by `all_gather` and `reduce_scatter`: `m` pieces per step;
/// `src(j, i)` is what item (j, i) sends, `dst(r, j, i)` where item r = (j, i) is received
/// (r lets a caller rotate scratch slots), and `done(t, j, i, sends)` runs once item (j, i) is
/// received. `before(j, i)` names an item whose send must be complete before `done(j, i)`
/// runs (a send reading memory that `done` rewrites); it is always one already posted.
///
/// # Safety
/// Every `src`/`dst` region stays valid until this returns (after an error: until the transport is
/// shut); a `dst` is ours from its item's posting (RECV_AHEAD early) until its `done`; a `src` is
/// complete before its send is posted (j > 0: after `done(j-1, i)`), unwritten while read.
unsafe fn steps<T: Transport + ?Sized>(
    t: &mut T,
    ring: Ring,
    tag: u64,
    m: usize,
    src: impl Fn(usize, usize) -> (*const u8, usize),
    dst: impl Fn(usize, usize, usize) -> (*mut u8, usize),
    before: impl Fn(usize, usize) -> Option<usize>,
    mut done: impl FnMut(usize, usize),
) -> Result<()> {
    let Ring { k, next, prev, .. } = ring;
    let n = (k - 1) * m;
    let mut waited = vec![false; n];
    let mut recvs: Vec<Handle> = Vec::with_capacity(n);
    let mut sends: Vec<Handle> = Vec::with_capacity(n);
    let post_recv = |t: &mut T, r: usize| -> Result<Handle> {
        let (d, len) = dst(r, r / m, r % m);
        // SAFETY: this fn's contract: the region is valid and ours from posting until `done`.
        unsafe { t.post_recv(prev, d, len, tag) }
    };
    for r in 0..n.min(RECV_AHEAD) {
        recvs.push(post_recv(t, r)?);
    }
    for r in 0..n {
        // Item x's send reads what item x - m brought: post every send whose input is here.
        while sends.len() < n && (sends.len() < m || sends.len() - m < r) {
            let x = sends.len();
            let (s, len) = src(x / m, x % m);
            // SAFETY: this fn's contract: the region is complete (item x - m was received and
            // `done` ran for it) and stays unwritten until the send is waited.
            sends.push(unsafe { t.post_send(next, s, len, tag)? });
        }
        t.wait(recvs[r])?;
        if let Some(x) = before(r / m, r % m) {
            debug_assert!(x < sends.len(), "item {r} waits send {x}, not posted yet");
            t.wait(sends[x])?;
            waited[x] = true;
        }
        done(r / m, r % m);
        if r + RECV_AHEAD < n {
            recvs.push(post_recv(t, r + RECV_AHEAD)?);
        }
    }
    while sends.len() < n {
        let x = sends.len();
        let (s, len) = src(x / m, x % m);
        // SAFETY: as in the loop: every item was received, so every input is complete.
        sends.push(unsafe { t.post_send(next, s, len, tag)? });
    }
    sends.into_iter().zip(waited).filter(|&(_, w)| !w).try_for_each(|(h, _)| t.wait(h))
}

/// Smallest pipeline piece of the ring all_gather and reduce_scatter: below it, a message's
/// fixed costs (a header, wake-ups, a few system calls) outweigh the overlap it buys.
const MIN_GATHER_PIECE: usize = 64 << 10;

/// Pieces per chunk of `bytes` (at least one, so empty chunks still make one message) and the
/// piece size, a multiple of `es`: at most PIECE, and at least a quarter of the chunk down to
/// MIN_GATHER_PIECE, so that a chunk of a few MiB still moves as several pieces and a step starts
/// before the previous one has wholly arrived (with one piece per chunk, each of the k-1 steps
/// waits for the whole chunk: a 4-host reduce_scatter of 4 MiB got 0.5-0.6 of the link).
fn pieces(bytes: usize, es: usize) -> (usize, usize) {
    let want = bytes.div_ceil(4).clamp(MIN_GATHER_PIECE, PIECE);
    let per = (want / es).max(1) * es;
    (bytes.div_ceil(per).max(1), per)
}

/// Piece i of a region of `len` bytes: its offset and length (empty past the end).
fn piece_of(len: usize, per: usize, i: usize) -> (usize, usize) {
    let s = (i * per).min(len);
    (s, (len - s).min(per))
}

/// all_gather on the ring: recv[q] = what member q sent (its `send`), recv[p] a copy of ours.
/// Regions are indexed by position in `members`, not by rank.
///
/// # Safety
/// `direct::exchange`'s contract for `send` and `recv`: valid until this returns (recv writable
/// and touched by nobody else), recv regions disjoint from each other and from `send` unless
/// recv[p] is `send` itself; after an error the caller shuts the transport down.
pub unsafe fn all_gather<T: Transport + ?Sized>(t: &mut T, members: &[usize], tag: u64, send: super::direct::Region, recv: &[super::direct::Region]) -> Result<()> {
    let ring = Ring::of(members, t.rank())?;
    let (k, p) = (ring.k, ring.p);
    if recv.len() != k {
        return Err(crate::error::Error::Mismatch(format!("{} output regions for {k} members", recv.len())));
    }
    if send.len != recv[p].len {
        return Err(crate::error::Error::Mismatch(format!("rank {} sends {} bytes but its own output holds {}", t.rank(), send.len, recv[p].len)));
    }
    if send.ptr != recv[p].ptr && send.len > 0 {
        // SAFETY: both hold send.len bytes (this fn's contract) and, being different regions,
        // do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(send.ptr, recv[p].ptr, send.len) };
    }
    if k == 1 {
        return Ok(());
    }
    let longest = recv.iter().map(|r| r.len).max().unwrap_or(0);
    let (m, per) = pieces(longest, 1);
    let chunk_sent = |j: usize| (p + k - j) % k;
    let chunk_recv = |j: usize| (p + 2 * k - j - 1) % k;
    // SAFETY: this fn's contract gives `steps`' own: each item sends a piece of recv[c] (our own
    // copy at step 0, else the chunk received at step j-1, complete and never written again) and
    // receives into a piece of recv[c'] that nobody else touches; pieces stay inside their region.
    unsafe {
        steps(
            t,
            ring,
            tag,
            m,
            |j, i| {
                let r = recv[chunk_sent(j)];
                let (off, len) = piece_of(r.len, per, i);
                (r.ptr.add(off) as *const u8, len)
            },
            |_, j, i| {
                let r = recv[chunk_recv(j)];
                let (off, len) = piece_of(r.len, per, i);
                (r.ptr.add(off), len)
            },
            |_, _| None,
            |_, _| {},
        )
    }
}

#[allow(clippy::too_many_arguments)]
/// reduce_scatter on the ring: out = op over all members of their send[p] (send[q] is this
/// member's contribution to member q's chunk, `count` elements each), divided by `avg_world` for
/// avg. Regions are indexed by position in `members`. Scratch: two chunks (the partial sums of
/// consecutive steps) and RECV_AHEAD pieces.
///
/// # Safety
/// `direct::reduce_scatter`'s: send regions and `out` hold `count` elements, element-aligned,
/// sends readable, `out` writable and ours, overlapping no send region but send[p] at its own
/// address, until this returns (after an error: until the caller shuts the transport).
pub unsafe fn reduce_scatter<T: Transport + ?Sized>(t: &mut T, members: &[usize], tag: u64, send: &[super::direct::Region], out: *mut u8, count: usize, dtype: DType, op: ReduceOp, avg_world: usize, scratch_buf: &mut Vec<u8>) -> Result<()> {
    let ring = Ring::of(members, t.rank())?;
    let (k, p) = (ring.k, ring.p);
    let es = dtype.size();
    let bytes = count * es;
    for (q, s) in send.iter().enumerate() {
        if s.len != bytes {
            return Err(crate::error::Error::Mismatch(format!("rank {} contributes {} bytes to rank {}, expected {bytes}", t.rank(), s.len, members[q])));
        }
    }
    if send.len() != k {
        return Err(crate::error::Error::Mismatch(format!("{} input regions for {k} members", send.len())));
    }
    if k == 1 {
        if send[0].ptr != out && bytes > 0 {
            // SAFETY: both hold `bytes` (this fn's contract) and, being different, do not overlap.
            unsafe { std::ptr::copy_nonoverlapping(send[0].ptr, out, bytes) };
        }
    } else {
        let (m, per) = pieces(bytes, es);
        let rop = summing(op);
        // Scratch: partial sums of steps of even and odd j (a chunk each), then the receive slots.
        let chunk = bytes.max(1);
        let base = scratch(scratch_buf, 2 * chunk + RECV_AHEAD * per.min(chunk)).as_mut_ptr();
        let slot = per.min(chunk);
        // SAFETY: the slots lie after the two chunks, inside the scratch just sized.
        let slots = unsafe { base.add(2 * chunk) };
        // SAFETY: the two partial-sum chunks are the scratch's first 2·chunk bytes.
        let partial = |j: usize| unsafe { base.add((j % 2) * chunk) };
        let chunk_sent = |j: usize| (p + 2 * k - j - 1) % k;
        let chunk_recv = |j: usize| (p + 2 * k - j - 2) % k;
        // SAFETY: this fn's contract gives `steps`' own. Step 0 sends pieces of our contribution
        // send[q]; step j > 0 the partial sum combined at step j-1, which `done` overwrites (two
        // steps later) only after waiting the send that read it. Receives go to slot r %
        // RECV_AHEAD, consumed by `done` before `steps` reposts it. Offsets stay in their regions.
        unsafe {
            steps(
                t,
                ring,
                tag,
                m,
                |j, i| {
                    let (off, len) = piece_of(bytes, per, i);
                    if j == 0 { (send[chunk_sent(0)].ptr.add(off) as *const u8, len) } else { (partial(j - 1).add(off) as *const u8, len) }
                },
                |r, _, i| (slots.add((r % RECV_AHEAD) * slot), piece_of(bytes, per, i).1),
                // partial(j) was last read by the send of item (j-1, i) (it sent partial(j-2)).
                |j, i| (j >= 2 && j < k - 2).then(|| (j - 1) * m + i),
                |j, i| {
                    let (off, len) = piece_of(bytes, per, i);
                    let mine = send[chunk_recv(j)].ptr.add(off) as *const u8;
                    let got = slots.add(((j * m + i) % RECV_AHEAD) * slot) as *const u8;
                    let dst = if j == k - 2 { out.add(off) } else { partial(j).add(off) };
                    // `mine (op) theirs` into dst: `out` (aliasing only `mine`, send[p], at the
                    // same address, at the last step) or a partial sum no send reads any more.
                    combine(dst, mine, got, len / es, dtype, rop);
                },
            )?;
        }
    }
    if op == ReduceOp::Avg && bytes > 0 {
        // SAFETY: `out` is writable for `bytes` and ours (this fn's contract); every transfer was
        // waited, so nothing else touches it now.
        divide(unsafe { std::slice::from_raw_parts_mut(out, bytes) }, dtype, avg_world);
    }
    Ok(())
}
