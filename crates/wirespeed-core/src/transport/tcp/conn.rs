//! Connections: `Conn` (`isend`/`irecv`/`close`), making one of streams that finished their
//! handshake, and attaching a pending one's streams (`Attacher`). The streams and the state they
//! share are in stream.rs.
use super::reactor::{Entry, Reactor};
use super::request::Request;
use super::stream::{fail_req, ConnInner, Frame, PostedRecv, RecvSide, ReqState, RxState, SendQueue, Stream, TxChunk, TxState, NO_RANK};
use super::{NetConfig, FRAME_LEN, MIN_SPLIT};
use crate::error::{Error, Result};
use mio::unix::SourceFd;
use mio::{Interest, Token};
use std::collections::VecDeque;
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::*};
use std::sync::{Arc, Condvar, Mutex, OnceLock, Weak};

/// A connection to one peer over several streams.
pub struct Conn {
    inner: Arc<ConnInner>,
}

impl Conn {
    /// Name the rank at the other end, for error messages (the collective groups do).
    pub fn set_peer_rank(&self, rank: usize) {
        self.inner.peer_rank.store(rank, Relaxed);
    }

    pub fn peer_addr(&self) -> &str {
        &self.inner.peer_addr
    }

    /// Streams open to the peer: 0 until a pending connection is attached.
    pub fn nstreams(&self) -> usize {
        self.inner.made()
    }

    /// Streams the connection may have (`pending`'s count): `nstreams` once all are attached.
    pub fn capacity(&self) -> usize {
        self.inner.nstreams
    }

    /// Whether any stream is made (always, but for a `pending` connection not yet attached).
    pub fn is_attached(&self) -> bool {
        self.inner.attached()
    }

    /// A handle that attaches the streams of this connection once they are made (by a dial
    /// driven by the reactor, or by the listener), from any thread, without keeping it alive.
    /// It may attach them in several batches, up to the connection's capacity.
    pub fn attacher(&self) -> Attacher {
        Attacher(Arc::downgrade(&self.inner))
    }

    /// Streams this side sends on (`set_active`; all of them until set).
    pub fn active(&self) -> usize {
        self.inner.active.load(Relaxed)
    }

    /// Send on the first `k` streams only (clamped to 1..=nstreams); later sends are cut into
    /// chunks for `k` streams. A stream that is mid-chunk finishes it. For a link that one flow
    /// fills, fewer flows queue less (hosts/probe.rs chooses `k`).
    pub fn set_active(&self, k: usize) {
        self.inner.active.store(k.clamp(1, self.inner.nstreams.max(1)), Relaxed);
    }

    /// Queue `len` bytes at `data` for the peer, tagged `tag`.
    ///
    /// # Safety
    /// `data..data+len` must stay valid and unmodified until the request completes or the
    /// connection is closed (engine threads read it until then).
    pub unsafe fn isend(&self, data: *const u8, len: usize, tag: u64) -> Result<Request> {
        let c = &*self.inner;
        if let Some(e) = c.error() {
            return Err(e);
        }
        let n = c.active.load(Relaxed);
        let per = len.div_ceil(n).clamp(MIN_SPLIT, c.chunk.max(MIN_SPLIT));
        let nchunks = len.div_ceil(per).max(1);
        let req = Arc::new(ReqState { done: AtomicBool::new(false), left: AtomicUsize::new(nchunks), bytes: AtomicUsize::new(len), error: Mutex::new(None) });
        // One message's chunks go out in order on each stream: the sequence number is taken and
        // the chunks queued under one lock.
        let mut next = c.next_send.lock().unwrap();
        let seq = *next;
        *next += 1;
        let mut kick = Vec::with_capacity(nchunks.min(n));
        {
            let mut q = c.sendq.lock().unwrap();
            for i in 0..nchunks {
                let off = i * per;
                let clen = per.min(len - off.min(len));
                let head = Frame { len: clen, seq, tag, total: len as u64, offset: off as u64 }.encode();
                // An empty message may come with a null pointer (NCCL passes one): never make a
                // slice from it. SAFETY: otherwise off <= len inside the caller's buffer (see above).
                let ptr = if clen == 0 { std::ptr::NonNull::<u8>::dangling().as_ptr() as *const u8 } else { unsafe { data.add(off) } };
                q.chunks.push_back(TxChunk { head, ptr, len: clen, sent: 0, req: req.clone() });
            }
            // Idle streams get no socket event: wake as many as there are new chunks, of the
            // active ones. Streams not made yet are not kicked: `attach` makes them (and counts
            // them in `made`) before it takes this lock to pull, so read under the lock, either
            // they are counted or `attach` will find the chunks.
            let made = c.made();
            for (i, idle) in q.idle.iter_mut().enumerate().take(n.min(made)) {
                if kick.len() == nchunks {
                    break;
                }
                if *idle {
                    *idle = false;
                    kick.push(i);
                }
            }
        }
        drop(next);
        // Write what fits now. A blocking lock: the holder is only ever draining to would-block,
        // and a stream that found the queue empty marked itself idle under the queue's lock,
        // so either it saw these chunks or it is in `kick`.
        for s in kick {
            let st = c.stream(s);
            let mut tx = st.tx.lock().unwrap();
            c.flush(st, &mut tx);
        }
        if let Some(e) = c.error() {
            fail_req(&req, &e);
        }
        Ok(Request { st: req, conn: self.inner.clone() })
    }

