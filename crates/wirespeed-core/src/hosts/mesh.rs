//! A group's TCP side: one connection (transport/tcp/) to every rank on another host, made with a
//! handshake that names the job and both ranks.
//!
//! Connections. Every rank listens on one port (`Listener`, address from transport/iface.rs,
//! published through the store). For each pair of ranks on different hosts, the lower rank dials
//! the higher one with as many streams as hosts/mod.rs gives that pair (`pair_streams`). The
//! 32-byte key of the engine's hello carries the job's random token, both ranks, the world size and
//! the stream count; the listener's vetting refuses (and logs, and counts) a key of another job,
//! for another rank, with another stream count, from a rank that is not expected to dial, or any
//! connection after setup, so a stranger or a port scan never reaches a collective.
//!
//! Messages between a pair are matched in order; every receive states its exact length and tag,
//! and a message of another length or tag is a `Mismatch` (a rank that called another
//! collective), never silent data.
use crate::error::{Error, Result};
use crate::transport::tcp::{Conn, Dialer, NetConfig, Reactor, Request};
use std::collections::HashSet;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering::*};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const KEY_MAGIC: [u8; 4] = *b"WSG1";

fn key(token: &[u8; 16], from: usize, to: usize, world: usize, nstreams: usize) -> [u8; 32] {
    let mut k = [0u8; 32];
    k[0..16].copy_from_slice(token);
    k[16..20].copy_from_slice(&(from as u32).to_le_bytes());
    k[20..24].copy_from_slice(&(to as u32).to_le_bytes());
    k[24..26].copy_from_slice(&(world as u16).to_le_bytes());
    k[26..28].copy_from_slice(&(nstreams as u16).to_le_bytes());
    k[28..32].copy_from_slice(&KEY_MAGIC);
    k
}

fn parse_key(k: &[u8; 32]) -> Option<([u8; 16], usize, usize, usize, usize)> {
    if k[28..32] != KEY_MAGIC {
        return None;
    }
    let w32 = |i: usize| u32::from_le_bytes(k[i..i + 4].try_into().unwrap()) as usize;
    let w16 = |i: usize| u16::from_le_bytes(k[i..i + 2].try_into().unwrap()) as usize;
    Some((k[0..16].try_into().unwrap(), w32(16), w32(20), w16(24), w16(26)))
}

/// Which dialers this rank still expects; `sealed` once setup is over.
struct Expect {
    waiting: Mutex<HashSet<usize>>,
    sealed: AtomicBool,
}

/// This rank's listening socket; the engine's reactor vets every connection made to it.
pub struct Listener {
    pub addr: SocketAddr,
    inner: crate::transport::tcp::Listener,
    expect: Arc<Expect>,
    reactor: Arc<Reactor>,
    /// The engine's knobs, for the connections this rank dials (`Tcp::connect`).
    cfg: NetConfig,
}

impl Listener {
    /// Listen on `ip` for the connections of the ranks in `dialers`; `streams[r]` is how many
    /// streams rank r's connection must have; `cfg` the engine's knobs for every connection.
    pub fn bind(ip: IpAddr, rank: usize, world: usize, token: [u8; 16], cfg: NetConfig, dialers: &[usize], streams: &[usize]) -> Result<Listener> {
        let reactor = Reactor::global(&cfg)?;
        let expect = Arc::new(Expect { waiting: Mutex::new(dialers.iter().copied().collect()), sealed: AtomicBool::new(false) });
        let e = expect.clone();
        let streams = streams.to_vec();
        let vet = Box::new(move |k: &[u8; 32]| -> std::result::Result<(), String> {
            let (t, from, to, w, n) = parse_key(k).ok_or("not a wirespeed group's hello")?;
            if t != token {
                return Err(format!("rank {from} of another job (job token differs)"));
            }
            let want = streams.get(from).copied().unwrap_or(0);
            if to != rank || w != world || n != want {
                return Err(format!("hello from rank {from} for rank {to} of {w} with {n} streams; this is rank {rank} of {world}, expecting {want} streams from it"));
            }
            if e.sealed.load(Acquire) || !e.waiting.lock().unwrap().contains(&from) {
                return Err(format!("rank {from} is not expected here (a duplicate, or after setup)"));
            }
            Ok(())
        });
        let inner = crate::transport::tcp::Listener::bind_vetted(&reactor, &cfg, SocketAddr::new(ip, 0), vet, format!("rank {rank}"), None)?;
        Ok(Listener { addr: inner.local_addr(), inner, expect, reactor, cfg })
    }
}

