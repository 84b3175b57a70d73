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
//!
//! The mesh is a `Transport` over the ranks it reaches, so hosts/ hands an algorithm's posts to
//! a peer on another host straight to it; `send` also gives a send its own ticket, for a
//! `Collectives::send_post` that outlives the op that posted it.
use crate::error::{Error, Result};
use crate::transport::tcp::{Conn, Dialer, NetConfig, Reactor, Request};
use crate::transport::{Handle, Transport};
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
    /// The engine's knobs, for the connections this rank dials (`Mesh::connect`).
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
struct RecvTicket {
    req: Request,
    from: usize,
    me: usize,
    len: usize,
    timeout: Duration,
}

impl RecvTicket {
    fn wait(&self) -> Result<()> {
        let (from, me, len) = (self.from, self.me, self.len);
        let got = self.req.wait_for(self.timeout, &|| format!("rank {from} to send {len} bytes to rank {me}"))?;
        if got != len {
            return Err(Error::Mismatch(format!("rank {from} sent {got} bytes to rank {me}, which expects {len}")));
        }
        Ok(())
    }
}

/// The TCP side of a rank: one connection per rank on another host.
pub struct Mesh {
    pub rank: usize,
    conns: Vec<Option<Conn>>,
    listener: Listener,
    timeout: Duration,
    /// What was posted through `Transport` and not yet waited, by handle; None once waited.
    posted: Vec<Option<Posted>>,
}

enum Posted {
    Send(SendTicket),
    Recv(RecvTicket),
}

