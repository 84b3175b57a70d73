//! A group's TCP side: one connection (transport/tcp/) to every rank on another host, made with a
//! handshake that names the job and both ranks.
//!
//! Connections. Every rank listens on one port (`MeshListener`, address from transport/iface.rs,
//! published through the store). For each pair of ranks on different hosts, the lower rank dials
//! the higher one with as many streams as hosts/mod.rs gives that pair (`pair_streams`). The
//! 32-byte key of the engine's hello carries the job's random token, both ranks, the world size and
//! the stream count; the listener's vetting refuses (and logs, and counts) a key of another job,
//! for another rank, with another stream count, from a rank that is not expected to dial, or any
//! connection after setup, so a stranger or a port scan never reaches a collective.
//!
//! Lazy connections (WIRESPEED_CONNECT=lazy, the default; docs/transport.md "Connections on
//! first use"). Setup dials nothing: every remote rank gets a `Conn` with no streams yet, and
//! the first send or receive posted toward a rank whose address this rank holds starts a dial
//! that the reactor drives (transport/tcp/dial.rs), while what was posted waits in the `Conn`'s
//! queues. Toward a rank whose address it does not hold (the store rendezvous gives a rank only
//! the addresses of the higher ranks of other hosts: native/rendezvous.py), a post just waits:
//! that lower rank dials on its own first post toward this one, which any message between the
//! two needs. Toward a lower rank whose address it holds, a rank waits `LOWER_DIAL_AFTER` for
//! that rank's dial and then dials it itself, so that a lower rank that died before its first
//! post is an error at once on this side too (its address refuses), not at the timeout. Where
//! both ranks hold both addresses, either may dial first; when both do, the lower rank's dial wins: the lower rank alone decides, in its listener's vetting, under the
//! pair's lock (`Link`), so exactly one connection is made. An accepted connection attaches to
//! the waiting `Conn` on the reactor's thread (`route`). No step waits for a thread of the
//! application, here or at the peer.
//!
//! Streams opened by use (lazy mode). A pair's first dial opens one stream when the post that
//! caused it is below the pair's growth size (`tcp::grow_at`: 384 KiB at 12 streams), else all
//! of the pair's. On the first post of that size or more over a pair of one stream, the rank
//! that made the connection dials the rest (links.rs `Lazy::dial_rest`; a key of magic `WSG+`), once, and the peer's
//! vetting takes them only from that rank and only as many as complete the pair. Either rank
//! of a pair sees every message's size (a receive is posted with its length), so the rank that
//! dials grows the pair whichever sends. A host leader's small collectives then cost it one
//! socket per partner leader instead of every stream (docs/transport.md "Streams opened by use").
//!
//! Messages between a pair are matched in order; every receive states its exact length and tag,
//! and a message of another length or tag is a `Mismatch` (a rank that called another
//! collective), never silent data.
//!
//! The mesh is a `Transport` over the ranks it reaches, so hosts/ hands an algorithm's posts to
//! a peer on another host straight to it; `send` also gives a send its own ticket, for a
//! `Collectives::send_post` that outlives the op that posted it.
use super::links::{key, parse_key, Dialing, Lazy, Link, Links, More, State, LOWER_DIAL_AFTER};
use crate::error::{Error, Result};
use crate::transport::tcp::{Conn, Dialer, NetConfig, Reactor, Refusal, Request, Told};
use crate::transport::{Handle, Transport};
use std::collections::HashSet;
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering::*};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};


/// Which dialers this rank still expects; `sealed` once setup is over.
struct Expect {
    waiting: Mutex<HashSet<usize>>,
    sealed: AtomicBool,
    /// A rank of this group whose dial proved another job token (`other_token`): setup fails.
    stranger: Mutex<Option<Error>>,
}

/// When the connections are made (WIRESPEED_CONNECT).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Connect {
    /// At setup, every pair of ranks on different hosts: a peer that cannot be reached fails
    /// setup, on every rank.
    Eager,
    /// On first use, toward the peers the algorithms and the user's sends really use.
    Lazy,
}


