//! gather and scatter across hosts through the host leaders: a rank talks to its own leader only,
//! a leader to its host's ranks, its parent and its children in a binomial tree over the leaders
//! rooted at the root's leader: at most ceil(log2 H) leaders, for any number of hosts H (a direct
//! gather makes the root talk to every rank).
//!
//! The layout is data, as in leaders.rs: `hosts[g]` lists host g's ranks, its first the leader.
//! The tree is tree.rs's binomial numbering (leaders::reduce's): with rh the root's host, host h
//! is node v = (h - rh) mod H; node v's subtree is nodes v..min(v + low(v), H), low(v) being v's
//! lowest set bit (for node 0, every node); its children are v + m for m = 1, 2, 4, ... below
//! low(v), child v + m's subtree nodes v+m..min(v+2m, H); its parent is v - low(v). A subtree's
//! data is kept in node order, each host's ranks in local order: the "slots" of the subtree. A
//! child's subtree is one contiguous run of its parent's slots, so every hop moves one run.
//!
//! Only the root knows every piece's length (gather's receive regions, scatter's send regions);
//! a rank knows its own, and a leader forwards other hosts' pieces. So every run travels as two
//! messages: its length table (one u64 little-endian per slot; its size follows from the
//! layout) then its payload (the pieces back to back, as long as the table adds up to). The root
//! checks every length against its regions, and a scatter's receiver its own: a disagreement is
//! a `Mismatch` naming the sending rank and the receiver, never wrong data or a hang. The root's
//! own piece never travels: it is copied locally, its slot empty.
//!
//! gather:
//! 1. every non-leader but the root sends its leader its length, then its piece;
//! 2. a leader receives the tables of its host's ranks and of its children's subtrees (posted
//!    together, into its table), then, the total known, their payloads into its slots, and its
//!    own piece in slot 0; then sends the table and the payload to its parent;
//! 3. the root's leader has every slot: it copies them out if it is the root, else it hands the
//!    root (a rank of its host) the table and the payload, and the root copies them out.
//!
//! scatter, the reverse: the root packs every piece in slot order under its table (its own slot
//! empty) and, if it leads no host, hands both to its leader; a leader receives its subtree's
//! table and payload from its parent (the root's leader from the root), sends each child its
//! run and each of its host's ranks its length and piece, and keeps its own.
//!
//! Every buffer posted to the transport is the caller's or the caller's scratch (the table, then
//! the payload after it), never a local allocation (algo/mod.rs, "Buffers and errors"). The
//! scratch grows only between the table and the payload, when nothing is posted into it.
//! Receives are posted before the sends they wait with; each peer's messages match in order.
use super::direct::Region;
use super::leaders::{copy, decode, encode, locate};
use super::scratch;
use crate::error::{Error, Result};
use crate::transport::{Handle, Transport};

/// This leader's place in the binomial tree over the leaders rooted at the root's host.
struct Tree {
    /// The root's host.
    rh: usize,
    /// This host's node, and the end of its subtree.
    v: usize,
    end: usize,
    /// The parent's node (None at the root's host).
    parent: Option<usize>,
    /// Each child's node and subtree end, in increasing order.
    children: Vec<(usize, usize)>,
}

impl Tree {
    fn new(n: usize, rh: usize, h: usize) -> Tree {
        let v = (h + n - rh) % n;
        let low = if v == 0 { n.next_power_of_two() } else { v & v.wrapping_neg() };
        let mut children = Vec::new();
        let mut m = 1;
        while m < low && v + m < n {
            children.push((v + m, (v + 2 * m).min(n)));
            m <<= 1;
        }
        Tree { rh, v, end: (v + low).min(n), parent: (v != 0).then(|| v - low), children }
    }

    /// Host of node `w`.
    fn host(&self, n: usize, w: usize) -> usize {
        (w + self.rh) % n
    }

