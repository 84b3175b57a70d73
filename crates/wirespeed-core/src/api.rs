//! The vocabulary of what a group offers, the same for every kind of group: a byte range
//! (`Buf`), what a collective is (`Kind`), a send still in flight (`Pending`, boxed as `Ticket`)
//! and the collectives of a connected group (`Collectives`). It names no implementation, so a
//! group can use it without importing `group` or the engine: the one-host shared-memory `Comm`
//! (shm/collectives.rs) and the multi-host `hosts::Group` (hosts/) implement it, the engine runs
//! ops through it.
use crate::dtype::{DType, ReduceOp};
use crate::error::{Error, Result};

/// A byte range in this process: (address, length).
pub type Buf = (usize, usize);

/// Declares `Kind` from one table, so a new collective is one line here: its name in errors and
/// its code, which the wire and the shared segments carry.
macro_rules! kinds {
    ($($kind:ident = $code:literal, $name:literal;)*) => {
        /// A collective, named the same way on every layer: the engine's `Op` (`Op::kind`), the
        /// one-host descriptor (`DescHeader::kind`, the code) and the multi-host message tag
        /// (bits 56-62, the code). The codes are part of the shm layout and the TCP wire format
        /// between ranks of one build, and must not change.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[repr(u32)]
        pub enum Kind {
            $($kind = $code,)*
        }

        impl Kind {
            pub const ALL: &'static [Kind] = &[$(Kind::$kind,)*];

            /// The name errors use ("all_reduce: rank 1 sends ...").
            pub fn name(self) -> &'static str {
                match self {
                    $(Kind::$kind => $name,)*
                }
            }
        }
    };
}

kinds! {
    AllReduce = 1, "all_reduce";
    Reduce = 2, "reduce";
    ReduceScatter = 3, "reduce_scatter";
    AllGather = 4, "all_gather";
    AllToAll = 5, "all_to_all";
    Broadcast = 6, "broadcast";
    Barrier = 7, "barrier";
    Gather = 8, "gather";
    Scatter = 9, "scatter";
}

impl Kind {
    /// The number the shm descriptor and the TCP tag carry.
    pub fn code(self) -> u32 {
        self as u32
    }

    /// The kind a peer's descriptor names; None for a code no build ever wrote.
    pub fn from_code(code: u32) -> Option<Kind> {
        Kind::ALL.iter().copied().find(|k| k.code() == code)
    }

    /// A name for a code read from a peer, which may be garbage.
    pub fn name_of(code: u32) -> &'static str {
        Kind::from_code(code).map_or("?", Kind::name)
    }
}

/// A rank argument (root, peer) outside the group: one check for the one-host and multi-host groups.
pub(crate) fn check_rank(world: usize, r: usize, what: &str) -> Result<()> {
    if r >= world {
        return Err(Error::Unsupported(format!("{what} {r} is not a rank of this group of {world}")));
    }
    Ok(())
}

/// A list of per-rank buffers of the wrong length.
pub(crate) fn check_list(world: usize, n: usize, what: &str) -> Result<()> {
    if n != world {
        return Err(Error::Unsupported(format!("{what}: expected {world} buffers (one per rank), got {n}")));
    }
    Ok(())
}

/// A send that may still be in flight, over shared memory (`shm::p2p::ShmSend`) or TCP
/// (`hosts::mesh::TcpSend`).
pub trait Pending: Send + Sync {
    /// Wait until the send is complete (shared memory: the receiver took the bytes; TCP: every
    /// byte is written to the sockets); its outcome.
    fn wait(&self) -> Result<()>;
    /// Whether the send is complete now, without waiting.
    fn is_acked(&self) -> bool;
}

/// What `Collectives::send_post` returns: a send over either kind of connection.
pub type Ticket = Box<dyn Pending>;

