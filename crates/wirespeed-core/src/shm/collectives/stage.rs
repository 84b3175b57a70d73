//! Staging and fetching: what a rank publishes to each peer (`pieces`), how it reads what each
//! peer publishes to it (`fetch`), and `exchange`, the primitive of the collectives that move
//! bytes without reducing them.
use super::Mode;
use crate::api::{Buf, Kind};
use crate::error::{Error, Result};
use crate::kernels::copy;
use crate::shm::comm::Comm;
use crate::shm::segment::{DescHeader, Piece, MODE_ADDR, MODE_NONE, MODE_SLOT};

impl Comm {
    /// Describe (and, when staging, copy) what this rank contributes to each destination.
    ///
    /// # Safety
    /// Every non-empty `send[j]` readable and unwritten for the call (staging copies it); one
    /// left unstaged (MODE_ADDR), which rank j reads in place, stays so until the op's closing
    /// sync (`exchange`, `reduce_to_me`'s `sync_due`).
    pub(super) unsafe fn pieces(&mut self, send: &[Buf], mode: Mode) -> Vec<Piece> {
        let parity = ((self.seq) % 2) as usize;
        let mut uniq: Vec<Buf> = Vec::new();
        for &(a, l) in send {
            if l > 0 && !uniq.contains(&(a, l)) {
                uniq.push((a, l));
            }
        }
        let total: usize = uniq.iter().map(|&(_, l)| l.next_multiple_of(64)).sum();
        let stage = match mode {
            Mode::Stage => total <= self.lay.slot_bytes,
            Mode::Direct => false,
            Mode::Auto => total <= self.tuning.stage_max.min(self.lay.slot_bytes),
            Mode::Copy => self.tuning.exchange_stages(total, self.world),
        };
        if !stage {
            return send.iter().map(|&(a, l)| Piece { mode: if l > 0 { MODE_ADDR } else { MODE_NONE }, loc: a as u64, len: l as u64 }).collect();
        }
        let slot = self.own().slot(parity);
        let mut offs = Vec::with_capacity(uniq.len());
        let mut off = 0usize;
        for &(a, l) in &uniq {
            // Staging happens only when the unique ranges, each rounded up to 64 bytes, total at
            // most `slot_bytes`; no peer reads this rank's slot of this parity now (op seq-2's
            // contents were read before op seq-1's first sync, which this rank has passed).
            // SAFETY: `a..a+l` is readable (contract); off + l fits the slot, our own segment.
            unsafe { copy::copy(slot.add(off), a as *const u8, l) };
            offs.push(off);
            off += l.next_multiple_of(64);
        }
        send.iter()
            .map(|&(a, l)| {
                if l == 0 {
                    Piece::default()
                } else {
                    let i = uniq.iter().position(|&u| u == (a, l)).unwrap();
                    Piece { mode: MODE_SLOT, loc: offs[i] as u64, len: l as u64 }
                }
            })
            .collect()
    }

    /// Whether any rank exposed its own memory to a peer in this op (then a final sync is due).
    pub(super) fn any_direct(&self, parity: usize) -> bool {
        (0..self.world).any(|r| (0..self.world).any(|to| to != r && {
            let p = self.net.segs[r].piece(parity, to);
            p.mode == MODE_ADDR && p.len > 0
        }))
    }

    /// Check each peer contributes exactly what this rank expects; a disagreement is seen by the
    /// receiver only, so it breaks the group to stop the others too.
    pub(super) fn check_lengths(&mut self, parity: usize, want: &dyn Fn(usize) -> usize, kind: u32) -> Result<()> {
        for j in 0..self.world {
            let p = self.net.segs[j].piece(parity, self.rank);
            if p.len as usize != want(j) {
                let e = Error::Mismatch(format!(
                    "{}: rank {j} sends {} bytes to rank {}, which expects {}",
                    Kind::name_of(kind), p.len, self.rank, want(j)
                ));
                self.fail(&e);
                return Err(e);
            }
        }
        Ok(())
    }

    /// Copy what rank `j` contributes to this rank (its piece of op `parity`) into `dst`; this
    /// rank's own contribution is at `own_src`.
    ///
    /// # Safety
    /// `dst..dst+len` is writable, and touched by nobody else, for the call; if `j` is this rank,
    /// `own_src..own_src+len` is readable and either is `dst` or overlaps it nowhere. Rank j's
    /// piece to this rank is `len` bytes long (`check_lengths`).
    pub(super) unsafe fn fetch(&self, parity: usize, j: usize, own_src: usize, dst: usize, len: usize) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        if j == self.rank {
            if own_src != dst {
                // SAFETY: this fn's contract: both ranges hold `len` bytes for the call and, not
                // being the same address, do not overlap.
                unsafe { copy::copy(dst as *mut u8, own_src as *const u8, len) };
            }
            return Ok(());
        }
        let p = self.net.segs[j].piece(parity, self.rank);
        match p.mode {
            MODE_SLOT => {
                // SAFETY: `dst` holds `len` bytes (this fn's contract). Rank j staged this piece
                // in its slot of this parity (`pieces`), so loc + len is within the slot, and it
                // stays there until every rank has passed the next op's first sync. A peer's
                // mapping and the caller's buffer do not overlap.
                unsafe { copy::copy(dst as *mut u8, self.net.segs[j].slot(parity).add(p.loc as usize), len) };
                Ok(())
            }
            _ => self.net.read_from(j, p.loc, dst as *mut u8, len),
        }
    }

    /// recv[j] = what rank j contributes to this rank (its send[rank]), through the descriptors.
    ///
    /// # Safety
    /// `Collectives`' contract (api.rs) for the call: a range per rank, every send[j] readable,
    /// every recv[j] writable and ours, recv[rank] send[rank] or disjoint from it. Ranges peers
    /// read in place are free on return: the closing sync (`any_direct`) waits for every reader.
    pub(super) unsafe fn exchange(&mut self, h: DescHeader, send: &[Buf], recv: &[Buf], mode: Mode) -> Result<()> {
        // SAFETY: this fn's contract: `send` is readable, and what is published in place stays
        // so until the closing sync below.
        let pieces = unsafe { self.pieces(send, mode) };
        let parity = self.publish_and_sync(h, &pieces)?;
        self.check_lengths(parity, &|j| recv[j].1, h.kind)?;
        for k in 0..self.world {
            let j = (self.rank + k) % self.world;
            // SAFETY: this fn's contract: recv[j] is writable for recv[j].1 bytes and ours alone,
            // send[rank] readable (or recv[rank] itself); check_lengths made rank j's piece to
            // this rank recv[j].1 bytes long.
            unsafe { self.fetch(parity, j, send[self.rank].0, recv[j].0, recv[j].1)? };
        }
        if self.any_direct(parity) {
            self.net.sync()?;
        }
        Ok(())
    }
}
