//! All-to-all across hosts through the host leaders (hierarchical all-to-all, as NCCL's PXN and
//! MPI's hierarchical alltoall do): a non-leader talks to its own leader only, a leader to its
//! host's ranks and to 2·ceil(log2 H) other leaders, for any number of hosts H. For small pieces,
//! where the full mesh's cost is its connections and its W-1 messages per rank, not bytes.
//!
//! `hosts` lists each host's ranks in a fixed order every rank agrees on (the first is the
//! host's leader); together they are every rank of the transport. A rank knows only its own
//! send and receive lengths, so every bundle of pieces travels with its own length table: a
//! header message (the pieces' lengths, u64 little-endian, in an order both sides compute) then
//! one payload message (the pieces back to back).
//!
//! 1. Up: every non-leader sends its leader one bundle: its piece for every other rank, in rank
//!    order (the piece to itself stays: it is copied locally). Pieces between ranks of one host
//!    go through the leader as well: the leader is then a non-leader's only peer, and every
//!    piece a rank receives comes with the length its sender gave, checked in one place (step 4).
//! 2. Blocks: the leader of host h cuts what it holds into one block per destination host g
//!    (every (source in h, destination in g) piece, source-major) and puts block (h, g) in slot
//!    (g - h) mod H. Slot 0 is the host's own block.
//! 3. Bruck's exchange among leaders: in round k (2^k < H) leader p sends leader p + 2^k the
//!    slots whose index has bit k set, and receives the same slots from leader p - 2^k in their
//!    place. A block keeps its slot (its distance from source host to destination host) and
//!    travels that distance bit by bit, low bit first; after round k the block in slot i at
//!    leader p comes from host p - (i mod 2^(k+1)), so the receiver knows every block's shape
//!    (rows: its source host's ranks, columns: its destination host's) and hence the header's
//!    length; the lengths inside it are the sender's. At the end slot i holds block (p - i, p).
//! 4. Down: the leader sends each of its ranks one bundle: the piece from every other rank, in
//!    rank order. The receiver checks every length against its own receive region (a mismatch
//!    names both ranks) before it takes the payload, then copies the pieces out.
//!
//! A leader sends each round's bundle before it receives (both posted before any wait on a
//! send), which rendezvous transports need. Every piece is copied at each hop (into its block,
//! into each round's bundle, out at the end): the path for small pieces; large all_to_all stays
//! a direct exchange (algo/direct.rs), its data being pairwise anyway.
use super::direct::Region;
use super::leaders::{decode, encode};
use crate::error::{Error, Result};
use crate::transport::{Handle, Transport};

/// Pieces from the ranks of one host to the ranks of another: `lens` source-major (row = source
/// position in its host, column = destination position), `data` the pieces in that order.
#[derive(Default)]
struct Block {
    lens: Vec<u64>,
    data: Vec<u8>,
}

impl Block {
    /// Byte offset of each piece, and the total after the last.
    fn offsets(&self) -> Vec<usize> {
        let mut off = Vec::with_capacity(self.lens.len() + 1);
        let mut at = 0usize;
        for &l in &self.lens {
            off.push(at);
            at += l as usize;
        }
        off.push(at);
        off
    }
}

/// Host and position in its host of every rank; an error unless `hosts` lists every rank of the
/// transport exactly once.
fn layout(hosts: &[Vec<usize>], world: usize) -> Result<(Vec<usize>, Vec<usize>)> {
    let (mut host_of, mut local_of) = (vec![usize::MAX; world], vec![0; world]);
    for (h, rs) in hosts.iter().enumerate() {
        for (l, &r) in rs.iter().enumerate() {
            if r >= world || host_of[r] != usize::MAX {
                return Err(Error::Unsupported(format!("host layout {hosts:?} does not list ranks 0..{world} once each")));
            }
            host_of[r] = h;
            local_of[r] = l;
        }
    }
    if host_of.contains(&usize::MAX) || hosts.iter().any(|rs| rs.is_empty()) {
        return Err(Error::Unsupported(format!("host layout {hosts:?} does not list ranks 0..{world} once each")));
    }
    Ok((host_of, local_of))
}

/// A bundle on its way out: its two messages, kept alive until both sends are waited.
struct Out {
    hdr: Vec<u8>,
    data: Vec<u8>,
}

impl Out {
    fn new(lens: &[u64], data: Vec<u8>) -> Out {
        Out { hdr: encode(lens), data }
    }

    /// Post the header and the payload to `to`.
    ///
    /// # Safety
    /// `self` is neither dropped nor changed until both handles are waited (or the transport is
    /// shut down after an error: algo/mod.rs, "Buffers and errors").
    unsafe fn post<T: Transport + ?Sized>(&self, t: &mut T, to: usize, tag: u64, hs: &mut Vec<Handle>) -> Result<()> {
        // SAFETY: this fn's contract: both vectors stay as they are until the handles are waited.
        hs.push(unsafe { t.post_send(to, self.hdr.as_ptr(), self.hdr.len(), tag)? });
        // SAFETY: as for the header.
        hs.push(unsafe { t.post_send(to, self.data.as_ptr(), self.data.len(), tag)? });
        Ok(())
    }
}