/// The collectives of a connected group.
///
/// # Safety
///
/// The buffer contract: every `unsafe` method below is unsafe for it, the implementations
/// (`Comm` in shm/, `hosts::Group` in hosts/) rely on it, and the engine's `Op`s carry
/// it (engine.rs). The caller passes memory as addresses (a `Buf`, or `buf`/`out` holding
/// `count` elements of `dtype`) and promises, for each range:
/// - it is this process's memory, valid for reads (an input) or writes (an output) of its whole
///   length from the call until it returns; a `send_post` input until its ticket completes,
///   since the receiver reads it in place (on one host, from its own process);
/// - nothing else writes it meanwhile, and nothing else reads an output;
/// - the elements of a reduction are aligned for `dtype` (the kernels read them as typed values);
/// - an output overlaps no other range, except in the in-place forms a method names.
///
/// If a call (or a ticket) fails, a peer that is only late may still reach the ranges for a
/// while (a reader of a send that timed out, a broadcast root writing into a rank that gave
/// up); the engine therefore keeps a failed op's memory for good (engine.rs, "Ownership").
/// The Python bindings meet the contract with the tensors they checked and hand to the engine.
pub trait Collectives: Send {
    fn rank(&self) -> usize;
    /// `buf`: `count` elements of `dtype` on every rank, replaced in place by their reduction.
    /// # Safety
    /// The buffer contract above, for `buf` (read and written).
    unsafe fn all_reduce(&mut self, buf: usize, count: usize, dtype: DType, op: ReduceOp) -> Result<()>;
    /// `out` (`count` elements) = the reduction over ranks of their `send[rank]`; `send` has one
    /// chunk of `count` elements per rank.
    /// # Safety
    /// The buffer contract above, for every `send[j]` (read) and `out` (written; it may be
    /// `send[rank]` itself).
    unsafe fn reduce_scatter(&mut self, send: &[Buf], out: usize, count: usize, dtype: DType, op: ReduceOp) -> Result<()>;
    /// `buf` on `root` = the reduction over ranks of their `buf`; other ranks' `buf` is input only.
    /// # Safety
    /// The buffer contract above, for `buf` (read everywhere, written on `root`).
    unsafe fn reduce(&mut self, buf: usize, count: usize, dtype: DType, op: ReduceOp, root: usize) -> Result<()>;
    /// `recv[j]` = rank j's `send`.
    /// # Safety
    /// The buffer contract above, for `send` (read) and every `recv[j]` (written; `recv[rank]`
    /// may be `send` itself).
    unsafe fn all_gather(&mut self, send: Buf, recv: &[Buf]) -> Result<()>;
    /// `recv[j]` = rank j's `send[rank]`.
    /// # Safety
    /// The buffer contract above, for every `send[j]` (read) and `recv[j]` (written; `recv[rank]`
    /// may be `send[rank]` itself).
    unsafe fn all_to_all(&mut self, send: &[Buf], recv: &[Buf]) -> Result<()>;
    /// `buf` on every rank = `buf` on `root`.
    /// # Safety
    /// The buffer contract above, for `buf` (read on `root`, written elsewhere).
    unsafe fn broadcast(&mut self, buf: Buf, root: usize) -> Result<()>;
    /// On `root`, `recv[j]` = rank j's `send`; `recv` is ignored elsewhere.
    /// # Safety
    /// The buffer contract above, for `send` (read) and, on `root`, every `recv[j]` (written;
    /// `recv[root]` may be `send` itself).
    unsafe fn gather(&mut self, send: Buf, recv: &[Buf], root: usize) -> Result<()>;
    /// `recv` = `root`'s `send[rank]`; `send` is ignored off `root`.
    /// # Safety
    /// The buffer contract above, for `recv` (written) and, on `root`, every `send[j]` (read;
    /// `send[root]` may be `recv` itself).
    unsafe fn scatter(&mut self, send: &[Buf], recv: Buf, root: usize) -> Result<()>;
    fn barrier(&mut self) -> Result<()>;
    /// Post a send of `len` bytes at `addr` to rank `to`; the ticket completes when the bytes
    /// are taken.
    /// # Safety
    /// The buffer contract above, for `addr..addr+len` (read) until the ticket completes.
    unsafe fn send_post(&mut self, to: usize, addr: usize, len: usize, tag: u64) -> Result<Ticket>;
    /// Receive exactly `len` bytes from rank `from` into `addr`.
    /// # Safety
    /// The buffer contract above, for `addr..addr+len` (written).
    unsafe fn recv(&mut self, from: usize, addr: usize, len: usize, tag: u64) -> Result<()>;
    /// Break the group for `e`, found outside its ops (a send's wait failed, or an op panicked):
    /// later ops fail, peers are told, and nothing in flight keeps using a caller's buffer.
    fn abort(&mut self, e: &Error);
    /// TCP streams this rank holds to ranks on other hosts now (connections are made on first
    /// use, so this grows with the peers the collectives used); 0 on one host.
    fn tcp_streams(&self) -> usize {
        0
    }
}

/// What one rank publishes for its peers to connect (its setup's `info`): every group's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankInfo {
    pub pid: i32,
    pub fd: i32,
    pub host: String,
    /// TCP listening address ("ip:port") when the group spans hosts, else empty.
    pub addr: String,
}

#[cfg(test)]
mod tests {
    use super::Kind;

    /// The codes are in the shm layout and on the wire: a renumbering would make ranks of two
    /// builds misread each other, so they are pinned here, with the names errors print.
    #[test]
    fn kind_codes_and_names_are_pinned() {
        let want = [
            (1, "all_reduce"),
            (2, "reduce"),
            (3, "reduce_scatter"),
            (4, "all_gather"),
            (5, "all_to_all"),
            (6, "broadcast"),
            (7, "barrier"),
            (8, "gather"),
            (9, "scatter"),
        ];
        let got: Vec<(u32, &str)> = Kind::ALL.iter().map(|k| (k.code(), k.name())).collect();
        assert_eq!(got, want);
        for &k in Kind::ALL {
            assert_eq!(Kind::from_code(k.code()), Some(k));
        }
        assert_eq!(Kind::from_code(0), None);
        assert_eq!(Kind::name_of(77), "?");
    }
}
