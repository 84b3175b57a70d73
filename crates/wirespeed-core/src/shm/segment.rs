//! The layout of a rank's shared segment. Every rank owns one (a memfd) and maps every peer's, so
//! all flags a rank writes live in its own segment and peers only read them: no word has two
//! writers, and a rank's control words fit in separate cache lines.
//!
//! ```text
//! 0     header (`SegHeader`): magic, job token, rank, world, pid, CPUs, address of this mapping
//!       in its owner
//! 64    abort word + the owner's error message (peers raise it as PeerAborted)
//! 320   phase counter (futex word): bumped once per sync point
//! 384   sleepers: how many peers sleep on a word of this segment (wake only when > 0)
//! 448   2 op descriptors (by op parity): header + one piece per destination rank
//! ...   p2p: sends posted to each rank, receives completed from each rank, a ring of send
//!       descriptors per destination
//! 4K    2 staging slots (by op parity) for small messages
//! ```
use crate::sys::Mapping;
use std::sync::atomic::{AtomicU32, AtomicU64};
use std::sync::Arc;

pub const MAGIC: u64 = 0x5753_5045_4544_0001; // "WSPEED" v1
pub const P2P_RING: usize = 16;
const DESC_OFF: usize = 448;
const PIECE_BYTES: usize = 32;
pub const REASON_MAX: usize = 240;

/// Piece modes: where the bytes a rank contributes to a peer can be read.
pub const MODE_NONE: u32 = 0;
pub const MODE_SLOT: u32 = 1; // at an offset in the owner's staging slot of this op's parity
pub const MODE_ADDR: u32 = 2; // at an address in the owner's memory (read with process_vm_readv)

/// The first 64 bytes of every segment, written once by the owner before it publishes `magic`.
#[repr(C)]
pub struct SegHeader {
    pub magic: AtomicU64,
    pub token: [u8; 16],
    pub rank: u32,
    pub world: u32,
    pub pid: i32,
    /// CPUs the owner may run on: the planner uses the least over a host's ranks, so every rank
    /// chooses the same algorithm.
    pub cpus: u32,
    /// Where the segment is mapped in its owner (for the cross-memory-attach probe).
    pub owner: u64,
    reserved: [u64; 2],
}