/// Receive a bundle of `n` pieces from `from`: the header, then the payload its lengths add up to.
fn recv_bundle<T: Transport + ?Sized>(t: &mut T, from: usize, tag: u64, n: usize) -> Result<Block> {
    let mut hdr = vec![0u8; n * 8];
    // SAFETY: `hdr` is ours and untouched until this receive is waited on the next line (or the
    // caller shuts the transport after an error).
    let h = unsafe { t.post_recv(from, hdr.as_mut_ptr(), hdr.len(), tag)? };
    t.wait(h)?;
    let lens = decode(&hdr);
    let total = lens.iter().try_fold(0usize, |a, &l| a.checked_add(usize::try_from(l).ok()?));
    let total = total.ok_or_else(|| Error::Mismatch(format!("rank {from} announces pieces of {lens:?} bytes")))?;
    let mut data = vec![0u8; total];
    // SAFETY: as for the header: `data` is ours until this receive is waited on the next line.
    let h = unsafe { t.post_recv(from, data.as_mut_ptr(), total, tag)? };
    t.wait(h)?;
    Ok(Block { lens, data })
}

/// The bytes of a region.
///
/// # Safety
/// `r` is readable for its length for the returned slice's life.
unsafe fn bytes<'a>(r: Region) -> &'a [u8] {
    if r.len == 0 {
        return &[];
    }
    // SAFETY: this fn's contract; a non-empty region has a non-null pointer.
    unsafe { std::slice::from_raw_parts(r.ptr as *const u8, r.len) }
}

/// recv[j] = what rank j sends this rank (send[j] goes to rank j), through the host leaders of
/// `hosts` (the module's opening). Lengths may differ per pair; each rank gives only its own.
///
/// # Safety
/// Until this returns (after an error: until the caller shuts the transport, algo/mod.rs) every
/// region is valid for its length, sends readable, receives writable and ours; a receive overlaps
/// no other region, except send[rank] == recv[rank] (in place).
pub unsafe fn all_to_all<T: Transport + ?Sized>(t: &mut T, hosts: &[Vec<usize>], tag: u64, send: &[Region], recv: &[Region]) -> Result<()> {
    let world = t.world();
    let me = t.rank();
    if send.len() != world || recv.len() != world {
        return Err(Error::Unsupported(format!("all_to_all over {world} ranks takes {world} send and receive regions, not {} and {}", send.len(), recv.len())));
    }
    let (host_of, local_of) = layout(hosts, world)?;
    let nh = hosts.len();
    let h = host_of[me];
    let here = &hosts[h];
    let leader = here[0];
    // This rank's own piece first: a length that differs from its receive region is its own
    // mismatch, found before anything is sent.
    if send[me].len != recv[me].len {
        return Err(Error::Mismatch(format!("rank {me} sends {} bytes to itself but receives {}", send[me].len, recv[me].len)));
    }
    // Step 1's bundle: every other rank's piece, in rank order.
    let up_lens: Vec<u64> = (0..world).filter(|&j| j != me).map(|j| send[j].len as u64).collect();
    let mut up = Vec::with_capacity(send.iter().map(|r| r.len).sum::<usize>() - send[me].len);
    for (j, &r) in send.iter().enumerate() {
        if j != me {
            // SAFETY: send[j] is readable for its length during this call (this fn's contract).
            up.extend_from_slice(unsafe { bytes(r) });
        }
    }
    let mut sends: Vec<Handle> = Vec::new();
    let down = if me != leader {
        let out = Out::new(&up_lens, up);
        // SAFETY: `out` lives, unchanged, until `sends` are waited below.
        unsafe { out.post(t, leader, tag, &mut sends)? };
        let got = recv_bundle(t, leader, tag, world - 1)?;
        t.wait_all(&sends)?;
        got
    } else {
        let mut from_local: Vec<Block> = Vec::with_capacity(here.len());
        from_local.push(Block { lens: up_lens, data: up });
        for &q in &here[1..] {
            from_local.push(recv_bundle(t, q, tag, world - 1)?);
        }
        let mut slots = blocks(hosts, h, &from_local);
        drop(from_local);
        bruck(t, hosts, tag, h, &mut slots)?;
        // Step 4: each local rank's bundle, from the final slots.
        let offs: Vec<Vec<usize>> = slots.iter().map(Block::offsets).collect();
        let mut outs: Vec<Out> = Vec::with_capacity(here.len());
        let mut mine = None;
        for (b, &dst) in here.iter().enumerate() {
            let mut lens = Vec::with_capacity(world - 1);
            let mut data = Vec::new();
            for j in (0..world).filter(|&j| j != dst) {
                let s = host_of[j];
                let i = (h + nh - s) % nh;
                let e = local_of[j] * here.len() + b;
                lens.push(slots[i].lens[e]);
                data.extend_from_slice(&slots[i].data[offs[i][e]..offs[i][e + 1]]);
            }
            if dst == me {
                mine = Some(Block { lens, data });
            } else {
                outs.push(Out::new(&lens, data));
            }
        }
        for (o, &dst) in outs.iter().zip(here.iter().filter(|&&r| r != me)) {
            // SAFETY: `outs` lives, unchanged, until `sends` are waited below.
            unsafe { o.post(t, dst, tag, &mut sends)? };
        }
        let m = mine.expect("the leader is among its host's ranks");
        // Check and copy out the leader's own pieces while its ranks take theirs.
        // SAFETY: this fn's contract, passed on.
        unsafe { deliver(me, &m, send, recv)? };
        t.wait_all(&sends)?;
        return Ok(());
    };
    // SAFETY: this fn's contract, passed on.
    unsafe { deliver(me, &down, send, recv) }
}