/// This rank's listening socket; the engine's reactor vets every connection made to it.
pub struct MeshListener {
    pub addr: SocketAddr,
    inner: crate::transport::tcp::Listener,
    expect: Arc<Expect>,
    reactor: Arc<Reactor>,
    /// The engine's knobs, for the connections this rank dials (`Mesh::connect`).
    cfg: NetConfig,
    /// Lazy mode's pair states; None when eager.
    links: Option<Arc<Links>>,
}

impl MeshListener {
    /// Listen on `ip` for the connections of the ranks in `dialers` (eager; lazily, of any rank
    /// with streams); `streams[r]` is how many streams rank r's connection must have; `cfg` the
    /// engine's knobs for every connection.
    #[allow(clippy::too_many_arguments)]
    pub fn bind(ip: IpAddr, rank: usize, world: usize, token: [u8; 16], cfg: NetConfig, dialers: &[usize], streams: &[usize], mode: Connect) -> Result<MeshListener> {
        let reactor = Reactor::global(&cfg)?;
        let expect = Arc::new(Expect { waiting: Mutex::new(dialers.iter().copied().collect()), sealed: AtomicBool::new(false), stranger: Mutex::new(None) });
        let e = expect.clone();
        let links = (mode == Connect::Lazy).then(|| {
            let links = (0..world).map(|_| Mutex::new(Link { state: State::Idle, more: More::No, first: 0, attacher: None, early: None, last_try: None, refused: None })).collect();
            Arc::new(Links { links, closed: AtomicBool::new(false) })
        });
        let lv = links.clone();
        let streams = streams.to_vec();
        let vet = Box::new(move |k: &[u8; 32]| -> std::result::Result<(), Refusal> {
            let (t, from, to, w, n, more) = parse_key(k).ok_or("not a wirespeed group's hello")?;
            if t != token {
                // The token's first half is the job's round alone, its second folds in the secret
                // (admission.job_token): a rank of this very group whose secret differs is told,
                // and fails this rank's wait on it; another job's process (a stale address) is
                // only refused, and the job goes on.
                let this_job = t[..8] == token[..8] && to == rank && w == world && from < world && from != rank;
                if !this_job {
                    return Err(format!("rank {from} of another job (job token differs: another job, or another or no WIRESPEED_JOB_SECRET)").into());
                }
                let why = format!("rank {from}: its job secret is not this rank's (it dialled with another job token): give every rank the same WIRESPEED_JOB_SECRET (or none)");
                match &lv {
                    Some(links) => links.refuse_peer(from, Error::Stranger(why)),
                    None => *e.stranger.lock().unwrap() = Some(Error::Stranger(why)),
                }
                return Err(Refusal { why: format!("rank {from} of this job with another job token: another or no WIRESPEED_JOB_SECRET"), told: Told::OtherToken });
            }
            let want = streams.get(from).copied().unwrap_or(0);
            if let (Some(links), true) = (&lv, to == rank && w == world && want > 0) {
                return links.vet(rank, from, n, want, more).map_err(Refusal::from);
            }
            if to != rank || w != world || n != want || more {
                return Err(format!("hello from rank {from} for rank {to} of {w} with {n} streams; this is rank {rank} of {world}, expecting {want} streams from it").into());
            }
            if e.sealed.load(Acquire) || !e.waiting.lock().unwrap().contains(&from) {
                return Err(format!("rank {from} is not expected here (a duplicate, or after setup)").into());
            }
            Ok(())
        });
        let route = links.as_ref().map(|l| {
            let l = Arc::downgrade(l);
            Box::new(move |k: &[u8; 32], socks: Vec<TcpStream>, _from: SocketAddr| {
                if let (Some(links), Some((_, from, .., more))) = (l.upgrade(), parse_key(k)) {
                    links.route(from, socks, more);
                }
            }) as crate::transport::tcp::Handoff
        });
        let inner = crate::transport::tcp::Listener::bind_routed(&reactor, &cfg, SocketAddr::new(ip, 0), vet, format!("rank {rank}"), None, route)?;
        Ok(MeshListener { addr: inner.local_addr(), inner, expect, reactor, cfg, links })
    }
}

