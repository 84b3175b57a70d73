//! `rsag`, the one-host all_reduce past the staging slot: `reduce_blocks` (reduce.rs) over each
//! rank's chunk, each reduced block written back into the peers' buffers.
use super::Mode;
use crate::api::Buf;
use crate::dtype::{DType, ReduceOp};
use crate::error::Result;
use crate::shm::comm::Comm;
use crate::shm::segment::DescHeader;

impl Comm {
    /// In-place all_reduce past the staging slot: each rank reduces one chunk of every rank's
    /// buffer and writes the result back into every buffer (reduce-scatter and all-gather fused).
    /// Rank r takes chunk r block by block: it reads each peer's block into scratch
    /// (process_vm_readv), sums them into its own buffer, then writes the summed block into the
    /// same place in each peer's buffer (process_vm_writev): the piece a rank publishes to r is
    /// both what r reads and where r writes. Only rank r touches chunk r of a peer's buffer
    /// during the op, so no block needs a sync of its own: one sync opens the op (every buffer
    /// published) and one closes it (every write landed).
    ///
    /// Why write rather than let each peer read the result afterwards (the former way: a sync,
    /// then each rank read every peer's whole chunk): the write's source is the block just summed
    /// and its destination the block just read, both still in this core's cache, so the gather
    /// costs no trip to memory. Read afterwards, the chunk a peer summed milliseconds ago came
    /// from memory whenever the op began with cold caches (after a pause or another library's
    /// ops): 16 MiB on 2 ranks spent 1.7 ms in that read against 0.7 ms warm (benchmarks/README.md).
    ///
    /// # Safety
    /// `buf` holds `count` elements of `dtype`, aligned, readable, writable and touched by
    /// nobody else until this returns (peers read and write its chunks in place meanwhile; the
    /// closing sync waits for them).
    pub(super) unsafe fn rsag(&mut self, h: DescHeader, buf: usize, count: usize, dtype: DType, op: ReduceOp) -> Result<()> {
        let es = dtype.size();
        let (me, world) = (self.rank, self.world);
        let ch = self.chunks(count, es);
        let send: Vec<Buf> = ch.iter().map(|&(s, n)| (buf + s * es, n * es)).collect();
        // SAFETY: this fn's contract: `buf` is readable and writable, and, published in place
        // (Direct), stays so until the closing sync below.
        let pieces = unsafe { self.pieces(&send, Mode::Direct) };
        let parity = self.publish_and_sync(h, &pieces)?;
        let mine = send[me].1;
        self.check_lengths(parity, &|_| mine, h.kind)?;
        let out = send[me].0;
        let at: Vec<u64> = (0..world).map(|j| self.net.segs[j].piece(parity, me).loc).collect();
        let net = self.net.clone();
        // SAFETY: this fn's contract: our chunk send[me] is readable and writable, `out` is it, at
        // the same address; check_lengths made every peer's piece to this rank `mine` long.
        let r = unsafe {
            self.reduce_blocks(parity, &send, out, mine, dtype, op, |b, nb| {
                for k in 1..world {
                    let j = (me + k) % world;
                    net.write_to(j, at[j] + b as u64, (out + b) as *const u8, nb)?;
                }
                Ok(())
            })
        };
        // Peers may still be reading and writing this rank's buffer. Even after a failed write,
        // wait (bounded by the timeout, cut short by peers' aborts) for them to be done with it.
        let closed = self.net.sync();
        r.and(closed)
    }
}