    /// The ranks of the slots of nodes a..b, in slot order.
    fn ranks(&self, hosts: &[Vec<usize>], a: usize, b: usize) -> Vec<usize> {
        (a..b).flat_map(|w| hosts[self.host(hosts.len(), w)].iter().copied()).collect()
    }

    /// The first slot of node `w` within this subtree's slots.
    fn slot(&self, hosts: &[Vec<usize>], w: usize) -> usize {
        (self.v..w).map(|x| hosts[self.host(hosts.len(), x)].len()).sum()
    }

    /// Leader of node `w`.
    fn leader(&self, hosts: &[Vec<usize>], w: usize) -> usize {
        hosts[self.host(hosts.len(), w)][0]
    }
}

/// The byte offset of each slot in a payload of these lengths, and the total after the last; a
/// table that does not fit in memory is a Mismatch (`from` names who sent it).
fn offsets(lens: &[u64], from: usize) -> Result<Vec<usize>> {
    let mut off = Vec::with_capacity(lens.len() + 1);
    let mut at = 0usize;
    off.push(0);
    for &l in lens {
        at = usize::try_from(l).ok().and_then(|l| at.checked_add(l)).ok_or_else(|| Error::Mismatch(format!("rank {from} announces {} pieces too long to hold together", lens.len())))?;
        off.push(at);
    }
    Ok(off)
}

/// Receive a run's table of `slots` lengths from `from` into the scratch and read it.
fn recv_table<T: Transport + ?Sized>(t: &mut T, from: usize, tag: u64, slots: usize, scratch_buf: &mut Vec<u8>) -> Result<Vec<u64>> {
    let s = scratch(scratch_buf, 8 * slots).as_mut_ptr();
    // SAFETY: 8·slots bytes of the scratch, ours until waited on the next line (or the caller's
    // shutdown after an error).
    let r = unsafe { t.post_recv(from, s, 8 * slots, tag)? };
    t.wait(r)?;
    Ok(decode(&scratch_buf[..8 * slots]))
}

/// The scratch sized for a table of lens.len() slots and then the payload (off's total), the
/// table written: (table, payload).
fn table(lens: &[u64], off: &[usize], scratch_buf: &mut Vec<u8>) -> (*mut u8, *mut u8) {
    let hb = 8 * lens.len();
    let buf = scratch(scratch_buf, hb + off[lens.len()]);
    buf[..hb].copy_from_slice(&encode(lens));
    let (table, payload) = buf.split_at_mut(hb);
    (table.as_mut_ptr(), payload.as_mut_ptr())
}

/// The root's length check: slot i holds rank ranks[i]'s piece, lens[i] bytes, which must be
/// recv[ranks[i]]'s length (the root's own slot is empty and skipped).
fn check_gathered(root: usize, ranks: &[usize], lens: &[u64], recv: &[Region]) -> Result<()> {
    for (&r, &l) in ranks.iter().zip(lens) {
        if r != root && l != recv[r].len as u64 {
            return Err(Error::Mismatch(format!("gather: rank {r} sends {l} bytes to root {root}, which expects {}", recv[r].len)));
        }
    }
    Ok(())
}

/// The root copies every piece out of the payload `p` (slot order, lengths checked), its own
/// from `send`.
///
/// # Safety
/// `gather`'s contract for `send` and `recv`; `p` holds the payload of `off`, complete and
/// outside every region.
unsafe fn deliver(root: usize, ranks: &[usize], off: &[usize], p: *const u8, send: Region, recv: &[Region]) {
    for (i, &r) in ranks.iter().enumerate() {
        if r != root {
            // SAFETY: slot i (its length checked equal to recv[r]'s) lies in the payload;
            // recv[r] is writable, ours and outside the scratch (this fn's contract).
            unsafe { copy(p.add(off[i]), recv[r].ptr, recv[r].len) };
        } else if send.ptr != recv[r].ptr {
            // SAFETY: both hold send.len bytes (checked by the caller) and, being different
            // regions, do not overlap (gather's contract).
            unsafe { copy(send.ptr, recv[r].ptr, send.len) };
        }
    }
}