/// A send in flight: complete when every byte is written to the sockets.
pub struct TcpSend {
    req: Request,
    to: usize,
    timeout: Duration,
    note: Note,
}

/// What a wait that times out adds about a connection not made yet (lazy mode): why this
/// rank's dial failed, or that the peer never dialled, and the refusals of this rank's listener.
#[derive(Clone)]
struct Note {
    links: Option<Arc<Links>>,
    refused: Arc<dyn Fn() -> usize + Send + Sync>,
}

impl Note {
    fn about(&self, req: &Request, peer: usize) -> String {
        let Some(links) = &self.links else { return String::new() };
        if req.is_connected() {
            return String::new();
        }
        let refused = (self.refused)();
        let refused = if refused > 0 { format!("; {refused} connection(s) to this rank refused meanwhile: a peer with another job secret or job, or a stranger, see the lines above") } else { String::new() };
        match links.links[peer].lock().unwrap().last_try.clone() {
            Some(e) => format!(" (no connection with rank {peer}: the last try to make it failed: {e}{refused})"),
            None => format!(" (no connection with rank {peer}: it is made on first use, and none came{refused})"),
        }
    }
}

impl TcpSend {
    pub fn is_done(&self) -> bool {
        self.req.is_done()
    }
    pub fn wait(&self) -> Result<()> {
        let to = self.to;
        self.req.wait_for(self.timeout, &|| format!("rank {to} to take a message{}", self.note.about(&self.req, to))).map(|_| ())
    }
}

/// A send over TCP, as `Collectives::send_post` returns it (api::Ticket).
impl crate::api::Pending for TcpSend {
    fn wait(&self) -> Result<()> {
        TcpSend::wait(self)
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
    note: Note,
}

impl RecvTicket {
    fn wait(&self) -> Result<()> {
        let (from, me, len) = (self.from, self.me, self.len);
        let got = self.req.wait_for(self.timeout, &|| format!("rank {from} to send {len} bytes to rank {me}{}", self.note.about(&self.req, from)))?;
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
    listener: MeshListener,
    timeout: Duration,
    /// Lazy mode: what a first post needs to dial.
    lazy: Option<Lazy>,
    /// What every ticket's timeout tells about connections (made once: tickets share it).
    note: Note,
    /// What was posted through `Transport` and not yet waited, by handle; None once waited.
    posted: Vec<Option<Posted>>,
}

enum Posted {
    Send(TcpSend),
    Recv(RecvTicket),
}


impl Mesh {
    /// Dial the remote ranks above this one and accept those below; `addrs[r]` is rank r's
    /// listening address ("ip:port"), `streams[r]` the streams of the connection with r (0: r is
    /// on this host, no connection).
    pub fn connect(listener: MeshListener, rank: usize, addrs: &[String], streams: &[usize], token: [u8; 16], timeout: Duration) -> Result<Mesh> {
        if listener.links.is_some() {
            return Mesh::lazy(listener, rank, addrs, streams, token, timeout);
        }
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
            if let Some(e) = listener.expect.stranger.lock().unwrap().take() {
                return Err(e);
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
        let note = Note { links: None, refused: listener.inner.clone_refused() };
        Ok(Mesh { rank, conns, listener, timeout, lazy: None, note, posted: Vec::new() })
    }

    /// Lazy mode: a `Conn` with no streams for every remote rank, attached to what its peer
    /// already sent; nothing dialled.
    fn lazy(listener: MeshListener, rank: usize, addrs: &[String], streams: &[usize], token: [u8; 16], timeout: Duration) -> Result<Mesh> {
        let links = listener.links.clone().expect("lazy");
        let world = addrs.len();
        let mut conns: Vec<Option<Conn>> = (0..world).map(|_| None).collect();
        let mut parsed = vec![None; world];
        for r in (0..world).filter(|&r| streams[r] > 0) {
            // An empty address: not read (a lower rank, which dials this one).
            let addr: Option<SocketAddr> = match addrs[r].as_str() {
                "" => None,
                a => Some(a.parse().map_err(|_| Error::Unsupported(format!("rank {r} published a bad address {a:?}")))?),
            };
            let shown = addr.map_or_else(|| "its address not read: it dials this rank".to_string(), |a| a.to_string());
            let c = Conn::pending(&listener.reactor, &listener.cfg, shown, streams[r]);
            c.set_peer_rank(r);
            let mut l = links.links[r].lock().unwrap();
            l.attacher = Some(c.attacher());
            if let Some(socks) = l.early.take() {
                let _ = c.attacher().attach(socks);
            }
            if let Some(e) = l.refused.take() {
                c.attacher().fail(e);
            }
            drop(l);
            conns[r] = Some(c);
            parsed[r] = addr;
        }
        let note = Note { links: Some(links.clone()), refused: listener.inner.clone_refused() };
        let grow_at = listener.cfg.grow_bytes;
        let lazy = Lazy { links, addrs: parsed, streams: streams.to_vec(), token, lower_after: LOWER_DIAL_AFTER.min(timeout / 4), grow_at };
        Ok(Mesh { rank, conns, listener, timeout, lazy: Some(lazy), note, posted: Vec::new() })
    }



    /// What a lazy dial needs from this mesh (links.rs).
    fn dialing(&self) -> Dialing<'_> {
        Dialing { reactor: &self.listener.reactor, cfg: &self.listener.cfg, me: self.rank, world: self.conns.len(), timeout: self.timeout }
    }

