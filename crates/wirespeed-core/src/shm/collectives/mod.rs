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
use super::segment::DescHeader;
use crate::kernels::copy;
use crate::kernels::reduce::reduce_many;

mod broadcast;
mod reduce;
mod rsag;
mod stage;
#[cfg(test)]
mod tests;

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
}


/// The one-host group implements the trait itself, with no wrapper between the engine and its
/// collectives. Each method's `# Safety` is `Collectives`' buffer contract (api.rs); the SAFETY
/// lines inside say where each range is read, written or published to peers.
impl Collectives for Comm {
    fn rank(&self) -> usize {
        self.rank
    }

    /// In-place all_reduce of `count` elements at `buf`.
    // SAFETY: sound on Collectives' contract alone: `buf` is read and written by this rank and,
    // through the segment and process_vm calls, by peers in this same op only; `guarded` aborts on
    // an error.
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
    // SAFETY: sound on Collectives' contract alone: peers read the inputs only during this op's
    // phases, which end (or abort) before it returns.
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
    // SAFETY: sound on Collectives' contract alone: peers read `buf` only during this op's phases,
    // which end (or abort) before it returns.
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
    // SAFETY: sound on Collectives' contract alone: peers read `send` only during this op, and
    // `recv` is written by this rank's copies alone.
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
    // SAFETY: sound on Collectives' contract alone: peers read the sends only during this op, and
    // the receives are written by this rank's copies alone.
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
    // SAFETY: sound on Collectives' contract alone: the root's `buf` is read, and the others'
    // written, only within this op's phases.
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
    // SAFETY: sound on Collectives' contract alone: `send` is read by the root only during this op;
    // the root's `recv` is written by its own copies.
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
    // SAFETY: sound on Collectives' contract alone: the root's `send` is read only during this op;
    // `recv` is written by this rank's copies.
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

    // SAFETY: sound on Collectives' contract alone: the bytes stay the caller's until the returned
    // ticket completes, which is what post_to asks.
    unsafe fn send_post(&mut self, to: usize, addr: usize, len: usize, tag: u64) -> Result<Ticket> {
        // SAFETY: the trait's contract is `post_to`'s: the bytes stay readable and unwritten
        // until the ticket completes, and the boxed ticket is `post_to`'s own.
        unsafe { self.post_to(to, addr, len, tag) }.map(|t| Box::new(t) as Ticket)
    }

    // SAFETY: sound on Collectives' contract alone: `addr` is written by recv_from within this
    // call.
    unsafe fn recv(&mut self, from: usize, addr: usize, len: usize, tag: u64) -> Result<()> {
        // SAFETY: the trait's contract is `recv_from`'s: the bytes are writable and ours for the call.
        unsafe { self.recv_from(from, addr, len, tag) }
    }

    fn abort(&mut self, e: &Error) {
        self.fail(e);
    }
}