// The structs below are read and written in peers' memory: their layout is fixed (repr(C)) and
// must fit the space the layout gives them.
const _: () = assert!(std::mem::size_of::<SegHeader>() == 64);
const _: () = assert!(std::mem::size_of::<DescHeader>() <= 64);
const _: () = assert!(std::mem::size_of::<Piece>() <= PIECE_BYTES);
const _: () = assert!(std::mem::size_of::<SendEntry>() <= 32);

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct DescHeader {
    pub seq: u64,
    /// `api::Kind::code`: kept a plain word, since a peer's may be anything.
    pub kind: u32,
    pub dtype: u32,
    pub op: u32,
    pub root: u32,
    pub count: u64,
    pub algo: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Piece {
    pub mode: u32,
    pub loc: u64,
    pub len: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct SendEntry {
    pub addr: u64,
    pub len: u64,
    pub tag: u64,
}

#[derive(Clone, Copy)]
pub struct SegmentLayout {
    pub slot_bytes: usize,
    desc_bytes: usize,
    posted_off: usize,
    acked_off: usize,
    ring_off: usize,
    slots_off: usize,
    pub total: usize,
}

fn round_up(x: usize, a: usize) -> usize {
    x.div_ceil(a) * a
}

impl SegmentLayout {
    pub fn new(world: usize, slot_bytes: usize) -> SegmentLayout {
        let desc_bytes = round_up(64 + PIECE_BYTES * world, 64);
        let posted_off = DESC_OFF + 2 * desc_bytes;
        let acked_off = posted_off + 64 * world;
        let ring_off = acked_off + 64 * world;
        let slots_off = round_up(ring_off + world * P2P_RING * 32, 4096);
        let total = slots_off + 2 * slot_bytes;
        SegmentLayout { slot_bytes, desc_bytes, posted_off, acked_off, ring_off, slots_off, total }
    }
}

/// A view of one rank's segment (own or a peer's), with typed accessors.
#[derive(Clone)]
pub struct Seg {
    pub map: Arc<Mapping>,
    pub lay: SegmentLayout,
}

impl Seg {
    fn at<T>(&self, off: usize) -> *mut T {
        debug_assert!(off + std::mem::size_of::<T>() <= self.map.len());
        // SAFETY: callers pass offsets of the SegmentLayout, all below `SegmentLayout::total`, which
        // the mapping covers (this rank's by construction, a peer's checked at connect); debug
        // builds assert it above.
        unsafe { self.map.ptr().add(off) as *mut T }
    }
    fn atomic32(&self, off: usize) -> &AtomicU32 {
        // SAFETY: the words given (abort 64, phase 320, sleepers 384, posted/acked at multiples
        // of 64) are 4-aligned, inside the mapping, and only ever accessed as atomics, by every
        // process that maps the segment; the mapping lives as long as `self`.
        unsafe { &*(self.at::<AtomicU32>(off)) }
    }

    fn header(&self) -> &SegHeader {
        // SAFETY: offset 0 of a page-aligned mapping of at least 64 bytes; after `magic` is
        // published (Release) the other fields are never written again, and readers check
        // `magic` (Acquire) first.
        unsafe { &*(self.map.ptr() as *const SegHeader) }
    }

    /// Written once by the owner, before the segment is shared.
    pub fn write_header(&self, token: &[u8; 16], rank: usize, world: usize, pid: i32, cpus: usize) {
        let h = self.map.ptr() as *mut SegHeader;
        // SAFETY: as in `header`; no peer has mapped the segment yet, so nothing reads these
        // fields while they are written.
        unsafe {
            std::ptr::addr_of_mut!((*h).token).write(*token);
            std::ptr::addr_of_mut!((*h).rank).write(rank as u32);
            std::ptr::addr_of_mut!((*h).world).write(world as u32);
            std::ptr::addr_of_mut!((*h).pid).write(pid);
            std::ptr::addr_of_mut!((*h).cpus).write(cpus.min(u32::MAX as usize) as u32);
            std::ptr::addr_of_mut!((*h).owner).write(self.map.ptr() as u64);
        }
        self.header().magic.store(MAGIC, std::sync::atomic::Ordering::Release);
    }
    pub fn magic(&self) -> u64 {
        self.header().magic.load(std::sync::atomic::Ordering::Acquire)
    }
    pub fn token(&self) -> [u8; 16] {
        self.header().token
    }
    pub fn rank(&self) -> usize {
        self.header().rank as usize
    }
    pub fn world(&self) -> usize {
        self.header().world as usize
    }
    pub fn cpus(&self) -> usize {
        self.header().cpus as usize
    }
    /// Where this segment is mapped in its owner's address space (for a cross-memory-attach probe).
    pub fn owner_addr(&self) -> u64 {
        self.header().owner
    }

    pub fn aborted(&self) -> &AtomicU32 {
        self.atomic32(64)
    }
    pub fn set_reason(&self, msg: &str) {
        let b = msg.as_bytes();
        let n = b.len().min(REASON_MAX);
        // SAFETY: offsets 68..72+REASON_MAX lie in the first page, past the 64-byte header and
        // before `phase` (320). Only the owner writes them, once (`give_up`), before it sets
        // `aborted` (Release); peers read them only after seeing `aborted` set (Acquire).
        unsafe {
            std::ptr::copy_nonoverlapping(b.as_ptr(), self.at::<u8>(72), n);
            *self.at::<u32>(68) = n as u32;
        }
    }
    pub fn reason(&self) -> String {
        // SAFETY: offset 68 is the reason's length word, inside the first page. Every caller
        // first saw `aborted` set (Acquire), which the owner does after writing the reason, so
        // these reads do not race its writes.
        let n = unsafe { *self.at::<u32>(68) as usize }.min(REASON_MAX);
        let mut v = vec![0u8; n];
        // SAFETY: n <= REASON_MAX bytes from offset 72 lie in the same area, written before
        // `aborted` as above; `v` holds n bytes.
        unsafe { std::ptr::copy_nonoverlapping(self.at::<u8>(72), v.as_mut_ptr(), n) };
        String::from_utf8_lossy(&v).into_owned()
    }
    pub fn phase(&self) -> &AtomicU32 {
        self.atomic32(320)
    }
    pub fn sleepers(&self) -> &AtomicU32 {
        self.atomic32(384)
    }

    fn desc_off(&self, parity: usize) -> usize {
        DESC_OFF + parity * self.lay.desc_bytes
    }
    pub fn write_desc(&self, parity: usize, h: &DescHeader, pieces: &[Piece]) {
        let off = self.desc_off(parity);
        // SAFETY: descriptor `parity` (a 64-byte header, then one 32-byte piece per rank;
        // callers pass at most `world` pieces) lies inside the layout, 8-aligned. Only the owner
        // writes it, and peers read it only between this op's first sync and their start of the
        // next op of this parity, which waits for this rank at the op in between.
        unsafe {
            std::ptr::write_volatile(self.at::<DescHeader>(off), *h);
            for (j, p) in pieces.iter().enumerate() {
                std::ptr::write_volatile(self.at::<Piece>(off + 64 + j * PIECE_BYTES), *p);
            }
        }
    }
    pub fn desc(&self, parity: usize) -> DescHeader {
        // SAFETY: descriptor `parity`'s header, inside the layout and 8-aligned; read after the
        // sync that follows its owner's write (publish_and_sync), before the owner can rewrite it.
        unsafe { std::ptr::read_volatile(self.at::<DescHeader>(self.desc_off(parity))) }
    }
    pub fn piece(&self, parity: usize, to: usize) -> Piece {
        // SAFETY: piece `to` (< world) of descriptor `parity`, inside the layout and 8-aligned;
        // read, like `desc`, between its owner's write and the next op of this parity.
        unsafe { std::ptr::read_volatile(self.at::<Piece>(self.desc_off(parity) + 64 + to * PIECE_BYTES)) }
    }

    /// Sends this rank has posted to rank `to` (bumped by the sender).
    pub fn posted(&self, to: usize) -> &AtomicU32 {
        self.atomic32(self.lay.posted_off + 64 * to)
    }
    /// Receives this rank has completed from rank `from` (bumped by the receiver).
    pub fn acked(&self, from: usize) -> &AtomicU32 {
        self.atomic32(self.lay.acked_off + 64 * from)
    }
    pub fn write_send(&self, to: usize, n: u32, e: SendEntry) {
        let off = self.lay.ring_off + (to * P2P_RING + n as usize % P2P_RING) * 32;
        // SAFETY: ring entry (to, n mod P2P_RING), 32 bytes inside the ring area (world x P2P_RING
        // entries at `ring_off`), 8-aligned. Only the sender writes it, and only after its
        // receiver acknowledged the entry it replaces (`post_to` waits on `acked` first).
        unsafe { std::ptr::write_volatile(self.at::<SendEntry>(off), e) };
    }
    pub fn send_entry(&self, to: usize, n: u32) -> SendEntry {
        let off = self.lay.ring_off + (to * P2P_RING + n as usize % P2P_RING) * 32;
        // SAFETY: the same ring entry, in the sender's segment, read by the receiver only once
        // `posted` says it is written (Acquire) and before the receiver acknowledges it, so the
        // sender cannot be rewriting it.
        unsafe { std::ptr::read_volatile(self.at::<SendEntry>(off)) }
    }

    pub fn slot(&self, parity: usize) -> *mut u8 {
        self.at::<u8>(self.lay.slots_off + parity * self.lay.slot_bytes)
    }
}