/// On the root, recv[j] = rank j's `send` (every rank passes its piece; the root's recv lists a
/// region per rank, recv[root] may be `send` itself; other ranks pass no regions).
///
/// # Safety
/// Until this returns (after an error: until the caller shuts the transport, algo/mod.rs) `send`
/// is readable and, on the root, every recv region writable and ours; receives are disjoint from
/// each other and from `send`, unless recv[root] is `send`.
pub unsafe fn gather<T: Transport + ?Sized>(t: &mut T, hosts: &[Vec<usize>], tag: u64, send: Region, recv: &[Region], root: usize, scratch_buf: &mut Vec<u8>) -> Result<()> {
    let me = t.rank();
    let (h, l) = locate(hosts, me)?;
    let (rh, _) = locate(hosts, root)?;
    let n = hosts.len();
    let world: usize = hosts.iter().map(Vec::len).sum();
    if me == root && (recv.len() != world || send.len != recv[me].len) {
        return Err(Error::Mismatch(format!("gather: root {me} sends {} bytes and receives {:?} from a world of {world}", send.len, recv.get(me).map(|r| r.len))));
    }
    let ours = &hosts[h];
    let tree = Tree::new(n, rh, h);
    if l != 0 {
        let lead = ours[0];
        if me == root {
            // 3. Everything from the leader, into the scratch, then every length checked (taken
            // first, so that the leader ends whatever we find).
            let ranks = tree.ranks(hosts, 0, n);
            let lens = recv_table(t, lead, tag, ranks.len(), scratch_buf)?;
            let off = offsets(&lens, lead)?;
            let (_, p) = table(&lens, &off, scratch_buf);
            // SAFETY: the payload part of the scratch, off[end] bytes, ours until waited on the
            // next line (or the caller's shutdown after an error).
            let r = unsafe { t.post_recv(lead, p, off[ranks.len()], tag)? };
            t.wait(r)?;
            check_gathered(root, &ranks, &lens, recv)?;
            // SAFETY: this fn's contract, passed on; the payload is complete.
            unsafe { deliver(root, &ranks, &off, p, send, recv) };
            return Ok(());
        }
        // 1. Our length, then our piece.
        let buf = scratch(scratch_buf, 8);
        buf.copy_from_slice(&(send.len as u64).to_le_bytes());
        let s = buf.as_mut_ptr();
        // SAFETY: the 8 bytes just written, only read until waited below.
        let a = unsafe { t.post_send(lead, s, 8, tag)? };
        // SAFETY: `send` is readable for its length until this returns (this fn's contract).
        let b = unsafe { t.post_send(lead, send.ptr, send.len, tag)? };
        t.wait(a)?;
        return t.wait(b);
    }
    // 2. The subtree's table: our host's ranks' lengths and our children's tables.
    let ranks = tree.ranks(hosts, tree.v, tree.end);
    let s = scratch(scratch_buf, 8 * ranks.len()).as_mut_ptr();
    let kids: Vec<(usize, usize, usize)> = tree.children.iter().map(|&(c, e)| (tree.leader(hosts, c), tree.slot(hosts, c), tree.slot(hosts, e))).collect();
    let mut hs: Vec<Handle> = Vec::new();
    for (i, &r) in ours.iter().enumerate().skip(1) {
        if r != root {
            // SAFETY: slot i's 8 bytes of the table, disjoint from every other posted run, ours
            // until waited below.
            hs.push(unsafe { t.post_recv(r, s.add(8 * i), 8, tag)? });
        }
    }
    for &(lead, a, b) in &kids {
        // SAFETY: slots a..b of the table (b <= ranks.len()), disjoint from the others posted.
        hs.push(unsafe { t.post_recv(lead, s.add(8 * a), 8 * (b - a), tag)? });
    }
    t.wait_all(&hs)?;
    // Every slot was received (waited above) but ours and the root's (the root sends nothing).
    let mut lens = decode(&scratch_buf[..8 * ranks.len()]);
    for (i, len) in lens.iter_mut().enumerate() {
        if i == 0 || ranks[i] == root {
            *len = 0; // slots nothing was received into: ours (set below) and the root's
        }
    }
    if me != root {
        lens[0] = send.len as u64;
    }
    let off = offsets(&lens, me)?;
    let total = off[ranks.len()];
    let (s, p) = table(&lens, &off, scratch_buf);
    hs.clear();
    for (i, &r) in ours.iter().enumerate().skip(1) {
        if r != root {
            // SAFETY: slot i of the payload (off[i]..off[i+1] inside the scratch), disjoint from
            // every other posted slot, ours until waited below.
            hs.push(unsafe { t.post_recv(r, p.add(off[i]), lens[i] as usize, tag)? });
        }
    }
    for &(lead, a, b) in &kids {
        // SAFETY: slots a..b of the payload, a contiguous run inside the scratch, disjoint from
        // the others posted.
        hs.push(unsafe { t.post_recv(lead, p.add(off[a]), off[b] - off[a], tag)? });
    }
    if me != root {
        // SAFETY: slot 0 holds send.len bytes of the scratch, which `send` lies outside of;
        // `send` is readable (this fn's contract).
        unsafe { copy(send.ptr, p, send.len) };
    }
    t.wait_all(&hs)?;
    // 3. Up the tree, or out to the root.
    let to = match tree.parent {
        Some(w) => tree.leader(hosts, w),
        None if me == root => {
            check_gathered(root, &ranks, &lens, recv)?;
            // SAFETY: this fn's contract, passed on; the payload is complete.
            unsafe { deliver(root, &ranks, &off, p, send, recv) };
            return Ok(());
        }
        None => root,
    };
    // SAFETY: the table, complete, only read until waited below.
    let a = unsafe { t.post_send(to, s, 8 * ranks.len(), tag)? };
    // SAFETY: the payload, complete, only read until waited below.
    let b = unsafe { t.post_send(to, p, total, tag)? };
    t.wait(a)?;
    t.wait(b)
}