    /// Post a receive of at most `cap` bytes into `data` for the next message, which must carry
    /// `tag`; the request's result is the message's length.
    ///
    /// # Safety
    /// `data..data+cap` must stay valid, and not be read or written by anyone else, until the
    /// request completes or the connection is closed (engine threads write it until then).
    pub unsafe fn irecv(&self, data: *mut u8, cap: usize, tag: u64) -> Result<Request> {
        let c = &*self.inner;
        if let Some(e) = c.error() {
            return Err(e);
        }
        // `left` counts the capacity plus one until the first chunk tells the real length.
        let req = Arc::new(ReqState { done: AtomicBool::new(false), left: AtomicUsize::new(cap + 1), bytes: AtomicUsize::new(0), error: Mutex::new(None) });
        let parked = {
            let mut rs = c.recv.lock().unwrap();
            let seq = rs.next_post;
            rs.next_post += 1;
            rs.posted.insert(seq, PostedRecv { dst: data, cap, tag, total: None, req: req.clone() });
            std::mem::take(&mut rs.parked)
        };
        // Resume streams that were waiting for a receive: a blocking lock, see isend.
        for s in parked {
            let st = c.stream(s);
            let mut rx = st.rx.lock().unwrap();
            c.read(st, &mut rx);
        }
        if let Some(e) = c.error() {
            fail_req(&req, &e);
        }
        Ok(Request { st: req, conn: self.inner.clone() })
    }

    /// Shut every stream; pending requests fail. When this returns, no engine thread reads or
    /// writes a caller's buffer for this connection any more.
    pub fn close(&self) {
        self.close_telling(None);
    }

    /// `close`, first telling the peer `why` this rank broke its group (an abort frame), where
    /// given: the peer's error then names the cause.
    pub fn close_telling(&self, why: Option<&str>) {
        let c = &*self.inner;
        *c.closing.lock().unwrap() = true;
        if let Some(why) = why {
            c.tell_abort(why);
        }
        c.fail(Error::Broken("the connection was closed".into()));
        for s in c.streams() {
            // Taking each lock once waits out any I/O in progress; `failed` stops later ones.
            let mut tx = s.tx.lock().unwrap();
            c.fail_queue(&mut tx);
            drop(tx);
            drop(s.rx.lock().unwrap());
            c.reactor.forget(s.reactor, s.token, s.sock.as_raw_fd());
        }
        c.notify();
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.close();
    }
}

