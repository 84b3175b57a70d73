//! all_reduce across hosts: the ring (bandwidth-optimal among the ranks it joins) and the
//! hierarchical all_reduce built on it.
//!
//! Ring over members m_0..m_{k-1} (this rank is m_p), the buffer cut into k chunks:
//! - reduce-scatter, k-1 steps: at step s send chunk (p-s) to m_{p+1} and receive chunk (p-s-1)
//!   from m_{p-1}, reducing it into the buffer. After it, chunk (p+1) is complete here (for avg it
//!   is divided by the world size here, once).
//! - all-gather, k-1 steps: at step s send chunk (p+1-s) and receive chunk (p-s) straight into the
//!   buffer. Every chunk is reduced on one rank and copied everywhere: identical bits on all ranks.
//! Each step moves its chunk in 4 MiB pieces: piece q+1.. are on the wire while piece q is reduced,
//! so the link never idles for a reduction. A step waits for its sends before the next, so no
//! region is overwritten while a peer may still be reading it.
//!
//! Hierarchical (the default across hosts): shm reduce onto each host's leader (its lowest rank),
//! ring among the leaders over TCP, shm broadcast from the leader. Each host's link carries
//! 2·S·(H-1)/H bytes each way whatever the number of ranks per host, where a flat ring over ranks
//! placed round robin sends every hop over a link.
use crate::dtype::{DType, ReduceOp};
use crate::error::Result;
use crate::hosts::{pieces, HostsComm, PIECE};
use crate::reduce::reduce_many;

impl HostsComm {
    /// In-place ring all_reduce of `count` elements at `buf` among `members` (global ranks, this
    /// rank among them); avg divides by the group's world size.
    pub(crate) fn ring_all_reduce(&mut self, tag: u64, members: &[usize], buf: usize, count: usize, dtype: DType, op: ReduceOp) -> Result<()> {
        let k = members.len();
        let es = dtype.size();
        let world = self.world;
        let p = members.iter().position(|&r| r == self.rank).expect("this rank is a ring member");
        let rop = if op == ReduceOp::Avg { ReduceOp::Sum } else { op };
        let per = count.div_ceil(k);
        let chunk = |i: usize| -> (usize, usize) {
            let s = (i * per).min(count);
            (buf + s * es, ((i + 1) * per).min(count) * es - s * es)
        };
        let next = members[(p + 1) % k];
        let prev = members[(p + k - 1) % k];
        let scratch = self.scratch(PIECE);
        for s in 0..k.saturating_sub(1) {
            let (sb, sl) = chunk((p + k - s) % k);
            let (rb, rl) = chunk((p + 2 * k - s - 1) % k);
            let (sp, rp) = (pieces(sl, es), pieces(rl, es));
            let mut tickets = Vec::with_capacity(sp.len());
            for q in 0..sp.len().max(rp.len()) {
                if let Some(&(off, n)) = sp.get(q) {
                    tickets.push(self.post(next, (sb + off, n), tag)?);
                }
                if let Some(&(off, n)) = rp.get(q) {
                    self.take(prev, (scratch, n), tag)?;
                    let dst = (rb + off) as *mut u8;
                    unsafe { reduce_many(dst, &[dst as *const u8, scratch as *const u8], n / es, dtype, rop, 2) };
                }
            }
            tickets.iter().try_for_each(|t| t.wait())?;
        }
        if op == ReduceOp::Avg {
            let (b, l) = if k == 1 { (buf, count * es) } else { chunk((p + 1) % k) };
            let p = b as *mut u8;
            unsafe { reduce_many(p, &[p as *const u8], l / es, dtype, ReduceOp::Avg, world) };
        }
        for s in 0..k.saturating_sub(1) {
            let (sb, sl) = chunk((p + 1 + k - s) % k);
            let (rb, rl) = chunk((p + k - s) % k);
            let (sp, rp) = (pieces(sl, es), pieces(rl, es));
            let mut tickets = Vec::with_capacity(sp.len());
            for q in 0..sp.len().max(rp.len()) {
                if let Some(&(off, n)) = sp.get(q) {
                    tickets.push(self.post(next, (sb + off, n), tag)?);
                }
                if let Some(&(off, n)) = rp.get(q) {
                    self.take(prev, (rb + off, n), tag)?;
                }
            }
            tickets.iter().try_for_each(|t| t.wait())?;
        }
        Ok(())
    }

    /// Hierarchical all_reduce (see the module comment).
    pub(crate) fn hier_all_reduce(&mut self, tag: u64, buf: usize, count: usize, dtype: DType, op: ReduceOp) -> Result<()> {
        // avg: sum inside hosts; the ring divides by the whole world once.
        let local_op = if op == ReduceOp::Avg { ReduceOp::Sum } else { op };
        let nlocal = self.hosts()[self.my_host()].len();
        if nlocal > 1 {
            self.local.reduce(buf, count, dtype, local_op, 0)?;
        }
        if self.is_leader() {
            let leaders: Vec<usize> = self.hosts().iter().map(|h| h[0]).collect();
            self.ring_all_reduce(tag, &leaders, buf, count, dtype, op)?;
        }
        if nlocal > 1 {
            self.local.broadcast((buf, count * dtype.size()), 0)?;
        }
        Ok(())
    }
}
