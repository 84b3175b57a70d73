//! The collectives, built from two primitives over the op descriptor:
//! - `exchange`: every rank publishes, per destination, where the bytes it contributes lie
//!   (its staging slot for small data, its own memory otherwise); every rank then fetches what
//!   each peer contributes to it. all_gather, all_to_all, broadcast, gather, scatter, barrier.
//! - `reduce_to_me`: the same publication, but a rank reduces what every rank contributes to it,
//!   block by block in cache. reduce_scatter, reduce, and the one-shot all_reduce.
//! - `rsag`, the all_reduce past the staging slot: as `reduce_to_me` over chunks, each rank then
//!   writing its reduced blocks straight into the peers' buffers where it read them.
//!
//! A rank stages into its slot or exposes its memory on its own: readers handle each peer's
//! choice, and since all ranks see all descriptors they agree on whether a final sync is needed
//! (it is whenever a rank's memory is read directly, so it must not return and reuse it early).
//! Slots alternate by op parity, so staged data of op s is never overwritten before every peer
//! has passed op s+1's first sync, i.e. finished reading it.
use crate::api::{check_list, check_rank, Buf, Collectives, Kind, Ticket};
use crate::plan::ShmAlgo;
use super::comm::Comm;
use crate::dtype::{DType, ReduceOp};
use crate::error::{Error, Result};
use crate::kernels::reduce::reduce_many;
use super::segment::{DescHeader, Piece, MODE_ADDR, MODE_NONE, MODE_SLOT};
use crate::kernels::copy;

mod rsag;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Stage reductions' inputs up to `stage_max`.
    Auto,
    /// Stage what an exchange sends as `Tuning::exchange_stages` says.
    Copy,
    Stage,
    Direct,
}

/// Count for the descriptor check when sizes may legitimately differ between ranks.
const ANY_COUNT: u64 = u64::MAX;

impl Comm {
    fn header(&mut self, kind: Kind, dtype: Option<DType>, op: Option<ReduceOp>, root: usize, count: u64, algo: u32) -> DescHeader {
        self.seq += 1;
        DescHeader {
            seq: self.seq,
            kind: kind.code(),
            dtype: dtype.map(|d| d as u32).unwrap_or(u32::MAX),
            op: op.map(|o| o as u32).unwrap_or(u32::MAX),
            root: root as u32,
            count,
            algo,
        }
    }