fn tune_socket(sock: &TcpStream, cfg: &NetConfig) {
    let _ = sock.set_nodelay(true);
    if cfg.sockbuf > 0 {
        let v = cfg.sockbuf as libc::c_int;
        for opt in [libc::SO_SNDBUF, libc::SO_RCVBUF] {
            // SAFETY: a valid socket fd and a pointer to a c_int that outlives the call.
            unsafe {
                libc::setsockopt(sock.as_raw_fd(), libc::SOL_SOCKET, opt, &v as *const _ as *const libc::c_void, std::mem::size_of::<libc::c_int>() as u32);
            }
        }
    }
    if cfg.notsent_lowat > 0 {
        // Best effort: a kernel without it (before 3.12) keeps its default and streams still
        // pull, only with coarser shares.
        let v = cfg.notsent_lowat.min(i32::MAX as usize) as libc::c_int;
        // SAFETY: as above.
        unsafe {
            libc::setsockopt(sock.as_raw_fd(), libc::IPPROTO_TCP, libc::TCP_NOTSENT_LOWAT, &v as *const _ as *const libc::c_void, std::mem::size_of::<libc::c_int>() as u32);
        }
    }
}

/// Make a connection of streams that have finished their handshake.
pub(super) fn make_conn(reactor: &Arc<Reactor>, cfg: &NetConfig, socks: Vec<TcpStream>, peer: SocketAddr) -> Result<Conn> {
    let conn = Conn::pending(reactor, cfg, peer.to_string(), socks.len());
    conn.attacher().attach(socks)?;
    Ok(conn)
}

/// Attaches a pending connection's streams (`Conn::attacher`); holds no reference that keeps
/// the connection alive: a connection dropped meanwhile just closes the streams.
#[derive(Clone)]
pub struct Attacher(Weak<ConnInner>);

impl Attacher {
    /// Give the connection streams past their handshake, all of them or the next batch (up to
    /// its capacity): they are registered with the reactor, and start pulling what is queued and
    /// reading what comes. An error fails the connection.
    pub fn attach(&self, socks: Vec<TcpStream>) -> Result<()> {
        let Some(c) = self.0.upgrade() else { return Ok(()) };
        let r = attach(&c, socks);
        if let Err(e) = &r {
            c.fail(e.clone());
        }
        r
    }

    /// `n` more streams are on their way (a dial of the rest of a pair's streams, made or
    /// accepted): until `arrived(n)` the connection is not judged lost by its streams' closes.
    pub fn expect(&self, n: usize) {
        if let Some(c) = self.0.upgrade() {
            c.coming.fetch_add(n, AcqRel);
        }
    }

    /// The `n` streams of an `expect` are attached, or will not come (their dial failed).
    pub fn arrived(&self, n: usize) {
        if let Some(c) = self.0.upgrade() {
            let _ = c.coming.fetch_update(AcqRel, Acquire, |v| Some(v.saturating_sub(n)));
            c.check_closed();
        }
    }

    /// Fail the connection (a dial that could not be made): its requests get `e`.
    pub fn fail(&self, e: Error) {
        if let Some(c) = self.0.upgrade() {
            c.fail(e);
        }
    }
}

impl Conn {
    /// A connection to `peer` (its address, for errors) of up to `nstreams` streams, made later
    /// (`Attacher::attach`, in one or more batches). Sends and receives may be posted at once:
    /// they wait, and move when the first streams come.
    pub fn pending(reactor: &Arc<Reactor>, cfg: &NetConfig, peer: String, nstreams: usize) -> Conn {
        let inner = Arc::new(ConnInner {
            slots: (0..nstreams).map(|_| OnceLock::new()).collect(),
            made: AtomicUsize::new(0),
            coming: AtomicUsize::new(0),
            nstreams,
            cfg: *cfg,
            closing: Mutex::new(false),
            active: AtomicUsize::new(nstreams),
            chunk: cfg.chunk,
            spin: cfg.spin,
            next_send: Mutex::new(0),
            recv: Mutex::new(RecvSide::default()),
            error: Mutex::new(None),
            failed: AtomicBool::new(false),
            closed_streams: AtomicUsize::new(0),
            peer_rank: AtomicUsize::new(NO_RANK),
            peer_addr: peer,
            sendq: Mutex::new(SendQueue { chunks: VecDeque::new(), idle: vec![true; nstreams] }),
            wake_lock: Mutex::new(()),
            wake: Condvar::new(),
            sleepers: AtomicUsize::new(0),
            reactor: reactor.clone(),
        });
        Conn { inner }
    }
}