impl Mesh {
    /// Dial the remote ranks above this one and accept those below; `addrs[r]` is rank r's
    /// listening address ("ip:port"), `streams[r]` the streams of the connection with r (0: r is
    /// on this host, no connection).
    pub fn connect(listener: Listener, rank: usize, addrs: &[String], streams: &[usize], token: [u8; 16], timeout: Duration) -> Result<Mesh> {
        let remote: Vec<bool> = streams.iter().map(|&n| n > 0).collect();
        let world = addrs.len();
        let deadline = Instant::now() + timeout;
        let mut conns: Vec<Option<Conn>> = (0..world).map(|_| None).collect();
        let mut dialers = Vec::new();
        for r in (rank + 1..world).filter(|&r| remote[r]) {
            let addr: SocketAddr = addrs[r].parse().map_err(|_| Error::Unsupported(format!("rank {r} published a bad address {:?}", addrs[r])))?;
            dialers.push((r, addr, Dialer::start(&listener.reactor, &listener.cfg, addr, key(&token, rank, r, world, streams[r]), streams[r])?));
        }
        // A failed dial is tried again after a pause that doubles (10 ms to 1 s): a peer that
        // refuses (another job secret, a stale duplicate stream) is not hammered, and its log
        // gets a line per try, not thousands.
        let mut retry: Vec<(Instant, Duration)> = vec![(Instant::now(), Duration::from_millis(10)); world];
        // Dial and accept at once: every rank makes progress on both, so no order can deadlock.
        let mut missing: usize = (0..rank).filter(|&r| remote[r]).count();
        // Why each peer's last dial failed, for the timeout's message.
        let mut last_error: Vec<Option<String>> = vec![None; world];
        while !dialers.is_empty() || missing > 0 {
            let mut i = 0;
            while i < dialers.len() {
                let (r, addr, d) = &mut dialers[i];
                if Instant::now() < retry[*r].0 {
                    i += 1;
                    continue;
                }
                match d.poll() {
                    Ok(Some(c)) => {
                        c.set_peer_rank(*r);
                        conns[*r] = Some(c);
                        dialers.swap_remove(i);
                        continue;
                    }
                    Ok(None) => {}
                    // Something that is not this job's rank answers at the rank's address (no
                    // wirespeed listener, or one without this job's secret): dialing again
                    // cannot change that.
                    Err(Error::Stranger(why)) => {
                        return Err(Error::Stranger(format!("rank {r}: {why}: give every rank the same WIRESPEED_JOB_SECRET (or none)")));
                    }
                    // The peer's listener may not be accepting yet: dial again until the deadline.
                    Err(e) if Instant::now() < deadline => {
                        last_error[*r] = Some(e.to_string());
                        let pause = retry[*r].1;
                        retry[*r] = (Instant::now() + pause, (pause * 2).min(Duration::from_secs(1)));
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
                let mut what = format!("connections with ranks {who:?}");
                for r in &who {
                    if let Some(e) = &last_error[*r] {
                        what += &format!(" (rank {r}'s last refusal: {e})");
                    }
                }
                let refused = listener.inner.refused();
                if refused > 0 {
                    what += &format!(" ({refused} connection(s) to this rank refused meanwhile: a peer with another job secret or job, or a stranger; see the lines above)");
                }
                return Err(Error::Timeout { what, secs: timeout.as_secs_f64() });
            }
            if !dialers.is_empty() || missing > 0 {
                std::thread::sleep(Duration::from_micros(500));
            }
        }
        listener.expect.sealed.store(true, Release);
        Ok(Mesh { rank, conns, listener, timeout, posted: Vec::new() })
    }

    /// Connections refused so far by this rank's listener.
    pub fn refused(&self) -> usize {
        self.listener.inner.refused()
    }

    /// Streams of the connection with rank `r` (0: none).
    pub fn streams_to(&self, r: usize) -> usize {
        self.conns.get(r).and_then(|c| c.as_ref()).map_or(0, |c| c.nstreams())
    }

    /// Streams this rank sends on to rank `r` (0: none; `Conn::active`).
    pub fn active_to(&self, r: usize) -> usize {
        self.conns.get(r).and_then(|c| c.as_ref()).map_or(0, |c| c.active())
    }

    /// Send on at most `k` streams to rank `r` (`Conn::set_active`).
    pub fn set_active(&self, r: usize, k: usize) -> Result<()> {
        self.conn(r)?.set_active(k);
        Ok(())
    }

    /// Send on at most `k` streams to every rank: pairs with fewer streams keep all of theirs.
    pub fn use_streams(&self, k: usize) {
        for c in self.conns.iter().flatten() {
            c.set_active(k);
        }
    }

    fn conn(&self, r: usize) -> Result<&Conn> {
        self.conns.get(r).and_then(|c| c.as_ref()).ok_or_else(|| Error::Unsupported(format!("rank {r} is not reached over TCP")))
    }

    /// Queue `len` bytes at `ptr` for rank `to`; the send's own ticket, complete when every byte
    /// is written to the sockets.
    ///
    /// # Safety
    /// `ptr..ptr+len` stays readable, and written by nobody, until the ticket completes or the
    /// mesh is shut down (`shutdown`, or drop): the engine's threads read it meanwhile.
    // SAFETY: unsafe to call: `send` relies on its callers for this (`# Safety` above): `ptr..ptr+len` stays readable, and written by nobody, until the ticket completes or the mesh is shut down.
    pub unsafe fn send(&mut self, to: usize, ptr: *const u8, len: usize, tag: u64) -> Result<SendTicket> {
        let timeout = self.timeout;
        // SAFETY: this fn's contract is Conn::isend's; `shutdown` (closing every connection)
        // ends the engine's reads of the buffer.
        let req = unsafe { self.conn(to)?.isend(ptr, len, tag)? };
        Ok(SendTicket { req, to, timeout })
    }

    /// Post the receive of the next message from `from`: exactly `len` bytes with `tag`.
    ///
    /// # Safety
    /// `dst..dst+len` stays writable, and touched by nobody else, until the ticket completes or
    /// the mesh is shut down: the engine's threads write it meanwhile.
    // SAFETY: unsafe to call: `irecv` relies on its callers for this (`# Safety` above): `dst..dst+len` stays writable, and touched by nobody else, until the ticket completes or the mesh is shut down.
    unsafe fn irecv(&mut self, from: usize, dst: *mut u8, len: usize, tag: u64) -> Result<RecvTicket> {
        let (me, timeout) = (self.rank, self.timeout);
        // SAFETY: this fn's contract is Conn::irecv's; `shutdown` ends the engine's writes into
        // the buffer.
        let req = unsafe { self.conn(from)?.irecv(dst, len, tag)? };
        Ok(RecvTicket { req, from, me, len, timeout })
    }

    fn push(&mut self, p: Posted) -> Handle {
        self.posted.push(Some(p));
        Handle(self.posted.len() - 1)
    }

    /// Shut every connection, so peers blocked on this rank fail at once. Afterwards no engine
    /// thread touches any caller buffer, so what was posted may be forgotten.
    pub fn shutdown(&mut self) {
        for c in self.conns.iter().flatten() {
            c.close();
        }
        self.posted.clear();
    }
}

/// Each method's contract is `Transport`'s (transport/mod.rs); "shut down" is `shutdown`.
impl Transport for Mesh {
    fn rank(&self) -> usize {
        self.rank
    }
    fn world(&self) -> usize {
        self.conns.len()
    }
    // SAFETY: unsafe to call: `Transport`'s contract (transport/mod.rs): the pointer is valid for `len` bytes until the handle completes or the mesh is shut down
    unsafe fn post_send(&mut self, to: usize, data: *const u8, len: usize, tag: u64) -> Result<Handle> {
        // SAFETY: `Transport::post_send`'s contract is `send`'s: the bytes stay readable and
        // unwritten until the handle (which holds the ticket) is waited or the mesh shut down.
        let t = unsafe { self.send(to, data, len, tag)? };
        Ok(self.push(Posted::Send(t)))
    }
    // SAFETY: unsafe to call: `Transport`'s contract (transport/mod.rs): the pointer is valid for `len` bytes until the handle completes or the mesh is shut down
    unsafe fn post_recv(&mut self, from: usize, data: *mut u8, len: usize, tag: u64) -> Result<Handle> {
        // SAFETY: `Transport::post_recv`'s contract is `irecv`'s: the bytes stay writable and
        // ours until the handle is waited or the mesh shut down.
        let t = unsafe { self.irecv(from, data, len, tag)? };
        Ok(self.push(Posted::Recv(t)))
    }
    fn wait(&mut self, h: Handle) -> Result<()> {
        let p = self.posted.get_mut(h.0).and_then(Option::take);
        // Handles count up from 0 again once nothing is posted, so the list stays as long as
        // one op's posts (every op waits all of its handles).
        if self.posted.iter().all(Option::is_none) {
            self.posted.clear();
        }
        match p {
            Some(Posted::Send(t)) => t.wait(),
            Some(Posted::Recv(t)) => t.wait(),
            None => Err(Error::Unsupported(format!("no operation {} is pending", h.0))),
        }
    }
}

impl Drop for Mesh {
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

    /// The algorithms run over the mesh alone (every rank on its own host): a ring all_reduce
    /// over loopback, then a handle waited twice is refused.
    #[test]
    fn the_ring_runs_over_the_mesh_alone() {
        let world = 3;
        let token = [7u8; 16];
        let ip: IpAddr = "127.0.0.1".parse().unwrap();
        let streams = vec![2; world];
        let listeners: Vec<Listener> = (0..world)
            .map(|r| {
                let mut s = streams.clone();
                s[r] = 0;
                let dialers: Vec<usize> = (0..r).collect();
                Listener::bind(ip, r, world, token, NetConfig::default(), &dialers, &s).unwrap()
            })
            .collect();
        let addrs: Vec<String> = listeners.iter().map(|l| l.addr.to_string()).collect();
        let hs: Vec<_> = listeners
            .into_iter()
            .enumerate()
            .map(|(r, l)| {
                let (addrs, mut s) = (addrs.clone(), streams.clone());
                s[r] = 0;
                std::thread::spawn(move || {
                    let mut m = Mesh::connect(l, r, &addrs, &s, token, Duration::from_secs(10)).unwrap();
                    let mut v: Vec<i32> = (0..1000).map(|i| i * (r as i32 + 1)).collect();
                    // SAFETY: `v` is a live Vec of i32 viewed as bytes for the call only.
                    let b = unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr() as *mut u8, v.len() * 4) };
                    let members: Vec<usize> = (0..world).collect();
                    crate::algo::ring::all_reduce(&mut m, &members, 1, b, crate::DType::I32, crate::ReduceOp::Sum, world, &mut Vec::new()).unwrap();
                    (v, m.wait(Handle(0)).is_err())
                })
            })
            .collect();
        for h in hs {
            let (v, refused) = h.join().unwrap();
            assert!(v.iter().enumerate().all(|(i, &x)| x == i as i32 * 6), "wrong sum");
            assert!(refused, "a handle waited twice must be refused");
        }
    }
}
