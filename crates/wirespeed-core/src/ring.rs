//! The ring all_reduce (bandwidth-optimal among the ranks it joins), across hosts: over every
//! rank (WIRESPEED_ALGO=ring) or among host leaders inside the hierarchical all_reduce (hier.rs).
//!
//! Ring over members m_0..m_{k-1} (this rank is m_p). The buffer is cut into slices of k pieces
//! of at most `RING_PIECE` bytes; each slice runs the textbook ring on its own:
//! - reduce-scatter, k-1 steps: at step s send piece (p-s) to m_{p+1} and receive piece (p-s-1)
//!   from m_{p-1}, reducing it into the buffer. After it, piece (p+1) is complete here (for avg it
//!   is divided by the world size here, once).
//! - all-gather, k-1 steps: at step s send piece (p+1-s) and receive piece (p-s) straight into the
//!   buffer. Every piece is reduced on one rank and copied everywhere: identical bits on all ranks.
//!
//! Slices are software-pipelined: step j of slice i is scheduled at wave i + LOOKAHEAD·j, so a
//! step's send waits only for the previous step's receive of the same slice, while sends of later
//! slices keep the link busy. A plain "reduce-scatter, then all-gather" leaves each link idle at
//! the phase boundary for a whole queue's drain (the last reduce-scatter byte must arrive before
//! the first all-gather byte leaves), which cost ~10% of a 2-host 1 Gbit/s ring here.
//!
//! Every rank walks the same schedule, so its sends to m_{p+1} come in the order m_{p+1}
//! receives them (TCP and shm messages between a pair are matched in order). A send is posted as
//! soon as the receive it depends on is done, never later: a rank waiting for a message from its
//! predecessor therefore waits for a rank that is itself further ahead or waiting further round
//! the ring, which cannot close into a cycle. Buffer safety: a region is received into only after
//! the data that arrives for it passed through every earlier send of it (the ring's causality), so
//! no send (queued for TCP, or read in place over shm) can see it overwritten.
use crate::dtype::{DType, ReduceOp};
use crate::error::Result;
use crate::hosts::HostsComm;
use crate::reduce::reduce_many;

/// Largest piece one ring step moves: small enough that several are in flight on a link.
const RING_PIECE: usize = 1 << 20;
/// How many waves ahead of a slice the next slice runs: the pieces a rank has posted beyond the
/// one it waits for (about LOOKAHEAD·2 pieces, 8 MiB here, ~70 ms of a 1 Gbit/s link).
const LOOKAHEAD: usize = 4;

impl HostsComm {
    /// In-place ring all_reduce of `count` elements at `buf` among `members` (global ranks, this
    /// rank among them); avg divides by the group's world size.
    pub(crate) fn ring_all_reduce(&mut self, tag: u64, members: &[usize], buf: usize, count: usize, dtype: DType, op: ReduceOp) -> Result<()> {
        let k = members.len();
        let es = dtype.size();
        let world = self.world;
        let p = members.iter().position(|&r| r == self.rank).expect("this rank is a ring member");
        let rop = if op == ReduceOp::Avg { ReduceOp::Sum } else { op };
        if k == 1 {
            if op == ReduceOp::Avg {
                let b = buf as *mut u8;
                unsafe { reduce_many(b, &[b as *const u8], count, dtype, ReduceOp::Avg, world) };
            }
            return Ok(());
        }
        // Slices of k pieces; piece `c` of slice `i` is elements [i·slice + c·per, ..) clipped.
        let per = (RING_PIECE / es).max(1).min(count.div_ceil(k).max(1));
        let slice = per * k;
        let nslices = count.div_ceil(slice).max(1);
        let piece = |i: usize, c: usize| -> (usize, usize) {
            let s = (i * slice + c * per).min(count);
            let e = (i * slice + (c + 1) * per).min(count).min((i + 1) * slice);
            (buf + s * es, (e.max(s) - s) * es)
        };
        let steps = 2 * (k - 1);
        // (slice, step) in schedule order: by wave, then by step.
        let mut items: Vec<(usize, usize)> = (0..nslices).flat_map(|i| (0..steps).map(move |j| (i, j))).collect();
        items.sort_by_key(|&(i, j)| (i + LOOKAHEAD * j, j));
        let mut pos = vec![0usize; nslices * steps];
        for (t, &(i, j)) in items.iter().enumerate() {
            pos[i * steps + j] = t;
        }
        // What step j of a slice sends and receives (piece indices), and whether it reduces.
        let send_piece = |j: usize| if j < k - 1 { (p + k - j) % k } else { (p + 1 + k - (j - (k - 1))) % k };
        let recv_piece = |j: usize| if j < k - 1 { (p + 2 * k - j - 1) % k } else { (p + k - (j - (k - 1))) % k };
        let next = members[(p + 1) % k];
        let prev = members[(p + k - 1) % k];
        let scratch = self.scratch(per * es);
        let mut tickets = Vec::with_capacity(items.len());
        let mut sent = 0usize;
        for r in 0..items.len() {
            // Post every send whose input is complete: step 0 reads the rank's own data, step j
            // the piece received at step j-1 of the same slice (received iff its position < r).
            while sent < items.len() {
                let (i, j) = items[sent];
                if j > 0 && pos[i * steps + j - 1] >= r {
                    break;
                }
                tickets.push(self.post(next, piece(i, send_piece(j)), tag)?);
                sent += 1;
            }
            let (i, j) = items[r];
            let (rb, rl) = piece(i, recv_piece(j));
            if j < k - 1 {
                self.take(prev, (scratch, rl), tag)?;
                let dst = rb as *mut u8;
                unsafe { reduce_many(dst, &[dst as *const u8, scratch as *const u8], rl / es, dtype, rop, 2) };
                if j == k - 2 && op == ReduceOp::Avg {
                    // Piece (p+1) of this slice is now complete here: divide once, before it is sent.
                    unsafe { reduce_many(dst, &[dst as *const u8], rl / es, dtype, ReduceOp::Avg, world) };
                }
            } else {
                self.take(prev, (rb, rl), tag)?;
            }
        }
        while sent < items.len() {
            let (i, j) = items[sent];
            tickets.push(self.post(next, piece(i, send_piece(j)), tag)?);
            sent += 1;
        }
        tickets.iter().try_for_each(|t| t.wait())
    }
}
