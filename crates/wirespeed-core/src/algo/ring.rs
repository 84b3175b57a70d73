//! The ring all_reduce: bandwidth-optimal among the members it joins.
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

/// In-place all_reduce of `buf` (elements of `dtype`) among `members`.
pub fn all_reduce<T: Transport + ?Sized>(t: &mut T, members: &[usize], tag: u64, buf: &mut [u8], dtype: DType, op: ReduceOp, avg_world: usize, scratch_buf: &mut Vec<u8>) -> Result<()> {
    let k = members.len();
    let es = dtype.size();
    let count = buf.len() / es;
    let p = position(members, t.rank())?;
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
    let (next, prev) = (members[(p + 1) % k], members[(p + k - 1) % k]);
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