    /// Describe (and, when staging, copy) what this rank contributes to each destination.
    ///
    /// # Safety
    /// Every non-empty `send[j]` is readable for its length, and written by nobody, for the
    /// call: staging copies it. One that is not staged is published (MODE_ADDR) for rank j to
    /// read in place, so the caller keeps it so until the op's closing sync (`exchange`,
    /// `reduce_to_me`'s `sync_due`).
    // SAFETY: unsafe to call: `pieces` relies on its callers for this (`# Safety` above): Every non-empty `send[j]` is readable for its length, and written by nobody, for the call: staging copies it. One that is not staged is published ...
    unsafe fn pieces(&mut self, send: &[Buf], mode: Mode) -> Vec<Piece> {
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
    fn any_direct(&self, parity: usize) -> bool {
        (0..self.world).any(|r| (0..self.world).any(|to| to != r && {
            let p = self.net.segs[r].piece(parity, to);
            p.mode == MODE_ADDR && p.len > 0
        }))
    }

    /// Check each peer contributes exactly what this rank expects; a disagreement is seen by the
    /// receiver only, so it breaks the group to stop the others too.
    fn check_lengths(&mut self, parity: usize, want: &dyn Fn(usize) -> usize, kind: u32) -> Result<()> {
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
    // SAFETY: unsafe to call: `fetch` relies on its callers for this (`# Safety` above): `dst..dst+len` is writable, and touched by nobody else, for the call; if `j` is this rank, `own_src..own_src+len` is readable and either is `dst` or ...
    unsafe fn fetch(&self, parity: usize, j: usize, own_src: usize, dst: usize, len: usize) -> Result<()> {
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
    /// `send` and `recv` hold one range per rank and meet `Collectives`' contract (api.rs) for
    /// the call: every send[j] readable, every recv[j] writable and ours alone, recv[rank] either
    /// send[rank] itself or disjoint from it. Ranges read in place by peers are safe to reuse on
    /// return: the closing sync (`any_direct`) waits for every reader.
    // SAFETY: unsafe to call: `exchange` relies on its callers for this (`# Safety` above): `send` and `recv` hold one range per rank and meet `Collectives`' contract (api.rs) for the call: every send[j] readable, every recv[j] writable and ...
    unsafe fn exchange(&mut self, h: DescHeader, send: &[Buf], recv: &[Buf], mode: Mode) -> Result<()> {
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

    /// out[0..count] = op over ranks j of what j contributes to this rank. Returns the parity and
    /// whether a final sync is due (left to the caller, which may have more to do first).
    ///
    /// # Safety
    /// `send` holds one range per rank, each readable; `out` is writable for `count` elements
    /// of `dtype` and ours alone, overlapping no send range except send[rank] at the same
    /// address; all aligned for `dtype`. They stay so until the call returns and, when it says a
    /// sync is due, until the caller's sync after it (peers read unstaged ranges in place).
    #[allow(clippy::too_many_arguments)]
    // SAFETY: unsafe to call: `reduce_to_me` relies on its callers for this (`# Safety` above): `send` holds one range per rank, each readable; `out` is writable for `count` elements of `dtype` and ours alone, overlapping no send range except ...
    unsafe fn reduce_to_me(&mut self, h: DescHeader, send: &[Buf], out: usize, count: usize, dtype: DType, op: ReduceOp, mode: Mode) -> Result<(usize, bool)> {
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

    /// out[0..bytes] = op over ranks j of what j published to this rank (`parity`'s pieces,
    /// `bytes` long each: the caller checked), block by block in cache: each peer's block is read
    /// from its slot where staged, else into a cache-resident scratch; `each(b, nb)` runs after
    /// the block at byte b (nb bytes) is reduced into `out`, while it is still in this core's cache.
    ///
    /// # Safety
    /// As `reduce_to_me`'s: send[rank] readable for `bytes`; `out` writable for `bytes` bytes and
    /// ours alone, overlapping no send range except send[rank] at the same address; aligned for
    /// `dtype`.
    #[allow(clippy::too_many_arguments)]
    // SAFETY: unsafe to call: `reduce_blocks` relies on its callers for this (`# Safety` above).
    unsafe fn reduce_blocks(&mut self, parity: usize, send: &[Buf], out: usize, bytes: usize, dtype: DType, op: ReduceOp,
                            mut each: impl FnMut(usize, usize) -> Result<()>) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        let esize = dtype.size();
        let block = self.tuning.block_bytes.min(bytes).next_multiple_of(64);
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

    /// Run an op; any error except a mismatch every rank saw breaks the group (peers learn why).
    /// So does a panic (a bug), caught here so that peers are told before the caller goes on.
    fn guarded(&mut self, f: impl FnOnce(&mut Comm) -> Result<()>) -> Result<()> {
        if let Some(e) = &self.broken {
            return Err(Error::Broken(e.to_string()));
        }
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(self))).unwrap_or_else(|p| Err(Error::from_panic(p)));
        if let Err(e) = &r {
            if !matches!(e, Error::Mismatch(_)) {
                self.fail(e);
            }
        }
        r
    }

    fn chunks(&self, count: usize, esize: usize) -> Vec<(usize, usize)> {
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
    // SAFETY: unsafe to call: `broadcast_split` relies on its callers for this (`# Safety` above): `buf` meets `Collectives`' contract (api.rs) until this returns: readable on the root, writable and ours elsewhere. Each side publishes it for the ...
    unsafe fn broadcast_split(&mut self, h: DescHeader, buf: Buf, root: usize) -> Result<()> {
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

/// The one-host group implements the trait itself, with no wrapper between the engine and its
/// collectives. Each method's `# Safety` is `Collectives`' buffer contract (api.rs); the SAFETY
/// lines inside say where each range is read, written or published to peers.
impl Collectives for Comm {
    fn rank(&self) -> usize {
        self.rank
    }

    /// In-place all_reduce of `count` elements at `buf`.
    // SAFETY: unsafe to call: `all_reduce` reads and writes `buf` through this host's shared segment; `Collectives::all_reduce`'s contract (api.rs) keeps them live and unshared until it returns
    unsafe fn all_reduce(&mut self, buf: usize, count: usize, dtype: DType, op: ReduceOp) -> Result<()> {
        let bytes = count * dtype.size();
        let algo = self.tuning.pick_all_reduce(bytes, self.world, self.cpus);
        self.guarded(|c| {
            let h = c.header(Kind::AllReduce, Some(dtype), Some(op), 0, count as u64, algo as u32);
            match algo {
                ShmAlgo::OneShot => {
                    let send = vec![(buf, bytes); c.world];
                    // SAFETY: `Collectives`' contract (api.rs): `buf` holds `count` elements until
                    // this returns. It is every rank's piece and the output, equal to send[rank]
                    // as reduce_to_me allows; the sync due runs below.
                    let (_, sync_due) = unsafe { c.reduce_to_me(h, &send, buf, count, dtype, op, Mode::Stage)? };
                    if sync_due {
                        c.net.sync()?;
                    }
                    Ok(())
                }
                ShmAlgo::Staged => {
                    // Reduce-scatter + all-gather through the staging slots, no system call: copy
                    // the input into my slot; sync; reduce chunk `me` of every rank's slot into
                    // chunk `me` of my slot (peers read only their own chunks of it meanwhile);
                    // sync; copy every rank's reduced chunk out of its slot. Slots alternate by op
                    // parity, so nobody can overwrite a chunk still being read: no closing sync.
                    let es = dtype.size();
                    let me = c.rank;
                    // SAFETY: `Collectives`' contract (api.rs): `buf` is readable for `bytes` until
                    // this returns. Staged always copies it (the planner picks Staged only when
                    // `bytes` fits the slot), so no peer reads `buf` itself.
                    let pieces = unsafe { c.pieces(&vec![(buf, bytes); c.world], Mode::Stage) };
                    let parity = c.publish_and_sync(h, &pieces)?;
                    c.check_lengths(parity, &|_| bytes, h.kind)?;
                    let ch = c.chunks(count, es);
                    let base: Vec<*mut u8> = (0..c.world)
                        // SAFETY: every rank chose Staged for this count (publish_and_sync compared
                        // both), so every rank staged its `bytes` (they fit the slot, whose size
                        // the ranks share) in its slot of this parity at `loc`: inside j's mapping.
                        .map(|j| unsafe { c.net.segs[j].slot(parity).add(c.net.segs[j].piece(parity, me).loc as usize) })
                        .collect();
                    let (s, n) = ch[me];
                    if n > 0 {
                        // SAFETY: chunk `me` is n > 0 elements from s, inside `count`, so s * es
                        // lies inside every rank's staged copy of `bytes`.
                        let srcs: Vec<*const u8> = base.iter().map(|&b| unsafe { b.add(s * es) } as *const u8).collect();
                        // Slots are page-aligned, `loc` and chunk starts multiples of 64 bytes;
                        // peers read only their own chunks of this slot until the sync below.
                        // SAFETY: every pointer is chunk `me` (n elements) of an aligned staged
                        // copy; the destination is our own copy, a source at the same offset (allowed).
                        unsafe { reduce_many(base[me].add(s * es), &srcs, n, dtype, op, c.world) };
                    }
                    c.net.sync()?;
                    for k in 0..c.world {
                        let j = (me + k) % c.world;
                        let (s, n) = ch[j];
                        // SAFETY: `buf + s*es` is writable for chunk j's n elements (`Collectives`'
                        // contract for `buf`, api.rs); rank j's staged copy holds its reduced chunk
                        // j there, kept until every rank passed the next op's first sync. A slot
                        // and a caller's buffer do not overlap.
                        unsafe { copy::copy((buf + s * es) as *mut u8, base[j].add(s * es), n * es) };
                    }
                    Ok(())
                }
                ShmAlgo::Rsag => {
                    // SAFETY: `Collectives`' contract (api.rs): `buf` holds `count` elements of
                    // `dtype`, ours, until this returns; that is rsag's contract.
                    unsafe { c.rsag(h, buf, count, dtype, op) }
                }
            }
        })
    }

    /// out = reduction over ranks of chunk `rank` of their inputs; `send[j]` is the chunk for rank j.
    // SAFETY: unsafe to call: `reduce_scatter` reads and writes `send` and `out` through this host's shared segment; `Collectives::reduce_scatter`'s contract (api.rs) keeps them live and unshared until it returns
    unsafe fn reduce_scatter(&mut self, send: &[Buf], out: usize, count: usize, dtype: DType, op: ReduceOp) -> Result<()> {
        check_list(self.world, send.len(), "reduce_scatter inputs")?;
        self.guarded(|c| {
            let h = c.header(Kind::ReduceScatter, Some(dtype), Some(op), 0, count as u64, 0);
            // SAFETY: `Collectives`' contract (api.rs): every send[j] is readable and `out`
            // writable for `count` elements until this returns, `out` overlapping no input but
            // send[rank] at the same address; `send` has one range per rank (checked). The sync
            // due runs below.
            let (_, sync_due) = unsafe { c.reduce_to_me(h, send, out, count, dtype, op, Mode::Auto)? };
            if sync_due {
                c.net.sync()?;
            }
            Ok(())
        })
    }

    /// In-place reduce of `count` elements at `buf` onto `root`; other ranks' buffers are untouched.
    // SAFETY: unsafe to call: `reduce` reads and writes `buf` through this host's shared segment; `Collectives::reduce`'s contract (api.rs) keeps them live and unshared until it returns
    unsafe fn reduce(&mut self, buf: usize, count: usize, dtype: DType, op: ReduceOp, root: usize) -> Result<()> {
        check_rank(self.world, root, "root")?;
        let bytes = count * dtype.size();
        self.guarded(|c| {
            let h = c.header(Kind::Reduce, Some(dtype), Some(op), root, count as u64, 0);
            let mut send = vec![(0usize, 0usize); c.world];
            send[root] = (buf, bytes);
            let n = if c.rank == root { count } else { 0 };
            // SAFETY: `Collectives`' contract (api.rs): `buf` holds `count` elements until this
            // returns. It is this rank's only piece (to the root) and, on the root alone (n > 0),
            // the output at the same address. The sync due runs below.
            let (_, sync_due) = unsafe { c.reduce_to_me(h, &send, buf, n, dtype, op, Mode::Auto)? };
            if sync_due {
                c.net.sync()?;
            }
            Ok(())
        })
    }

    /// recv[j] = rank j's `send` (bytes each, equal on all ranks).
    // SAFETY: unsafe to call: `all_gather` reads and writes `send` and `recv` through this host's shared segment; `Collectives::all_gather`'s contract (api.rs) keeps them live and unshared until it returns
    unsafe fn all_gather(&mut self, send: Buf, recv: &[Buf]) -> Result<()> {
        check_list(self.world, recv.len(), "all_gather outputs")?;
        self.guarded(|c| {
            let h = c.header(Kind::AllGather, None, None, 0, send.1 as u64, 0);
            let sends = vec![send; c.world];
            // SAFETY: `Collectives`' contract (api.rs): `send` is readable and every recv[j]
            // writable and ours until this returns, recv[rank] being `send` or disjoint from it;
            // `recv` has one range per rank (checked).
            unsafe { c.exchange(h, &sends, recv, Mode::Copy) }
        })
    }

    /// recv[j] = what rank j sends to this rank (its send[rank]); sizes may differ per pair.
    // SAFETY: unsafe to call: `all_to_all` reads and writes `send` and `recv` through this host's shared segment; `Collectives::all_to_all`'s contract (api.rs) keeps them live and unshared until it returns
    unsafe fn all_to_all(&mut self, send: &[Buf], recv: &[Buf]) -> Result<()> {
        check_list(self.world, send.len(), "all_to_all inputs")?;
        check_list(self.world, recv.len(), "all_to_all outputs")?;
        self.guarded(|c| {
            let h = c.header(Kind::AllToAll, None, None, 0, ANY_COUNT, 0);
            // SAFETY: `Collectives`' contract (api.rs): every send[j] is readable and every
            // recv[j] writable and ours until this returns, recv[rank] being send[rank] or
            // disjoint from it; both lists have one range per rank (checked).
            unsafe { c.exchange(h, send, recv, Mode::Copy) }
        })
    }

    /// `buf` on every rank = `buf` on `root`.
    // SAFETY: unsafe to call: `broadcast` reads and writes `buf` through this host's shared segment; `Collectives::broadcast`'s contract (api.rs) keeps them live and unshared until it returns
    unsafe fn broadcast(&mut self, buf: Buf, root: usize) -> Result<()> {
        check_rank(self.world, root, "root")?;
        self.guarded(|c| {
            let stages = c.tuning.broadcast_stages(buf.1, c.world);
            let split = c.world == 2 && !stages;
            let h = c.header(Kind::Broadcast, None, None, root, buf.1 as u64, split as u32);
            if split {
                // SAFETY: `Collectives`' contract (api.rs): `buf` is valid, read on the root and
                // written elsewhere, until this returns; that is broadcast_split's contract.
                return unsafe { c.broadcast_split(h, buf, root) };
            }
            let none = (0usize, 0usize);
            let (send, mut recv) = if c.rank == root {
                (vec![buf; c.world], vec![none; c.world])
            } else {
                (vec![none; c.world], vec![none; c.world])
            };
            recv[root] = buf;
            let mode = if stages { Mode::Stage } else { Mode::Direct };
            // SAFETY: `Collectives`' contract (api.rs): `buf` is valid until this returns. The
            // root only reads it (its recv[root] is send[root], the same address, never
            // copied); elsewhere it is recv[root], written and ours.
            unsafe { c.exchange(h, &send, &recv, mode) }
        })
    }

    /// On `root`, recv[j] = rank j's `send`.
    // SAFETY: unsafe to call: `gather` reads and writes `send` and `recv` through this host's shared segment; `Collectives::gather`'s contract (api.rs) keeps them live and unshared until it returns
    unsafe fn gather(&mut self, send: Buf, recv: &[Buf], root: usize) -> Result<()> {
        check_rank(self.world, root, "root")?;
        self.guarded(|c| {
            let h = c.header(Kind::Gather, None, None, root, send.1 as u64, 0);
            let none = (0usize, 0usize);
            let mut sends = vec![none; c.world];
            sends[root] = send;
            let recvs = if c.rank == root { recv.to_vec() } else { vec![none; c.world] };
            if recvs.len() != c.world {
                return Err(Error::Unsupported(format!("gather needs {} outputs on the root, got {}", c.world, recvs.len())));
            }
            // SAFETY: `Collectives`' contract (api.rs): `send` is readable until this returns
            // and, on the root, every recv[j] writable and ours (recv[root] being `send` or
            // disjoint from it); off the root every range but send[root] is empty.
            unsafe { c.exchange(h, &sends, &recvs, Mode::Copy) }
        })
    }

    /// recv = `root`'s send[rank].
    // SAFETY: unsafe to call: `scatter` reads and writes `send` and `recv` through this host's shared segment; `Collectives::scatter`'s contract (api.rs) keeps them live and unshared until it returns
    unsafe fn scatter(&mut self, send: &[Buf], recv: Buf, root: usize) -> Result<()> {
        check_rank(self.world, root, "root")?;
        self.guarded(|c| {
            let h = c.header(Kind::Scatter, None, None, root, recv.1 as u64, 0);
            let none = (0usize, 0usize);
            let sends = if c.rank == root { send.to_vec() } else { vec![none; c.world] };
            if sends.len() != c.world {
                return Err(Error::Unsupported(format!("scatter needs {} inputs on the root, got {}", c.world, sends.len())));
            }
            let mut recvs = vec![none; c.world];
            recvs[root] = recv;
            // SAFETY: `Collectives`' contract (api.rs): `recv` is writable and ours until this
            // returns and, on the root, every send[j] readable (send[root] being `recv` or
            // disjoint from it); off the root every range but recv[root] is empty.
            unsafe { c.exchange(h, &sends, &recvs, Mode::Copy) }
        })
    }

    fn barrier(&mut self) -> Result<()> {
        self.guarded(|c| {
            let h = c.header(Kind::Barrier, None, None, 0, 0, 0);
            let none = vec![(0usize, 0usize); c.world];
            // SAFETY: no memory: every range is empty, so nothing is read, copied or published.
            unsafe { c.exchange(h, &none, &none, Mode::Auto) }
        })
    }

    // SAFETY: unsafe to call: `send_post` reads and writes `addr..addr+len` through this host's shared segment; `Collectives::send_post`'s contract (api.rs) keeps it live and unwritten until the returned ticket completes
    unsafe fn send_post(&mut self, to: usize, addr: usize, len: usize, tag: u64) -> Result<Ticket> {
        // SAFETY: the trait's contract is `post_to`'s: the bytes stay readable and unwritten
        // until the ticket completes, and the boxed ticket is `post_to`'s own.
        unsafe { self.post_to(to, addr, len, tag) }.map(|t| Box::new(t) as Ticket)
    }

    // SAFETY: unsafe to call: `recv` reads and writes `addr..addr+len` through this host's shared segment; `Collectives::recv`'s contract (api.rs) keeps them live and unshared until it returns
    unsafe fn recv(&mut self, from: usize, addr: usize, len: usize, tag: u64) -> Result<()> {
        // SAFETY: the trait's contract is `recv_from`'s: the bytes are writable and ours for the call.
        unsafe { self.recv_from(from, addr, len, tag) }
    }

    fn abort(&mut self, e: &Error) {
        self.fail(e);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys;
    use std::time::Duration;

    /// Run `f` on `world` connected ranks (threads of this process); results in rank order.
    fn with_ranks<T: Send + 'static>(world: usize, f: impl Fn(&mut Comm) -> T + Send + Sync + 'static) -> Vec<T> {
        with_ranks_timeout(world, Duration::from_secs(20), f)
    }

    fn with_ranks_timeout<T: Send + 'static>(world: usize, timeout: Duration, f: impl Fn(&mut Comm) -> T + Send + Sync + 'static) -> Vec<T> {
        let token = sys::random_token().unwrap();
        let f = std::sync::Arc::new(f);
        let cfg = crate::config::Config::default();
        let comms: Vec<Comm> = (0..world).map(|r| Comm::new(r, world, token, timeout, &cfg).unwrap()).collect();
        let infos: Vec<_> = comms.iter().map(|c| c.info()).collect();
        let hs: Vec<_> = comms
            .into_iter()
            .map(|mut c| {
                let (infos, f) = (infos.clone(), f.clone());
                std::thread::spawn(move || {
                    c.connect(&infos).unwrap();
                    f(&mut c)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    }

    fn input(rank: usize, n: usize) -> Vec<i64> {
        (0..n).map(|i| ((i * 7 + rank * 13) % 101) as i64 - 50).collect()
    }

    /// Every one-host algorithm, forced, gives the exact sum / max / truncated mean on every rank,
    /// for sizes around the chunk and block boundaries, and back-to-back ops of both slot parities
    /// (a slot reused too early would show as a wrong second or third result).
    #[test]
    fn every_one_host_all_reduce_algorithm_is_exact() {
        for algo in [ShmAlgo::OneShot, ShmAlgo::Staged, ShmAlgo::Rsag] {
            for world in [1usize, 2, 3, 5] {
                let out = with_ranks(world, move |c| {
                    c.tuning.shm_all_reduce = Some(algo);
                    let mut res = vec![];
                    for &n in &[0usize, 1, 7, 8, 9, 1000, 8193, 70_001] {
                        for (op, k) in [(ReduceOp::Sum, 0usize), (ReduceOp::Max, 1), (ReduceOp::Avg, 2)] {
                            let mut v: Vec<i64> = input(c.rank, n).iter().map(|x| x + k as i64).collect();
                            // SAFETY: `v` lives, untouched by anyone else, through the call.
                            unsafe { c.all_reduce(v.as_mut_ptr() as usize, n, DType::I64, op).unwrap() };
                            res.push(v);
                        }
                    }
                    res
                });
                let mut i = 0;
                for &n in &[0usize, 1, 7, 8, 9, 1000, 8193, 70_001] {
                    for k in 0..3i64 {
                        let ins: Vec<Vec<i64>> = (0..world).map(|r| input(r, n).iter().map(|x| x + k).collect()).collect();
                        let want: Vec<i64> = (0..n)
                            .map(|e| {
                                let col = ins.iter().map(|v| v[e]);
                                match k {
                                    0 => col.sum(),
                                    1 => col.max().unwrap(),
                                    _ => col.sum::<i64>() / world as i64,
                                }
                            })
                            .collect();
                        for (r, got) in out.iter().enumerate() {
                            assert_eq!(got[i], want, "{algo:?} world {world} n {n} op {k} rank {r}");
                        }
                        i += 1;
                    }
                }
            }
        }
    }

    /// Broadcast between 2 ranks, staged or split (each rank copies half through
    /// process_vm_readv/writev), from either root, at sizes around the staging limit and page
    /// boundaries, back to back: every byte arrives, and the root's buffer is unchanged.
    #[test]
    fn two_rank_broadcast_is_exact_staged_and_split() {
        let sizes = [0usize, 1, 4096, crate::plan::PAIR_STAGE_MAX, crate::plan::PAIR_STAGE_MAX + 1, 100_003, (1 << 20) + 5];
        let fill = |root: usize, n: usize| -> Vec<u8> { (0..n).map(|i| ((i * 31 + root * 7) % 251) as u8).collect() };
        let out = with_ranks(2, move |c| {
            let mut got = vec![];
            for root in 0..2 {
                for &n in &sizes {
                    let mut v = if c.rank == root { fill(root, n) } else { vec![0xEE; n] };
                    // SAFETY: `v` lives, untouched by anyone else, through the call.
                    unsafe { c.broadcast((v.as_mut_ptr() as usize, n), root).unwrap() };
                    got.push(v);
                }
            }
            got
        });
        for (r, got) in out.iter().enumerate() {
            let mut i = 0;
            for root in 0..2 {
                for &n in &sizes {
                    assert!(got[i] == fill(root, n), "rank {r} root {root} n {n}: wrong bytes");
                    i += 1;
                }
            }
        }
    }

    /// Rank 0 reads rank 1 directly in an all_gather, then times out in the closing sync while
    /// rank 1 stalls between its first sync and its reads; rank 0 returns the error and reuses
    /// its buffer. Rank 1 then reads it: rank 0's phase is already past the closing sync, so
    /// nothing else would stop rank 1 from returning what it read as rank 0's contribution.
    #[test]
    fn a_read_of_a_peer_that_gave_up_fails() {
        let both = std::sync::Arc::new(std::sync::Barrier::new(2));
        let out = with_ranks_timeout(2, Duration::from_secs(1), move |c| {
            let n = 1 << 20;
            c.tuning.stage_max = 0;
            let mut mine = vec![c.rank as u8 + 1; n];
            let mut all = vec![0u8; 2 * n];
            let recv = [(all.as_mut_ptr() as usize, n), (all.as_mut_ptr() as usize + n, n)];
            if c.rank == 0 {
                // SAFETY: `mine` and `all` outlive the call and nothing else touches them during
                // it; `recv` cuts `all` into two disjoint halves. (After the call fails, `mine` is
                // overwritten on purpose: rank 1's late read of it must fail.)
                let r = unsafe { c.all_gather((mine.as_ptr() as usize, n), &recv) };
                mine.fill(0xEE);
                both.wait();
                both.wait();
                r
            } else {
                // all_gather's exchange, up to its reads.
                let h = c.header(Kind::AllGather, None, None, 0, n as u64, 0);
                let sends = [(mine.as_ptr() as usize, n); 2];
                // SAFETY: `mine` is readable for `n` bytes until this closure ends (with
                // stage_max 0 it is not copied, only published for rank 0 to read in place).
                let pieces = unsafe { c.pieces(&sends, Mode::Copy) };
                let parity = c.publish_and_sync(h, &pieces).unwrap();
                both.wait();
                // SAFETY: recv[0] is the first `n` bytes of `all`, writable and touched by nothing
                // else; rank 0 published `n` bytes for this rank.
                let r = unsafe { c.fetch(parity, 0, sends[1].0, recv[0].0, n) };
                both.wait();
                r
            }
        });
        assert!(matches!(out[0], Err(Error::Timeout { .. })), "{:?}", out[0]);
        assert!(matches!(&out[1], Err(Error::PeerAborted { rank: 0, .. })), "{:?}", out[1]);
    }

    /// A rank that gave up (marked itself aborted, as a timed-out closing sync does before its
    /// caller gets the buffer back) has nothing written into its memory afterwards: `write_to`,
    /// through which the large all_reduce and broadcast_split fill peers' buffers, refuses.
    #[test]
    fn nothing_is_written_into_a_peer_that_gave_up() {
        let both = std::sync::Arc::new(std::sync::Barrier::new(2));
        let addr = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let out = with_ranks(2, move |c| {
            if c.rank == 1 {
                let v = vec![7u8; 4096];
                addr.store(v.as_ptr() as usize, std::sync::atomic::Ordering::SeqCst);
                c.fail(&Error::Broken("gave up".into()));
                both.wait();
                both.wait();
                Ok(v.iter().all(|&x| x == 7))
            } else {
                both.wait();
                let src = vec![9u8; 4096];
                let r = c.net.write_to(1, addr.load(std::sync::atomic::Ordering::SeqCst) as u64, src.as_ptr(), src.len());
                both.wait();
                r.map(|_| true)
            }
        });
        assert!(matches!(&out[0], Err(Error::PeerAborted { rank: 1, .. })), "{:?}", out[0]);
        assert!(matches!(out[1], Ok(true)), "rank 1's buffer was written: {:?}", out[1]);
    }

    /// A panic inside a collective (a bug) is its error, and breaks the group: peers are told
    /// at once, and later ops fail.
    #[test]
    fn a_panic_in_a_collective_breaks_the_group() {
        let out = with_ranks(2, |c| {
            let t = std::time::Instant::now();
            let r = if c.rank == 0 { c.guarded(|_| panic!("a bug")) } else { c.barrier() };
            (r, c.barrier(), t.elapsed())
        });
        assert!(matches!(&out[0].0, Err(Error::Broken(m)) if m.contains("a bug")), "{:?}", out[0].0);
        assert!(matches!(out[0].1, Err(Error::Broken(_))), "{:?}", out[0].1);
        assert!(matches!(out[1].0, Err(Error::PeerAborted { rank: 0, .. })), "{:?}", out[1].0);
        assert!(out[1].2 < Duration::from_secs(5), "rank 1 waited {:?}", out[1].2);
    }

    /// Ranks tuned differently (one would stage a 2-rank broadcast the other splits) get a
    /// mismatch error on both, never a half-filled buffer.
    #[test]
    fn ranks_choosing_different_broadcasts_get_an_error() {
        let out = with_ranks(2, |c| {
            if c.rank == 1 {
                c.tuning.stage_max = 0;
            }
            let mut v = vec![c.rank as u8; 8 << 10];
            // SAFETY: `v` lives, untouched by anyone else, through the call.
            unsafe { c.broadcast((v.as_mut_ptr() as usize, v.len()), 0) }.map_err(|e| e.to_string())
        });
        for (r, res) in out.iter().enumerate() {
            let e = res.as_ref().expect_err("a split and a staged broadcast must not pass");
            assert!(e.contains("chose algorithm"), "rank {r}: {e}");
        }
    }
}
