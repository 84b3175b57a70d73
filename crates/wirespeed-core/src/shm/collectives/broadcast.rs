//! The two-rank broadcast past the staging size, each side copying half.
use crate::api::Buf;
use crate::error::Result;
use crate::shm::comm::Comm;
use crate::shm::segment::{DescHeader, Piece, MODE_ADDR};

impl Comm {
    /// Broadcast between 2 ranks, past the staging size: each rank publishes its buffer (the
    /// root's to be read, the other's to be filled) and both copy half at once, the receiver
    /// reading the front with process_vm_readv while the root writes the back with
    /// process_vm_writev: two cores copy where one would. The headers (compared by
    /// publish_and_sync) carry the byte count and this choice, so both ranks agree on both.
    ///
    /// # Safety
    /// `buf` meets `Collectives`' contract (api.rs) until this returns: readable on the root,
    /// writable and ours elsewhere. Each side publishes it for the other to read or write in
    /// place; both end in a sync, so neither returns while the other still copies.
    pub(super) unsafe fn broadcast_split(&mut self, h: DescHeader, buf: Buf, root: usize) -> Result<()> {
        let peer = 1 - self.rank;
        let mut pieces = vec![Piece::default(); 2];
        pieces[peer] = Piece { mode: MODE_ADDR, loc: buf.0 as u64, len: buf.1 as u64 };
        let parity = self.publish_and_sync(h, &pieces)?;
        let theirs = self.net.segs[peer].piece(parity, self.rank);
        // Halves split at a multiple of 4096 bytes (on a page boundary when the buffer is aligned).
        let front = (buf.1 / 2).next_multiple_of(4096).min(buf.1);
        if self.rank == root {
            // write_to writes nothing into a receiver that gave up (marked itself aborted).
            self.net.write_to(peer, theirs.loc + front as u64, (buf.0 + front) as *const u8, buf.1 - front)?;
            // Neither buffer may be touched by its owner until both halves have landed.
            self.net.sync()
        } else {
            let read = self.net.read_from(peer, theirs.loc, buf.0 as *mut u8, front);
            // Even when the read failed, wait for the root to be done writing into this buffer
            // (its sync, or its abort), bounded by the timeout, before the caller gets it back.
            let landed = self.net.sync();
            read.and(landed)
        }
    }

}