    /// Lazy mode: the first post toward `r`, of `len` bytes, dials it (`Lazy::dial_first`).
    fn touch(&self, r: usize, len: usize) -> Result<()> {
        self.lazy.as_ref().map_or(Ok(()), |lz| lz.dial_first(&self.dialing(), r, len))
    }

    /// Lazy mode: a post of `len` bytes toward `r`, whose connection has fewer streams than the
    /// pair's, may open the rest (`Lazy::dial_rest`).
    fn grow(&self, r: usize, len: usize) -> Result<()> {
        self.lazy.as_ref().map_or(Ok(()), |lz| lz.dial_rest(&self.dialing(), r, len))
    }

    /// Every stream of the connection with `r`: asked for where this rank made it (or makes it
    /// now), and waited for until they are all attached, or the group's timeout. The rank at the
    /// other end calls it too (the stream probe, probe.rs, on both of its ranks): a rank that
    /// did not make the connection cannot open its streams, only wait for them.
    pub fn open_all(&self, r: usize) -> Result<()> {
        let c = self.conn(r, usize::MAX)?;
        let deadline = Instant::now() + self.timeout;
        while c.nstreams() < c.capacity() {
            // Asked again each turn (the same connection, dialled or grown as it now stands): a
            // first dial still under way when this began could not be grown then.
            self.conn(r, usize::MAX)?;
            if Instant::now() >= deadline {
                let why = self.lazy.as_ref().and_then(|lz| lz.links.links[r].lock().unwrap().last_try.clone()).map_or(String::new(), |e| format!(" (the last try: {e})"));
                return Err(Error::Timeout { what: format!("the {} streams of the connection with rank {r}, {} made{why}", c.capacity(), c.nstreams()), secs: self.timeout.as_secs_f64() });
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        Ok(())
    }

    /// Dial a lower rank after `d` of waiting for its dial (`LOWER_DIAL_AFTER` otherwise): the
    /// crossing tests dial at once from both sides.
    #[cfg(test)]
    pub fn set_lower_dial_after(&mut self, d: Duration) {
        if let Some(lz) = &mut self.lazy {
            lz.lower_after = d;
        }
    }

    /// Connections refused so far by this rank's listener.
    pub fn refused(&self) -> usize {
        self.listener.inner.refused()
    }

    /// Streams of crossing dials this rank refused quietly (the lower rank's dial won).
    #[cfg(test)]
    pub fn crossings_refused(&self) -> usize {
        self.listener.inner.quiet_refusals()
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
        self.conn(r, 0)?.set_active(k);
        Ok(())
    }

    /// Send on at most `k` streams to every rank: pairs with fewer streams keep all of theirs.
    pub fn use_streams(&self, k: usize) {
        for c in self.conns.iter().flatten() {
            c.set_active(k);
        }
    }

    /// The connection with `r`, for a post of `len` bytes: dialled on first use (`touch`), grown
    /// from the growth size on (`grow`).
    fn conn(&self, r: usize, len: usize) -> Result<&Conn> {
        let c = self.conns.get(r).and_then(|c| c.as_ref()).ok_or_else(|| Error::Unsupported(format!("rank {r} is not reached over TCP")))?;
        // A connection with all its streams needs no dial: skip the link's lock on every post
        // after (and on every small post while it has fewer).
        if !c.is_attached() {
            self.touch(r, len)?;
        } else if c.nstreams() < c.capacity() {
            self.grow(r, len)?;
        }
        Ok(c)
    }

    fn note(&self) -> Note {
        self.note.clone()
    }

    /// Remote ranks this rank holds streams with now (lazy mode: those used so far).
    pub fn connected(&self) -> Vec<usize> {
        (0..self.conns.len()).filter(|&r| self.streams_to(r) > 0).collect()
    }

    /// Queue `len` bytes at `ptr` for rank `to`; the send's own ticket, complete when every byte
    /// is written to the sockets.
    ///
    /// # Safety
    /// `ptr..ptr+len` stays readable, and written by nobody, until the ticket completes or the
    /// mesh is shut down (`shutdown`, or drop): the engine's threads read it meanwhile.
    pub unsafe fn send(&mut self, to: usize, ptr: *const u8, len: usize, tag: u64) -> Result<TcpSend> {
        let timeout = self.timeout;
        // SAFETY: this fn's contract is Conn::isend's; `shutdown` (closing every connection)
        // ends the engine's reads of the buffer.
        let req = unsafe { self.conn(to, len)?.isend(ptr, len, tag)? };
        Ok(TcpSend { req, to, timeout, note: self.note() })
    }

    /// Post the receive of the next message from `from`: exactly `len` bytes with `tag`.
    ///
    /// # Safety
    /// `dst..dst+len` stays writable, and touched by nobody else, until the ticket completes or
    /// the mesh is shut down: the engine's threads write it meanwhile.
    unsafe fn irecv(&mut self, from: usize, dst: *mut u8, len: usize, tag: u64) -> Result<RecvTicket> {
        let (me, timeout) = (self.rank, self.timeout);
        // SAFETY: this fn's contract is Conn::irecv's; `shutdown` ends the engine's writes into
        // the buffer.
        let req = unsafe { self.conn(from, len)?.irecv(dst, len, tag)? };
        Ok(RecvTicket { req, from, me, len, timeout, note: self.note() })
    }

    fn push(&mut self, p: Posted) -> Handle {
        self.posted.push(Some(p));
        Handle(self.posted.len() - 1)
    }

    /// Shut every connection, so peers blocked on this rank fail at once. Afterwards no engine
    /// thread touches any caller buffer, so what was posted may be forgotten.
    pub fn shutdown(&mut self) {
        self.shutdown_telling(None);
    }

    /// `shutdown`, telling every peer connected `why` (the error that broke this rank's group), so
    /// theirs names it, as over shared memory, rather than a closed connection.
    pub fn shutdown_telling(&mut self, why: Option<&str>) {
        if let Some(lz) = &self.lazy {
            lz.links.closed.store(true, Release);
        }
        for c in self.conns.iter().flatten() {
            c.close_telling(why);
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
    // SAFETY: sound on Transport's contract alone, which is `send`'s: the ticket the handle holds
    // keeps the bytes in use until it is waited or the mesh shut down.
    unsafe fn post_send(&mut self, to: usize, data: *const u8, len: usize, tag: u64) -> Result<Handle> {
        // SAFETY: `Transport::post_send`'s contract is `send`'s: the bytes stay readable and
        // unwritten until the handle (which holds the ticket) is waited or the mesh shut down.
        let t = unsafe { self.send(to, data, len, tag)? };
        Ok(self.push(Posted::Send(t)))
    }
    // SAFETY: sound on Transport's contract alone, which is `irecv`'s: the bytes are written only
    // until the handle is waited or the mesh shut down.
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
