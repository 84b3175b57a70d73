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
/// # Safety (every method that takes buffers)
/// Each (address, length) names memory of this process that stays valid for the whole call
/// (and, for `send_post`, until the returned ticket completes); outputs do not overlap inputs
/// except where a method says in place; nothing else writes them meanwhile. The bindings
/// guarantee it by keeping the tensors alive until the work completes.
pub trait Collectives: Send {
    fn rank(&self) -> usize;
    // SAFETY: the Collectives trait's contract (above) is this method's.
    unsafe fn all_reduce(&mut self, buf: usize, count: usize, dtype: DType, op: ReduceOp) -> Result<()>;
    // SAFETY: the Collectives trait's contract (above) is this method's.
    unsafe fn reduce_scatter(&mut self, send: &[Buf], out: usize, count: usize, dtype: DType, op: ReduceOp) -> Result<()>;
    // SAFETY: the Collectives trait's contract (api.rs) is this method's.
    unsafe fn reduce(&mut self, buf: usize, count: usize, dtype: DType, op: ReduceOp, root: usize) -> Result<()>;
    unsafe fn all_gather(&mut self, send: Buf, recv: &[Buf]) -> Result<()>;
    unsafe fn all_to_all(&mut self, send: &[Buf], recv: &[Buf]) -> Result<()>;
    // SAFETY: the Collectives trait's contract (api.rs) is this method's.
    unsafe fn broadcast(&mut self, buf: Buf, root: usize) -> Result<()>;
    unsafe fn gather(&mut self, send: Buf, recv: &[Buf], root: usize) -> Result<()>;
    unsafe fn scatter(&mut self, send: &[Buf], recv: Buf, root: usize) -> Result<()>;
    fn barrier(&mut self) -> Result<()>;
    // SAFETY: the Collectives trait's contract (api.rs) is this method's.
    unsafe fn send_post(&mut self, to: usize, addr: usize, len: usize, tag: u64) -> Result<Ticket>;
    unsafe fn recv(&mut self, from: usize, addr: usize, len: usize, tag: u64) -> Result<()>;
    /// Break the group for `e`, found outside its ops (a send's wait failed, or an op panicked):
    /// later ops fail, peers are told, and nothing in flight keeps using a caller's buffer.
    fn abort(&mut self, e: &Error);
}