fn attach(c: &Arc<ConnInner>, socks: Vec<TcpStream>) -> Result<()> {
    // Held throughout: `close` either runs before (and the streams are shut here) or waits and
    // finds them registered, to forget; and two batches never take the same slots.
    let closing = c.closing.lock().unwrap();
    let first = c.made();
    // A connection closed, or failed (a timeout, the group broken, a batch that could not be
    // registered), shuts what comes.
    let dead = *closing || c.failed.load(Acquire);
    if dead || first + socks.len() > c.nstreams || socks.is_empty() {
        for s in &socks {
            let _ = s.shutdown(Shutdown::Both);
        }
        return if dead {
            Ok(())
        } else {
            Err(Error::Stranger(format!("{} came with {} streams where {} of {} remained", c.peer_name(), socks.len(), c.nstreams - first, c.nstreams)))
        };
    }
    for s in &socks {
        tune_socket(s, &c.cfg);
        s.set_nonblocking(true).map_err(|_| Error::os("fcntl"))?;
    }
    // Until `made` counts them, a close read on one of them (or on an older stream) must not
    // judge the connection by the old count.
    let n = socks.len();
    c.coming.fetch_add(n, AcqRel);
    let reactor = &c.reactor;
    let streams: Vec<Arc<Stream>> = socks
        .into_iter()
        .zip(first..)
        .map(|(sock, idx)| {
            Arc::new(Stream {
                sock,
                idx,
                conn: Arc::downgrade(c),
                tx: Mutex::new(TxState::default()),
                rx: Mutex::new(RxState::Head { buf: [0; FRAME_LEN], have: 0 }),
                token: reactor.next_token.fetch_add(1, Relaxed),
                reactor: reactor.pick(),
            })
        })
        .collect();
    // In their slots before the reactor can see them: a stream that parks names its slot, which
    // a receive posted meanwhile resumes (`Conn::stream`).
    for s in &streams {
        if c.slots[s.idx].set(s.clone()).is_err() {
            unreachable!("slots past `made` are filled once, under `closing`, by a live connection");
        }
    }
    let mut regs = Vec::new();
    for s in &streams {
        let t = &reactor.threads[s.reactor];
        t.entries.lock().unwrap().insert(s.token, Entry::Watched(Arc::downgrade(s) as Weak<Stream>));
        let fd = s.sock.as_raw_fd();
        if let Err(e) = t.registry.register(&mut SourceFd(&fd), Token(s.token), Interest::READABLE | Interest::WRITABLE) {
            t.entries.lock().unwrap().remove(&s.token);
            for &(th, tok, fd) in &regs {
                reactor.forget(th, tok, fd);
            }
            // The caller (`Attacher::attach`) fails the connection, which shuts every stream in a
            // slot, these too: they are never used.
            return Err(Error::Unsupported(format!("cannot register a socket with epoll: {e}")));
        }
        regs.push((s.reactor, s.token, fd));
    }
    c.made.store(first + streams.len(), Release);
    c.coming.fetch_sub(n, AcqRel);
    drop(closing);
    // A connection that failed meanwhile shuts what came (`fail` may have run before the slots
    // were set).
    if c.failed.load(Acquire) {
        for s in &streams {
            let _ = s.sock.shutdown(Shutdown::Both);
        }
    }
    // What was posted before these streams came: each pulls from the queue (new streams are
    // idle), and bytes that arrived before registration (edge-triggered: no event for them) are
    // read.
    for s in &streams {
        let mut tx = s.tx.lock().unwrap();
        c.flush(s, &mut tx);
        drop(tx);
        let mut rx = s.rx.lock().unwrap();
        c.read(s, &mut rx);
    }
    // A close read while this batch was being attached was not judged then.
    c.check_closed();
    c.notify();
    Ok(())
}