/// A send in flight: complete when every byte is written to the sockets.
pub struct SendTicket {
    req: Request,
    to: usize,
    timeout: Duration,
}

impl SendTicket {
    pub fn is_done(&self) -> bool {
        self.req.is_done()
    }
    pub fn wait(&self) -> Result<()> {
        let to = self.to;
        self.req.wait_for(self.timeout, &|| format!("rank {to} to take a message")).map(|_| ())
    }
}

/// A send over TCP, as `Collectives::send_post` returns it (api::Ticket).
impl crate::api::Pending for SendTicket {
    fn wait(&self) -> Result<()> {
        SendTicket::wait(self)
    }
    fn is_acked(&self) -> bool {
        self.is_done()
    }
}

/// A receive in flight: `wait` checks the message had exactly the posted length.
pub struct RecvTicket {
    req: Request,
    from: usize,
    me: usize,
    len: usize,
    timeout: Duration,
}

impl RecvTicket {
    pub fn is_done(&self) -> bool {
        self.req.is_done()
    }
    pub fn wait(&self) -> Result<()> {
        let (from, me, len) = (self.from, self.me, self.len);
        let got = self.req.wait_for(self.timeout, &|| format!("rank {from} to send {len} bytes to rank {me}"))?;
        if got != len {
            return Err(Error::Mismatch(format!("rank {from} sent {got} bytes to rank {me}, which expects {len}")));
        }
        Ok(())
    }
}

/// The TCP side of a rank: one connection per rank on another host.
pub struct Tcp {
    pub rank: usize,
    conns: Vec<Option<Conn>>,
    listener: Listener,
    timeout: Duration,
}

impl Tcp {
    /// Dial the remote ranks above this one and accept those below; `addrs[r]` is rank r's
    /// listening address ("ip:port"), `streams[r]` the streams of the connection with r (0: r is
    /// on this host, no connection).
    pub fn connect(listener: Listener, rank: usize, addrs: &[String], streams: &[usize], token: [u8; 16], timeout: Duration) -> Result<Tcp> {
        let remote: Vec<bool> = streams.iter().map(|&n| n > 0).collect();
        let world = addrs.len();
        let deadline = Instant::now() + timeout;
        let mut conns: Vec<Option<Conn>> = (0..world).map(|_| None).collect();
        let mut dialers = Vec::new();
        for r in (rank + 1..world).filter(|&r| remote[r]) {
            let addr: SocketAddr = addrs[r].parse().map_err(|_| Error::Unsupported(format!("rank {r} published a bad address {:?}", addrs[r])))?;
            dialers.push((r, addr, Dialer::start(&listener.reactor, &listener.cfg, addr, key(&token, rank, r, world, streams[r]), streams[r])?));
        }
        // Dial and accept at once: every rank makes progress on both, so no order can deadlock.
        let mut missing: usize = (0..rank).filter(|&r| remote[r]).count();
        while !dialers.is_empty() || missing > 0 {
            let mut i = 0;
            while i < dialers.len() {
                let (r, addr, d) = &mut dialers[i];
                match d.poll() {
                    Ok(Some(c)) => {
                        c.set_peer_rank(*r);
                        conns[*r] = Some(c);
                        dialers.swap_remove(i);
                        continue;
                    }
                    Ok(None) => {}
                    // The peer's listener may not be accepting yet: dial again until the deadline.
                    Err(_) if Instant::now() < deadline => {
                        *d = Dialer::start(&listener.reactor, &listener.cfg, *addr, key(&token, rank, *r, world, streams[*r]), streams[*r])?;
                    }
                    Err(e) => return Err(e),
                }
                i += 1;
            }
            while let Some((k, c)) = listener.inner.poll_accept()? {
                let (_, from, ..) = parse_key(&k).expect("vetted");
                listener.expect.waiting.lock().unwrap().remove(&from);
                c.set_peer_rank(from);
                conns[from] = Some(c);
                missing -= 1;
            }
            if Instant::now() >= deadline {
                let who: Vec<usize> = (0..world).filter(|&r| remote[r] && conns[r].is_none()).collect();
                return Err(Error::Timeout { what: format!("connections with ranks {who:?}"), secs: timeout.as_secs_f64() });
            }
            if !dialers.is_empty() || missing > 0 {
                std::thread::sleep(Duration::from_micros(500));
            }
        }
        listener.expect.sealed.store(true, Release);
        Ok(Tcp { rank, conns, listener, timeout })
    }