/// `recv` = the root's send[rank] (the root lists a region per rank, send[root] may be `recv`
/// itself; other ranks pass no regions).
///
/// # Safety
/// Until this returns (after an error: until the caller shuts the transport, algo/mod.rs) `recv`
/// is writable and ours and, on the root, every send region readable; `recv` is disjoint from
/// every send region unless it is send[root].
pub unsafe fn scatter<T: Transport + ?Sized>(t: &mut T, hosts: &[Vec<usize>], tag: u64, send: &[Region], recv: Region, root: usize, scratch_buf: &mut Vec<u8>) -> Result<()> {
    let me = t.rank();
    let (h, l) = locate(hosts, me)?;
    let (rh, _) = locate(hosts, root)?;
    let n = hosts.len();
    let world: usize = hosts.iter().map(Vec::len).sum();
    let ours = &hosts[h];
    let tree = Tree::new(n, rh, h);
    let (lens, off, s, p) = if me == root {
        if send.len() != world || send[me].len != recv.len {
            return Err(Error::Mismatch(format!("scatter: root {me} sends itself {:?} bytes but receives {} in a world of {world}", send.get(me).map(|r| r.len), recv.len)));
        }
        // Every piece in slot order under the table; our own copied, its slot empty.
        let all = tree.ranks(hosts, 0, n);
        let lens: Vec<u64> = all.iter().map(|&r| if r == root { 0 } else { send[r].len as u64 }).collect();
        let off = offsets(&lens, me)?;
        let (s, p) = table(&lens, &off, scratch_buf);
        for (i, &r) in all.iter().enumerate() {
            if r != root {
                // SAFETY: slot i of the payload holds send[r].len bytes of the scratch, which
                // send[r] (readable: this fn's contract) lies outside of.
                unsafe { copy(send[r].ptr, p.add(off[i]), send[r].len) };
            }
        }
        if send[me].ptr != recv.ptr {
            // SAFETY: both hold recv.len bytes (checked above) and, being different regions, do
            // not overlap (this fn's contract).
            unsafe { copy(send[me].ptr, recv.ptr, recv.len) };
        }
        if l != 0 {
            let lead = ours[0];
            // SAFETY: the table, complete, only read until waited below.
            let a = unsafe { t.post_send(lead, s, 8 * lens.len(), tag)? };
            // SAFETY: the payload, complete, only read until waited below.
            let b = unsafe { t.post_send(lead, p, off[lens.len()], tag)? };
            t.wait(a)?;
            return t.wait(b);
        }
        (lens, off, s, p)
    } else if l != 0 {
        // Our length, then our piece straight into `recv`; a piece of another length is taken
        // into the scratch (so that the leader ends) and refused.
        let lead = ours[0];
        let len = recv_table(t, lead, tag, 1, scratch_buf)?[0];
        if len == recv.len as u64 {
            // SAFETY: `recv` is writable and ours until waited on the next line (this fn's
            // contract).
            let r = unsafe { t.post_recv(lead, recv.ptr, recv.len, tag)? };
            return t.wait(r);
        }
        let bad = usize::try_from(len).map_err(|_| Error::Mismatch(format!("scatter: root {root} sends {len} bytes to rank {me}")))?;
        let s = scratch(scratch_buf, bad).as_mut_ptr();
        // SAFETY: `bad` bytes of the scratch, ours until waited on the next line.
        let r = unsafe { t.post_recv(lead, s, bad, tag)? };
        t.wait(r)?;
        return Err(Error::Mismatch(format!("scatter: root {root} sends {len} bytes to rank {me}, which expects {}", recv.len)));
    } else {
        // Our subtree's run from the parent (from the root at the root's host).
        let from = tree.parent.map_or(root, |w| tree.leader(hosts, w));
        let lens = recv_table(t, from, tag, tree.slot(hosts, tree.end), scratch_buf)?;
        let off = offsets(&lens, from)?;
        let (s, p) = table(&lens, &off, scratch_buf);
        // SAFETY: the payload part of the scratch, ours until waited on the next line.
        let r = unsafe { t.post_recv(from, p, off[lens.len()], tag)? };
        t.wait(r)?;
        (lens, off, s, p)
    };
    // Each child its run, each of our host's ranks its length and piece.
    let mut hs: Vec<Handle> = Vec::new();
    for &(c, e) in &tree.children {
        let (lead, a, b) = (tree.leader(hosts, c), tree.slot(hosts, c), tree.slot(hosts, e));
        // SAFETY: slots a..b of the table, complete, only read until waited below.
        hs.push(unsafe { t.post_send(lead, s.add(8 * a), 8 * (b - a), tag)? });
        // SAFETY: the same slots of the payload, a contiguous run, only read until waited.
        hs.push(unsafe { t.post_send(lead, p.add(off[a]), off[b] - off[a], tag)? });
    }
    for (i, &r) in ours.iter().enumerate().skip(1) {
        if r != root {
            // SAFETY: slot i of the table, only read until waited below.
            hs.push(unsafe { t.post_send(r, s.add(8 * i), 8, tag)? });
            // SAFETY: slot i of the payload, only read until waited below.
            hs.push(unsafe { t.post_send(r, p.add(off[i]), lens[i] as usize, tag)? });
        }
    }
    // Our own piece (the root has copied its own already): the others served first, so that our
    // mismatch leaves them their data.
    let mine = if me == root {
        Ok(())
    } else if lens[0] != recv.len as u64 {
        Err(Error::Mismatch(format!("scatter: root {root} sends {} bytes to rank {me}, which expects {}", lens[0], recv.len)))
    } else {
        // SAFETY: slot 0 of the payload holds recv.len bytes (checked); `recv` is writable and
        // ours, outside the scratch (this fn's contract).
        unsafe { copy(p, recv.ptr, recv.len) };
        Ok(())
    };
    t.wait_all(&hs)?;
    mine
}
