//! The vocabulary of what a group offers, the same for every kind of group: a byte range
//! (`Buf`), a send still in flight (`Pending`, boxed as `Ticket`) and the collectives of a
//! connected group (`Collectives`). It names no implementation, so a group can use it without
//! importing `group` or the engine: the one-host shared-memory `Comm` (shm/; its impl is in
//! group.rs) and the multi-host `HostsComm` (hosts/) implement it, the engine runs ops through it.
use crate::dtype::{DType, ReduceOp};
use crate::error::{Error, Result};

/// A byte range in this process: (address, length).
pub type Buf = (usize, usize);

/// A send that may still be in flight, over shared memory (`shm::p2p::SendTicket`) or TCP
/// (`hosts::mesh::SendTicket`).
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
/// (`Comm` in group.rs and shm/, `HostsComm` in hosts/) rely on it, and the engine's `Op`s carry
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
    // SAFETY: unsafe to call: `all_reduce` relies on its callers for this (`# Safety` above): The buffer contract above, for `buf` (read and written).
    unsafe fn all_reduce(&mut self, buf: usize, count: usize, dtype: DType, op: ReduceOp) -> Result<()>;
    /// `out` (`count` elements) = the reduction over ranks of their `send[rank]`; `send` has one
    /// chunk of `count` elements per rank.
    /// # Safety
    /// The buffer contract above, for every `send[j]` (read) and `out` (written; it may be
    /// `send[rank]` itself).
    // SAFETY: unsafe to call: `reduce_scatter` relies on its callers for this (`# Safety` above): The buffer contract above, for every `send[j]` (read) and `out` (written; it may be `send[rank]` itself).
    unsafe fn reduce_scatter(&mut self, send: &[Buf], out: usize, count: usize, dtype: DType, op: ReduceOp) -> Result<()>;
    /// `buf` on `root` = the reduction over ranks of their `buf`; other ranks' `buf` is input only.
    /// # Safety
    /// The buffer contract above, for `buf` (read everywhere, written on `root`).
    // SAFETY: unsafe to call: `reduce` relies on its callers for this (`# Safety` above): The buffer contract above, for `buf` (read everywhere, written on `root`).
    unsafe fn reduce(&mut self, buf: usize, count: usize, dtype: DType, op: ReduceOp, root: usize) -> Result<()>;
    /// `recv[j]` = rank j's `send`.
    /// # Safety
    /// The buffer contract above, for `send` (read) and every `recv[j]` (written; `recv[rank]`
    /// may be `send` itself).
    // SAFETY: unsafe to call: `all_gather` relies on its callers for this (`# Safety` above): The buffer contract above, for `send` (read) and every `recv[j]` (written; `recv[rank]` may be `send` itself).
    unsafe fn all_gather(&mut self, send: Buf, recv: &[Buf]) -> Result<()>;
    /// `recv[j]` = rank j's `send[rank]`.
    /// # Safety
    /// The buffer contract above, for every `send[j]` (read) and `recv[j]` (written; `recv[rank]`
    /// may be `send[rank]` itself).
    // SAFETY: unsafe to call: `all_to_all` relies on its callers for this (`# Safety` above): The buffer contract above, for every `send[j]` (read) and `recv[j]` (written; `recv[rank]` may be `send[rank]` itself).
    unsafe fn all_to_all(&mut self, send: &[Buf], recv: &[Buf]) -> Result<()>;
    /// `buf` on every rank = `buf` on `root`.
    /// # Safety
    /// The buffer contract above, for `buf` (read on `root`, written elsewhere).
    // SAFETY: unsafe to call: `broadcast` relies on its callers for this (`# Safety` above): The buffer contract above, for `buf` (read on `root`, written elsewhere).
    unsafe fn broadcast(&mut self, buf: Buf, root: usize) -> Result<()>;
    /// On `root`, `recv[j]` = rank j's `send`; `recv` is ignored elsewhere.
    /// # Safety
    /// The buffer contract above, for `send` (read) and, on `root`, every `recv[j]` (written;
    /// `recv[root]` may be `send` itself).
    // SAFETY: unsafe to call: `gather` relies on its callers for this (`# Safety` above): The buffer contract above, for `send` (read) and, on `root`, every `recv[j]` (written; `recv[root]` may be `send` itself).
    unsafe fn gather(&mut self, send: Buf, recv: &[Buf], root: usize) -> Result<()>;
    /// `recv` = `root`'s `send[rank]`; `send` is ignored off `root`.
    /// # Safety
    /// The buffer contract above, for `recv` (written) and, on `root`, every `send[j]` (read;
    /// `send[root]` may be `recv` itself).
    // SAFETY: unsafe to call: `scatter` relies on its callers for this (`# Safety` above): The buffer contract above, for `recv` (written) and, on `root`, every `send[j]` (read; `send[root]` may be `recv` itself).
    unsafe fn scatter(&mut self, send: &[Buf], recv: Buf, root: usize) -> Result<()>;
    fn barrier(&mut self) -> Result<()>;
    /// Post a send of `len` bytes at `addr` to rank `to`; the ticket completes when the bytes
    /// are taken.
    /// # Safety
    /// The buffer contract above, for `addr..addr+len` (read) until the ticket completes.
    // SAFETY: unsafe to call: `send_post` relies on its callers for this (`# Safety` above): The buffer contract above, for `addr..addr+len` (read) until the ticket completes.
    unsafe fn send_post(&mut self, to: usize, addr: usize, len: usize, tag: u64) -> Result<Ticket>;
    /// Receive exactly `len` bytes from rank `from` into `addr`.
    /// # Safety
    /// The buffer contract above, for `addr..addr+len` (written).
    // SAFETY: unsafe to call: `recv` relies on its callers for this (`# Safety` above): The buffer contract above, for `addr..addr+len` (written).
    unsafe fn recv(&mut self, from: usize, addr: usize, len: usize, tag: u64) -> Result<()>;
    /// Break the group for `e`, found outside its ops (a send's wait failed, or an op panicked):
    /// later ops fail, peers are told, and nothing in flight keeps using a caller's buffer.
    fn abort(&mut self, e: &Error);
}