    /// Connections refused so far by this rank's listener.
    pub fn refused(&self) -> usize {
        self.listener.inner.refused()
    }

    /// Streams of the connection with rank `r` (0: none).
    pub fn streams_to(&self, r: usize) -> usize {
        self.conns.get(r).and_then(|c| c.as_ref()).map_or(0, |c| c.nstreams())
    }

    fn conn(&self, r: usize) -> Result<&Conn> {
        self.conns.get(r).and_then(|c| c.as_ref()).ok_or_else(|| Error::Unsupported(format!("rank {r} is not reached over TCP")))
    }

    /// Queue `len` bytes at `ptr` for rank `to`; the caller keeps the buffer alive and unchanged
    /// until the ticket completes (or the group is shut down).
    ///
    /// Not marked unsafe, yet that is a safety condition (Conn::isend's): its callers,
    /// HostsComm's `post` and `post_send`, meet it under their own contracts.
    pub fn send(&mut self, to: usize, ptr: *const u8, len: usize, tag: u64) -> Result<SendTicket> {
        let timeout = self.timeout;
        // SAFETY: the callers' promise above, which is Conn::isend's contract; `shutdown`
        // (closing every connection) ends the engine's reads of the buffer.
        let req = unsafe { self.conn(to)?.isend(ptr, len, tag)? };
        Ok(SendTicket { req, to, timeout })
    }

    /// Post the receive of the next message from `from`: exactly `len` bytes with `tag` into
    /// `dst`, which the caller keeps for the engine alone until the ticket completes.
    ///
    /// Not marked unsafe, yet that is a safety condition (Conn::irecv's): its callers,
    /// HostsComm's `post_recv` and `take` (through `recv`), meet it under their own contracts.
    pub fn post_recv(&mut self, from: usize, dst: *mut u8, len: usize, tag: u64) -> Result<RecvTicket> {
        let (me, timeout) = (self.rank, self.timeout);
        // SAFETY: the callers' promise above, which is Conn::irecv's contract; `shutdown` ends
        // the engine's writes into the buffer.
        let req = unsafe { self.conn(from)?.irecv(dst, len, tag)? };
        Ok(RecvTicket { req, from, me, len, timeout })
    }

    /// Receive exactly `len` bytes with `tag` from rank `from` into `dst` (the next message from it).
    pub fn recv(&mut self, from: usize, dst: *mut u8, len: usize, tag: u64) -> Result<()> {
        self.post_recv(from, dst, len, tag)?.wait()
    }

    /// Shut every connection, so peers blocked on this rank fail at once. Afterwards no engine
    /// thread touches any caller buffer.
    pub fn shutdown(&mut self) {
        for c in self.conns.iter().flatten() {
            c.close();
        }
    }
}

impl Drop for Tcp {
    fn drop(&mut self) {
        self.shutdown();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip_and_other_magic_is_not_a_key() {
        let t = [9u8; 16];
        let k = key(&t, 3, 5, 8, 4);
        assert_eq!(parse_key(&k), Some((t, 3, 5, 8, 4)));
        let mut bad = k;
        bad[31] ^= 1;
        assert_eq!(parse_key(&bad), None);
    }
}