/// Step 4 on the receiving rank: check every piece's length against recv, then copy them out
/// (and this rank's own piece from send to recv).
///
/// # Safety
/// all_to_all's contract for `send` and `recv`.
unsafe fn deliver(me: usize, got: &Block, send: &[Region], recv: &[Region]) -> Result<()> {
    let froms = || (0..recv.len()).filter(|&j| j != me);
    for (j, &l) in froms().zip(got.lens.iter()) {
        if l as usize != recv[j].len {
            return Err(Error::Mismatch(format!("all_to_all: rank {j} sends {l} bytes to rank {me}, which expects {}", recv[j].len)));
        }
    }
    let mut at = 0;
    for j in froms() {
        let n = recv[j].len;
        if n > 0 {
            // SAFETY: recv[j] is writable for n bytes and ours (this fn's contract); the payload's
            // piece from j is n bytes at `at` (its length was just checked), in our own Vec.
            unsafe { std::ptr::copy_nonoverlapping(got.data.as_ptr().add(at), recv[j].ptr, n) };
        }
        at += n;
    }
    let (s, r) = (send[me], recv[me]);
    if s.ptr != r.ptr && s.len > 0 {
        // SAFETY: send[me] and recv[me] hold s.len bytes (checked equal by the caller); not the
        // same region, so by the contract they do not overlap at all.
        unsafe { std::ptr::copy_nonoverlapping(s.ptr as *const u8, r.ptr, s.len) };
    }
    Ok(())
}

/// Step 2: host h's leader cuts its ranks' bundles (from_local[a]: rank hosts[h][a]'s pieces for
/// every other rank, in rank order) into one block per destination host, block (h, g) in slot
/// (g - h) mod H.
fn blocks(hosts: &[Vec<usize>], h: usize, from_local: &[Block]) -> Vec<Block> {
    let nh = hosts.len();
    let offs: Vec<Vec<usize>> = from_local.iter().map(Block::offsets).collect();
    (0..nh)
        .map(|i| {
            let g = (h + i) % nh;
            let mut blk = Block::default();
            for (a, &src) in hosts[h].iter().enumerate() {
                for &dst in &hosts[g] {
                    if dst == src {
                        blk.lens.push(0); // a rank's piece to itself never leaves it
                        continue;
                    }
                    // The source's bundle skips its own index.
                    let e = if dst < src { dst } else { dst - 1 };
                    blk.lens.push(from_local[a].lens[e]);
                    blk.data.extend_from_slice(&from_local[a].data[offs[a][e]..offs[a][e + 1]]);
                }
            }
            blk
        })
        .collect()
}

/// Step 3: Bruck's rounds among the leaders (leader of host p = hosts[p][0]).
fn bruck<T: Transport + ?Sized>(t: &mut T, hosts: &[Vec<usize>], tag: u64, p: usize, slots: &mut [Block]) -> Result<()> {
    let nh = hosts.len();
    let mut d = 1;
    while d < nh {
        let to = hosts[(p + d) % nh][0];
        let from = hosts[(p + nh - d) % nh][0];
        let moving: Vec<usize> = (1..nh).filter(|i| i & d != 0).collect();
        let mut lens = Vec::new();
        let mut data = Vec::new();
        for &i in &moving {
            lens.extend_from_slice(&slots[i].lens);
            data.extend_from_slice(&slots[i].data);
        }
        let out = Out::new(&lens, data);
        let mut sends = Vec::new();
        // SAFETY: `out` lives, unchanged, until `sends` are waited below.
        unsafe { out.post(t, to, tag, &mut sends)? };
        // The shape of each block coming in: after this round slot i holds the block from host
        // p - (i mod 2d) to that host + i.
        let shape = |i: usize| {
            let s = (p + nh - i % (2 * d)) % nh;
            hosts[s].len() * hosts[(s + i) % nh].len()
        };
        let got = recv_bundle(t, from, tag, moving.iter().map(|&i| shape(i)).sum())?;
        let offs = got.offsets();
        let mut e = 0;
        for &i in &moving {
            let n = shape(i);
            slots[i] = Block { lens: got.lens[e..e + n].to_vec(), data: got.data[offs[e]..offs[e + n]].to_vec() };
            e += n;
        }
        t.wait_all(&sends)?;
        d <<= 1;
    }
    Ok(())
}
