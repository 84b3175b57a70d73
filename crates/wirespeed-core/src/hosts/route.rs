//! The route: the one `Transport` of a multi-host group, which its algorithms (algo/, hier.rs,
//! probe.rs) run over: shared memory to the ranks of this host (its local `Comm`), the mesh's own
//! `Transport` to the others. It holds no collective, so an algorithm never calls back into the
//! group; `local_index` is the one place a peer is routed.
use super::layout::HostLayout;
use super::mesh::Mesh;
use crate::api::check_rank;
use crate::error::{Error, Result};
use crate::shm::comm::Comm;
use crate::transport::{Handle, Transport};

pub struct Route {
    pub(super) rank: usize,
    pub(super) world: usize,
    pub(super) lay: HostLayout,
    pub(super) local: Comm,
    pub(super) mesh: Mesh,
    /// Operations posted through the Transport interface and not yet waited.
    pend: Vec<Pend>,
}

/// A posted operation of the Transport interface. Shared-memory receives read the sender's
/// buffer, so they run when waited (after any earlier receive from the same peer).
enum Pend {
    ShmSend(crate::shm::p2p::ShmSend),
    ShmRecv { from: usize, ptr: *mut u8, len: usize, tag: u64 },
    /// A handle of the mesh's own `Transport`.
    Tcp(Handle),
    Done,
}

// SAFETY: a Pend moves between threads only inside its Route, inside its group, which one thread uses at a
// time (&mut, under the engine's execution lock). ShmRecv's pointer is a buffer posted under
// post_recv's contract and written only by the thread that waits it, never concurrently.
unsafe impl Send for Pend {}

impl Route {
    pub(super) fn new(rank: usize, world: usize, lay: HostLayout, local: Comm, mesh: Mesh) -> Route {
        Route { rank, world, lay, local, mesh, pend: Vec::new() }
    }

    /// Forget the operations posted and not waited (an op starts and ends with none).
    pub(super) fn forget_pending(&mut self) {
        self.pend.clear();
    }

    pub(super) fn my_host(&self) -> usize {
        self.lay.host_of[self.rank]
    }

    pub(super) fn is_leader(&self) -> bool {
        self.lay.local_of[self.rank] == 0
    }

    /// Rank `r`'s index in this host's shared-memory group, or None if TCP reaches it: the
    /// one place a peer is routed.
    pub(super) fn local_index(&self, r: usize) -> Option<usize> {
        (self.lay.host_of[r] == self.my_host()).then(|| self.lay.local_of[r])
    }
}

/// Each method's contract is `Transport`'s (transport/mod.rs). The group's ops wait every handle
/// or, on an error, break the group (`guarded`), which shuts the TCP connections and marks the
/// local group aborted: that is what "the transport is shut down" means here.
impl Transport for Route {
    fn rank(&self) -> usize {
        self.rank
    }
    fn world(&self) -> usize {
        self.world
    }
    // SAFETY: sound on Transport's contract alone: the shm ticket or the mesh handle it keeps
    // completes before the caller may reuse the bytes.
    unsafe fn post_send(&mut self, to: usize, data: *const u8, len: usize, tag: u64) -> Result<Handle> {
        check_rank(self.world, to, "send to")?;
        let p = match self.local_index(to) {
            // SAFETY: post_send's contract: `data..data+len` stays readable and unwritten until
            // the handle is waited (the ticket completed) or the group breaks, after which a late
            // receiver's read fails: what Comm::post_to asks.
            Some(l) => Pend::ShmSend(unsafe { self.local.post_to(l, data as usize, len, tag)? }),
            // SAFETY: post_send's contract is the mesh's own: the group breaking shuts it down.
            None => Pend::Tcp(unsafe { self.mesh.post_send(to, data, len, tag)? }),
        };
        self.pend.push(p);
        Ok(Handle(self.pend.len() - 1))
    }
    // SAFETY: sound on Transport's contract alone: a local receive runs when its handle is waited,
    // a remote one is the mesh's, shut down when the group breaks.
    unsafe fn post_recv(&mut self, from: usize, data: *mut u8, len: usize, tag: u64) -> Result<Handle> {
        check_rank(self.world, from, "receive from")?;
        let p = match self.local_index(from) {
            Some(l) => Pend::ShmRecv { from: l, ptr: data, len, tag },
            // SAFETY: post_recv's contract is the mesh's own: the group breaking shuts it down.
            None => Pend::Tcp(unsafe { self.mesh.post_recv(from, data, len, tag)? }),
        };
        self.pend.push(p);
        Ok(Handle(self.pend.len() - 1))
    }
    fn wait(&mut self, h: Handle) -> Result<()> {
        if h.0 >= self.pend.len() {
            return Err(Error::Unsupported(format!("no operation {} is pending", h.0)));
        }
        if let Pend::ShmRecv { from, .. } = self.pend[h.0] {
            // Messages from one peer match in posting order: run earlier receives from it first.
            for i in 0..h.0 {
                if matches!(self.pend[i], Pend::ShmRecv { from: f, .. } if f == from) {
                    self.wait(Handle(i))?;
                }
            }
        }
        match std::mem::replace(&mut self.pend[h.0], Pend::Done) {
            Pend::ShmSend(t) => t.wait(),
            // SAFETY: post_recv's contract: `ptr..ptr+len` was posted writable and ours until its
            // handle is waited, which is now; Comm::recv_from needs it for this call only.
            Pend::ShmRecv { from, ptr, len, tag } => unsafe { self.local.recv_from(from, ptr as usize, len, tag) },
            Pend::Tcp(h) => self.mesh.wait(h),
            Pend::Done => Ok(()),
        }
    }
}
