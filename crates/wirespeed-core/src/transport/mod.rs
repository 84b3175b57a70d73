//! Moving bytes to a peer without blocking: the one interface every algorithm (algo/) is written
//! against, and its implementations.
//!
//! - `tcp`: the event-driven multi-stream TCP engine (also under the NCCL plugin);
//! - `sim`: an in-memory simulated network of N ranks in one process, deterministic, with link
//!   latency and bandwidth, per-flow caps and faults, for testing algorithms at 1..64 ranks;
//! - `hosts::mesh::Mesh`: a rank's TCP connections to the ranks on other hosts, over `tcp`;
//! - shared memory between ranks of one host: `hosts::hosts::Group` implements the trait over its
//!   shm `Comm` (shm/p2p.rs) and its `Mesh`, choosing per peer.
//!
//! Beside them, `iface`: which address a rank or the NCCL plugin listens on.
//!
//! Semantics, the same for every implementation. Messages from one rank to another are matched
//! in posting order: the n-th send from A to B fills the n-th receive B posted from A. A receive
//! states the exact length and tag it expects; anything else is `Error::Mismatch`. Posting never
//! blocks. A send may complete only when its receiver has the data (shared memory and the
//! simulator are rendezvous: the receiver reads the sender's buffer), so an algorithm must post
//! its receives before it waits on its sends, or order its waits so that every wait's peer can
//! progress. Every posted handle is waited (or the transport shut down) before its buffer goes.
use crate::error::Result;

pub mod iface;
pub mod sim;
pub mod tcp;

/// A posted send or receive, to pass to `wait` or `test` once.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Handle(pub usize);

pub trait Transport {
    fn rank(&self) -> usize;
    fn world(&self) -> usize;

    /// Post a send of `len` bytes at `data` to rank `to`.
    ///
    /// # Safety
    /// `data..data+len` stays valid and unmodified until the handle is waited (or the transport
    /// is shut down).
    unsafe fn post_send(&mut self, to: usize, data: *const u8, len: usize, tag: u64) -> Result<Handle>;

    /// Post the receive of the next message from rank `from`: exactly `len` bytes with `tag`.
    ///
    /// # Safety
    /// `data..data+len` stays valid, and is touched by nobody else, until the handle is waited
    /// (or the transport is shut down).
    unsafe fn post_recv(&mut self, from: usize, data: *mut u8, len: usize, tag: u64) -> Result<Handle>;

    /// Block until the handle's operation completes; its error, typed.
    fn wait(&mut self, h: Handle) -> Result<()>;

    /// Wait for several handles in order; the first error.
    fn wait_all(&mut self, hs: &[Handle]) -> Result<()> {
        hs.iter().try_for_each(|&h| self.wait(h))
    }
}
