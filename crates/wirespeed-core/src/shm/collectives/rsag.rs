//! `rsag`, the one-host all_reduce past the staging slot (its own file for length; it uses the
//! parent's descriptor helpers).
use super::Mode;
use crate::api::Buf;
use crate::dtype::{DType, ReduceOp};
use crate::error::Result;
use crate::kernels::reduce::reduce_many;
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
    // SAFETY: unsafe to call: `rsag` relies on its callers for this (`# Safety` above).
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
        let r = if mine > 0 {
            let block = self.tuning.block_bytes.min(mine).next_multiple_of(64);
            // Each peer's block lands at the same offset within a page as its source: on AMD Zen,
            // a `rep movsb` copy (the kernel's, for process_vm_readv) whose destination lies 1-31
            // bytes past its source modulo 4096 runs ~20x slower (2 GB/s, not 40).
            let stride = block + 4096;
            let scratch = (self.scratch(stride * world + 4096) as usize).next_multiple_of(4096);
            let mut srcs: Vec<*const u8> = vec![std::ptr::null(); world];
            let out = send[me].0;
            let at: Vec<u64> = (0..world).map(|j| self.net.segs[j].piece(parity, me).loc).collect();
            let net = self.net.clone();
            let mut b = 0;
            let mut res = Ok(());
            while b < mine {
                let nb = block.min(mine - b);
                for j in 0..world {
                    srcs[j] = if j == me {
                        (out + b) as *const u8
                    } else {
                        let dst = scratch + j * stride + (at[j] as usize + b) % 4096;
                        res = net.read_from(j, at[j] + b as u64, dst as *mut u8, nb);
                        if res.is_err() {
                            break;
                        }
                        dst as *const u8
                    };
                }
                if res.is_err() {
                    break;
                }
                // Each source holds nb bytes: out + b (our chunk, `mine` bytes) or the block read
                // into scratch slot j (stride block + 4096: room for the in-page offset plus nb).
                // SAFETY: `out + b` is writable for nb bytes (this fn's contract) and aliases only
                // srcs[me], at the same address, as reduce_many allows.
                unsafe { reduce_many((out + b) as *mut u8, &srcs, nb / es, dtype, op, world) };
                for k in 1..world {
                    let j = (me + k) % world;
                    if let Err(e) = net.write_to(j, at[j] + b as u64, (out + b) as *const u8, nb) {
                        res = Err(e);
                        break;
                    }
                }
                if res.is_err() {
                    break;
                }
                b += nb;
            }
            res
        } else {
            Ok(())
        };
        // Peers may still be reading and writing this rank's buffer. Even after a failed write,
        // wait (bounded by the timeout, cut short by peers' aborts) for them to be done with it.
        let closed = self.net.sync();
        r.and(closed)
    }
}
