//! Point-to-point send/recv over the shared segments.
//!
//! A sender writes a descriptor (address, length, tag) into its ring for the destination and bumps
//! its `posted[dst]` counter; it does not wait for the receiver, so a ring of ranks that all send
//! before they receive cannot deadlock. The receiver waits for the counter, reads the bytes from
//! the sender's memory (process_vm_readv) and bumps its `acked[src]` counter; the send completes
//! when that counter passes it (`ShmSend::wait`), after which the sender may reuse its buffer.
use super::comm::{Comm, Net};
use crate::error::{Error, Result};
use super::segment::{SendEntry, P2P_RING};
use std::sync::Arc;

/// What a posted send still waits for: the receiver's acknowledgement.
pub struct ShmSend {
    net: Arc<Net>,
    to: usize,
    n: u32,
}

impl ShmSend {
    pub fn wait(&self) -> Result<()> {
        let me = self.net.rank;
        let n = self.n;
        let to = self.to;
        self.net.wait_word(to, self.net.segs[to].acked(me), |a| a.wrapping_sub(n) as i32 >= 0, &|| {
            format!("rank {to} to receive a message from rank {me}")
        })
    }
}

impl Comm {
    fn check_peer(&self, peer: usize, what: &str) -> Result<()> {
        if peer >= self.world {
            return Err(Error::Unsupported(format!("{what} rank {peer} is not in this group of {}", self.world)));
        }
        if peer == self.rank {
            return Err(Error::Unsupported(format!("rank {peer} cannot {what} itself")));
        }
        Ok(())
    }

    /// Post a send of `len` bytes at `addr` to rank `to`; completion is the ticket's wait. Typed
    /// (not boxed, as `Collectives::send_post`'s is): hosts/ keeps it among its own handles.
    /// # Safety
    /// `addr..addr+len` stays valid and unchanged until the ticket completes (the receiver reads it).
    pub unsafe fn post_to(&mut self, to: usize, addr: usize, len: usize, tag: u64) -> Result<ShmSend> {
        self.check_peer(to, "send to")?;
        if let Some(e) = &self.broken {
            return Err(Error::Broken(e.to_string()));
        }
        let n = self.p2p_sent[to];
        let me = self.rank;
        let net = self.net.clone();
        // The ring holds P2P_RING descriptors: wait for the receiver to have consumed the oldest.
        if n >= P2P_RING as u32 {
            let need = n - P2P_RING as u32 + 1;
            if let Err(e) = net.wait_word(to, net.segs[to].acked(me), |a| a.wrapping_sub(need) as i32 >= 0, &|| {
                format!("rank {to} to receive earlier messages from rank {me}")
            }) {
                self.fail(&e);
                return Err(e);
            }
        }
        net.own().write_send(to, n, SendEntry { addr: addr as u64, len: len as u64, tag });
        net.bump(net.own().posted(to));
        self.p2p_sent[to] = n.wrapping_add(1);
        Ok(ShmSend { net, to, n: n.wrapping_add(1) })
    }

    /// Receive exactly `len` bytes from rank `from` into `addr`.
    /// # Safety
    /// `addr..addr+len` is valid for writes, and touched by nobody else, for the call.
    pub unsafe fn recv_from(&mut self, from: usize, addr: usize, len: usize, tag: u64) -> Result<()> {
        self.check_peer(from, "receive from")?;
        if let Some(e) = &self.broken {
            return Err(Error::Broken(e.to_string()));
        }
        let net = self.net.clone();
        let me = self.rank;
        let n = self.p2p_recvd[from];
        let r = (|| {
            let want = n.wrapping_add(1);
            net.wait_word(from, net.segs[from].posted(me), |p| p.wrapping_sub(want) as i32 >= 0, &|| {
                format!("rank {from} to send to rank {me}")
            })?;
            let e = net.segs[from].send_entry(me, n);
            if e.len as usize != len || e.tag != tag {
                return Err(Error::Mismatch(format!(
                    "rank {from} sent {} bytes (tag {}) to rank {me}, which receives {len} bytes (tag {tag})",
                    e.len, e.tag
                )));
            }
            net.read_from(from, e.addr, addr as *mut u8, len)
        })();
        if let Err(e) = &r {
            self.fail(e);
            return r;
        }
        self.p2p_recvd[from] = n.wrapping_add(1);
        net.bump(net.own().acked(from));
        Ok(())
    }
}

impl ShmSend {
    pub fn is_acked(&self) -> bool {
        let a = self.net.segs[self.to].acked(self.net.rank).load(std::sync::atomic::Ordering::Acquire);
        a.wrapping_sub(self.n) as i32 >= 0
    }
}

/// A send over shared memory, as `Collectives::send_post` returns it (api::Ticket).
impl crate::api::Pending for ShmSend {
    fn wait(&self) -> Result<()> {
        ShmSend::wait(self)
    }
    fn is_acked(&self) -> bool {
        ShmSend::is_acked(self)
    }
}
