//! `reduce_to_me`, the primitive of the reducing collectives: a rank reduces what every rank
//! contributes to it, block by block in cache (`reduce_blocks`); and the chunks rsag and
//! reduce_scatter split a buffer into.
use super::Mode;
use crate::api::Buf;
use crate::dtype::{DType, ReduceOp};
use crate::error::Result;
use crate::kernels::reduce::reduce_many;
use crate::shm::comm::Comm;
use crate::shm::segment::{DescHeader, MODE_SLOT};

impl Comm {
    #[allow(clippy::too_many_arguments)]
    /// out[0..count] = op over ranks j of what j contributes to this rank. Returns the parity and
    /// whether a final sync is due (left to the caller, which may have more to do first).
    ///
    /// # Safety
    /// `send`: a readable range per rank; `out`: `count` writable elements of `dtype`, ours,
    /// overlapped by no send range but send[rank] at its address; all aligned; so until return
    /// and, when a sync is due, until the caller's sync (peers read unstaged ranges in place).
    pub(super) unsafe fn reduce_to_me(&mut self, h: DescHeader, send: &[Buf], out: usize, count: usize, dtype: DType, op: ReduceOp, mode: Mode) -> Result<(usize, bool)> {
        // SAFETY: this fn's contract: `send` is readable, and what is published in place stays
        // so until the sync this returns as due.
        let pieces = unsafe { self.pieces(send, mode) };
        let parity = self.publish_and_sync(h, &pieces)?;
        let esize = dtype.size();
        self.check_lengths(parity, &|_| count * esize, h.kind)?;
        let bytes = count * esize;
        // SAFETY: this fn's contract, which is reduce_blocks': `send` readable, `out` writable for
        // `bytes` and aliasing only send[rank]; check_lengths made every piece `bytes` long.
        unsafe { self.reduce_blocks(parity, send, out, bytes, dtype, op, |_, _| Ok(()))? };
        let sync_due = self.any_direct(parity);
        Ok((parity, sync_due))
    }

    #[allow(clippy::too_many_arguments)]
    /// out[0..bytes] = op over ranks j of what j published to this rank (`parity`'s pieces,
    /// `bytes` long each: the caller checked), block by block in cache: each peer's block is read
    /// from its slot where staged, else into a cache-resident scratch; `each(b, nb)` runs after
    /// the block at byte b (nb bytes) is reduced into `out`, while it is still in this core's cache.
    ///
    /// # Safety
    /// As `reduce_to_me`'s: send[rank] readable for `bytes`; `out` writable for `bytes` bytes and
    /// ours alone, overlapping no send range except send[rank] at the same address; aligned for
    /// `dtype`.
    pub(super) unsafe fn reduce_blocks(&mut self, parity: usize, send: &[Buf], out: usize, bytes: usize, dtype: DType, op: ReduceOp,
                            mut each: impl FnMut(usize, usize) -> Result<()>) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        let esize = dtype.size();
        let block = self.tuning.block_for(self.world).min(bytes).next_multiple_of(64);
        // Each peer's block lands at the same offset within a page as its source: on AMD Zen
        // (this VM), a `rep movsb` copy (the kernel's, for process_vm_readv) whose destination
        // lies 1-31 bytes past its source modulo 4096 runs ~20x slower (2 GB/s, not 40).
        let stride = block + 4096;
        let scratch = (self.scratch(stride * self.world + 4096) as usize).next_multiple_of(4096);
        let mut srcs: Vec<*const u8> = vec![std::ptr::null(); self.world];
        let mut b = 0;
        while b < bytes {
            let nb = block.min(bytes - b);
            for j in 0..self.world {
                srcs[j] = if j == self.rank {
                    (send[j].0 + b) as *const u8
                } else {
                    let p = self.net.segs[j].piece(parity, self.rank);
                    if p.mode == MODE_SLOT {
                        // SAFETY: rank j staged this piece in its slot of this parity
                        // (`pieces`: loc + len within the slot), and b < bytes = len
                        // (the caller's check), so the pointer stays inside j's mapping.
                        unsafe { self.net.segs[j].slot(parity).add(p.loc as usize + b) as *const u8 }
                    } else {
                        let dst = scratch + j * stride + (p.loc as usize + b) % 4096;
                        self.net.read_from(j, p.loc + b as u64, dst as *mut u8, nb)?;
                        dst as *const u8
                    }
                };
            }
            // Each source holds nb bytes: send[rank] + b (`bytes` long), a peer's staged piece
            // (above), or the block read into scratch slot j (stride block + 4096: room for the
            // in-page offset plus nb, alignment kept).
            // SAFETY: `out + b` is writable for nb bytes (contract); it aliases only send[rank].
            unsafe { reduce_many((out + b) as *mut u8, &srcs, nb / esize, dtype, op, self.world) };
            each(b, nb)?;
            b += nb;
        }
        Ok(())
    }

    pub(super) fn chunks(&self, count: usize, esize: usize) -> Vec<(usize, usize)> {
        // Chunks a multiple of 64 bytes so no two ranks write into one cache line.
        let align = (64 / esize).max(1);
        let per = count.div_ceil(self.world).next_multiple_of(align);
        (0..self.world)
            .map(|r| {
                let s = (r * per).min(count);
                let e = ((r + 1) * per).min(count);
                (s, e - s)
            })
            .collect()
    }
}
