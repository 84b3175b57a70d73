//! Streams and connections: framing, the send queue the streams pull from, reading into posted
//! receives, `isend`/`irecv`/`close`, and making a `Conn` of streams that finished their handshake.
use super::reactor::{Entry, Reactor, Ready};
use super::request::{ReqState, Request};
use super::{NetConfig, FRAME_LEN, FRAME_MAGIC, MIN_SPLIT};
use crate::error::{Error, Result};
use mio::unix::SourceFd;
use mio::{Interest, Token};
use std::collections::{HashMap, VecDeque};
use std::io::{IoSlice, Read};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::*};
use std::sync::{Arc, Condvar, Mutex, OnceLock, Weak};
use std::time::Duration;

struct TxChunk {
    head: [u8; FRAME_LEN],
    ptr: *const u8,
    len: usize,
    /// Bytes of header + body already written.
    sent: usize,
    req: Arc<ReqState>,
}

// SAFETY: `ptr` points into a caller's buffer that `isend`'s contract keeps alive and unmodified
// until the request completes; only the thread holding the stream's lock reads through it.
unsafe impl Send for TxChunk {}

/// A stream's send side: the chunk it is writing, if any.
#[derive(Default)]
pub(super) struct TxState {
    cur: Option<TxChunk>,
}

/// The connection's chunks waiting for a stream, and which streams wait for a chunk.
struct SendQueue {
    chunks: VecDeque<TxChunk>,
    /// `idle[i]`: stream i has no chunk and found this queue empty. No socket event will come for
    /// it (it is not blocked on a full socket), so whoever queues a chunk must kick it.
    idle: Vec<bool>,
}

#[derive(Clone, Copy)]
pub(super) struct Frame {
    len: usize,
    seq: u64,
    tag: u64,
    total: u64,
    offset: u64,
}

impl Frame {
    fn encode(&self) -> [u8; FRAME_LEN] {
        let mut b = [0u8; FRAME_LEN];
        b[0..4].copy_from_slice(&FRAME_MAGIC.to_le_bytes());
        b[4..8].copy_from_slice(&(self.len as u32).to_le_bytes());
        b[8..16].copy_from_slice(&self.seq.to_le_bytes());
        b[16..24].copy_from_slice(&self.tag.to_le_bytes());
        b[24..32].copy_from_slice(&self.total.to_le_bytes());
        b[32..40].copy_from_slice(&self.offset.to_le_bytes());
        b
    }
    fn decode(b: &[u8; FRAME_LEN]) -> Option<Frame> {
        if u32::from_le_bytes(b[0..4].try_into().unwrap()) != FRAME_MAGIC {
            return None;
        }
        let q = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
        Some(Frame { len: u32::from_le_bytes(b[4..8].try_into().unwrap()) as usize, seq: q(8), tag: q(16), total: q(24), offset: q(32) })
    }
}

pub(super) enum RxState {
    Head { buf: [u8; FRAME_LEN], have: usize },
    Body { dst: *mut u8, left: usize, seq: u64 },
    /// A header for message `seq` arrived before its receive was posted.
    Parked(Frame),
    /// The peer closed this stream between frames.
    Closed,
}

// SAFETY: `dst` points into a posted receive buffer that `irecv`'s contract keeps alive until the
// request completes; only the thread holding the stream's lock writes through it.
unsafe impl Send for RxState {}

/// A socket event: write what the stream has to send, then read what came.
impl Ready for Stream {
    fn ready(self: Arc<Self>, readable: bool, writable: bool) {
        let Some(c) = self.conn.upgrade() else { return };
        if writable {
            let mut tx = self.tx.lock().unwrap();
            c.flush(&self, &mut tx);
        }
        if readable {
            let mut rx = self.rx.lock().unwrap();
            c.read(&self, &mut rx);
        }
    }
}

pub(super) struct Stream {
    sock: TcpStream,
    idx: usize,
    pub(super) conn: Weak<ConnInner>,
    pub(super) tx: Mutex<TxState>,
    pub(super) rx: Mutex<RxState>,
    token: usize,
    reactor: usize,
}

struct PostedRecv {
    dst: *mut u8,
    cap: usize,
    tag: u64,
    /// Message length once a chunk has told it.
    total: Option<u64>,
    req: Arc<ReqState>,
}

// SAFETY: as for RxState::Body.
unsafe impl Send for PostedRecv {}

#[derive(Default)]
struct RecvSide {
    next_post: u64,
    posted: HashMap<u64, PostedRecv>,
    /// Streams parked on a header whose receive was not posted when it arrived.
    parked: Vec<usize>,
}

pub(super) struct ConnInner {
    /// The streams, once they are made: at once for a `Conn` made of a finished handshake, on
    /// first use for one made `pending` (a group's lazy connections, docs/transport.md). Until
    /// then sends wait in `sendq` and receives in `recv`, as they would for a stream that is busy.
    streams: OnceLock<Vec<Arc<Stream>>>,
    /// How many streams the connection has, or will have once attached.
    nstreams: usize,
    cfg: NetConfig,
    /// Set by `close`: streams attached later are shut at once (`attach` and `close` take it).
    closing: Mutex<bool>,
    /// Streams this side sends on: the first `active` of them pull chunks, the others stay idle
    /// (set_active). The receiver reads every stream whatever this is, and a chunk's frame says
    /// where it goes, so the sender alone chooses and the peer need not agree. Kept apart from
    /// the streams, so a pending connection keeps a count chosen before it is attached.
    active: AtomicUsize,
    chunk: usize,
    pub(super) spin: Duration,
    next_send: Mutex<u64>,
    recv: Mutex<RecvSide>,
    error: Mutex<Option<Error>>,
    failed: AtomicBool,
    /// Streams the peer closed between frames. A peer that is done closes all of them, and the
    /// FIN on one stream can overtake data still arriving on another: only when every stream
    /// is closed (or one closes mid-frame) is the connection lost.
    closed_streams: AtomicUsize,
    /// Who is at the other end, for errors: a rank when the owner set one, else the address.
    peer_rank: AtomicUsize,
    peer_addr: String,
    sendq: Mutex<SendQueue>,
    pub(super) wake_lock: Mutex<()>,
    pub(super) wake: Condvar,
    pub(super) sleepers: AtomicUsize,
    reactor: Arc<Reactor>,
}

const NO_RANK: usize = usize::MAX;

/// A connection to one peer over several streams.
pub struct Conn {
    inner: Arc<ConnInner>,
}

/// Write as much of `bufs` as the socket takes now, without SIGPIPE (NCCL's processes and test
/// drivers need not ignore it).
pub(super) fn send_vectored(fd: i32, bufs: &[IoSlice]) -> std::io::Result<usize> {
    loop {
        // SAFETY: msghdr points at `bufs`, which outlive the call; IoSlice is ABI-compatible with iovec.
        let n = unsafe {
            let mut m: libc::msghdr = std::mem::zeroed();
            m.msg_iov = bufs.as_ptr() as *mut libc::iovec;
            m.msg_iovlen = bufs.len() as _;
            libc::sendmsg(fd, &m, libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT)
        };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

pub(super) fn would_block(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::WouldBlock
}

/// Complete `r` with error `e`, unless it already completed.
fn fail_req(r: &ReqState, e: &Error) {
    if !r.done.load(Acquire) {
        *r.error.lock().unwrap() = Some(e.clone());
        r.done.store(true, SeqCst);
    }
}

impl ConnInner {
    pub(super) fn peer_name(&self) -> String {
        match self.peer_rank.load(Relaxed) {
            NO_RANK => self.peer_addr.clone(),
            r => format!("rank {r} ({})", self.peer_addr),
        }
    }

    fn lost(&self, why: String) -> Error {
        match self.peer_rank.load(Relaxed) {
            NO_RANK => Error::PeerLost(format!("the connection to {} {why}", self.peer_addr)),
            r => Error::PeerAborted { rank: r, reason: format!("its connection {why}: it exited or gave up") },
        }
    }

    pub(super) fn attached(&self) -> bool {
        self.streams.get().is_some()
    }

    /// The streams made so far: none before a pending connection is attached.
    fn streams(&self) -> &[Arc<Stream>] {
        self.streams.get().map_or(&[], |v| v.as_slice())
    }

    fn notify(&self) {
        if self.sleepers.load(SeqCst) > 0 {
            let _g = self.wake_lock.lock().unwrap();
            self.wake.notify_all();
        }
    }

    fn complete(&self, req: &ReqState, bytes: usize) {
        req.bytes.store(bytes, Release);
        req.done.store(true, SeqCst);
        self.notify();
    }

    /// Fail the connection: every pending request gets `e`; later posts fail at once.
    fn fail(&self, e: Error) {
        {
            let mut g = self.error.lock().unwrap();
            if g.is_some() {
                return;
            }
            *g = Some(e.clone());
        }
        self.failed.store(true, SeqCst);
        for p in self.recv.lock().unwrap().posted.values() {
            fail_req(&p.req, &e);
        }
        for s in self.streams() {
            let _ = s.sock.shutdown(Shutdown::Both);
            // try_lock: the holder is mid-I/O on this very stream and will see the shut socket.
            if let Ok(tx) = s.tx.try_lock() {
                tx.cur.iter().for_each(|c| fail_req(&c.req, &e));
            }
        }
        self.sendq.lock().unwrap().chunks.drain(..).for_each(|c| fail_req(&c.req, &e));
        self.notify();
    }

    fn error(&self) -> Option<Error> {
        self.error.lock().unwrap().clone()
    }

    /// Move bytes on every stream whose lock is free (a caller's opportunistic progress).
    pub(super) fn progress(&self) {
        if self.failed.load(Acquire) {
            // Fail what `fail` could not reach (queues whose lock was held at the time).
            for s in self.streams() {
                if let Ok(mut tx) = s.tx.try_lock() {
                    if tx.cur.is_some() {
                        self.fail_queue(&mut tx);
                    }
                }
            }
            return;
        }
        for s in self.streams() {
            if let Ok(mut tx) = s.tx.try_lock() {
                if tx.cur.is_some() {
                    self.flush(s, &mut tx);
                }
            }
            if let Ok(mut rx) = s.rx.try_lock() {
                self.read(s, &mut rx);
            }
        }
    }

    /// Fail the stream's chunk and every queued one with the connection's error (the caller holds
    /// the stream's lock: `fail` could not take it, so this chunk is failed by whoever holds it next).
    fn fail_queue(&self, tx: &mut TxState) {
        let e = self.error().unwrap_or_else(|| Error::Broken("the connection failed".into()));
        for c in tx.cur.take().into_iter().chain(self.sendq.lock().unwrap().chunks.drain(..)) {
            fail_req(&c.req, &e);
        }
        self.notify();
    }

    /// Write the stream's chunk, then pull the next from the connection's queue, until the queue
    /// is empty (the stream is then marked idle) or the socket would block (an event follows).
    pub(super) fn flush(&self, s: &Stream, tx: &mut TxState) {
        loop {
            if self.failed.load(Acquire) {
                return self.fail_queue(tx);
            }
            if tx.cur.is_none() {
                let mut q = self.sendq.lock().unwrap();
                // A stream beyond the active count takes no new chunk; it stays marked idle so
                // that isend kicks it if the count grows again.
                if s.idx >= self.active.load(Relaxed) {
                    q.idle[s.idx] = true;
                    return;
                }
                match q.chunks.pop_front() {
                    Some(c) => {
                        q.idle[s.idx] = false;
                        tx.cur = Some(c);
                    }
                    None => {
                        q.idle[s.idx] = true;
                        return;
                    }
                }
            }
            let c = tx.cur.as_mut().unwrap();
            let r = if c.sent < FRAME_LEN {
                // SAFETY: see TxChunk; `len` bytes at `ptr` are the caller's live buffer.
                let body = unsafe { std::slice::from_raw_parts(c.ptr, c.len) };
                send_vectored(s.sock.as_raw_fd(), &[IoSlice::new(&c.head[c.sent..]), IoSlice::new(body)])
            } else {
                let off = c.sent - FRAME_LEN;
                // SAFETY: as above; off < len while the chunk is queued.
                let body = unsafe { std::slice::from_raw_parts(c.ptr.add(off), c.len - off) };
                send_vectored(s.sock.as_raw_fd(), &[IoSlice::new(body)])
            };
            match r {
                Ok(n) => {
                    c.sent += n;
                    if c.sent == FRAME_LEN + c.len {
                        let c = tx.cur.take().unwrap();
                        if c.req.left.fetch_sub(1, AcqRel) == 1 {
                            let total = c.req.bytes.load(Relaxed);
                            self.complete(&c.req, total);
                        }
                    }
                }
                Err(e) if would_block(&e) => return,
                Err(e) => {
                    self.fail(self.lost(format!("failed while sending ({e})")));
                    return self.fail_queue(tx);
                }
            }
        }
    }

    /// Read from a stream until it would block, parks, or fails.
    pub(super) fn read(&self, s: &Stream, rx: &mut RxState) {
        loop {
            if self.failed.load(Acquire) {
                return;
            }
            match rx {
                RxState::Closed => return,
                RxState::Parked(f) => {
                    let f = *f;
                    match self.accept_frame(s, f) {
                        Ok(Some(next)) => *rx = next,
                        Ok(None) => return,
                        Err(e) => return self.fail(e),
                    }
                }
                RxState::Head { buf, have } => match (&s.sock).read(&mut buf[*have..]) {
                    Ok(0) if *have == 0 => {
                        *rx = RxState::Closed;
                        if self.closed_streams.fetch_add(1, AcqRel) + 1 == self.nstreams {
                            return self.fail(self.lost("was closed".into()));
                        }
                        return;
                    }
                    Ok(0) => return self.fail(self.lost("was closed in the middle of a frame".into())),
                    Ok(n) => {
                        *have += n;
                        if *have == FRAME_LEN {
                            let Some(f) = Frame::decode(buf) else {
                                return self.fail(Error::Stranger(format!("{} sent a malformed frame", self.peer_name())));
                            };
                            *rx = RxState::Parked(f);
                        }
                    }
                    Err(e) if would_block(&e) => return,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => return self.fail(self.lost(format!("failed while receiving ({e})"))),
                },
                RxState::Body { dst, left, seq } => {
                    // SAFETY: see RxState; `left` bytes at `dst` lie inside the posted buffer
                    // (checked against its capacity when the header was accepted).
                    let buf = unsafe { std::slice::from_raw_parts_mut(*dst, *left) };
                    match (&s.sock).read(buf) {
                        Ok(0) => return self.fail(self.lost("was closed in the middle of a message".into())),
                        Ok(n) => {
                            // SAFETY: n <= left, still inside the buffer.
                            *dst = unsafe { dst.add(n) };
                            *left -= n;
                            let seq = *seq;
                            if *left == 0 {
                                *rx = RxState::Head { buf: [0; FRAME_LEN], have: 0 };
                            }
                            self.received(seq, n);
                        }
                        Err(e) if would_block(&e) => return,
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                        Err(e) => return self.fail(self.lost(format!("failed while receiving ({e})"))),
                    }
                }
            }
        }
    }

    /// A header arrived (or a parked one is retried): `Some(next state)` if its receive is
    /// posted, `None` to park, an error for a frame that does not fit what was posted.
    fn accept_frame(&self, s: &Stream, f: Frame) -> Result<Option<RxState>> {
        let mut rs = self.recv.lock().unwrap();
        let Some(p) = rs.posted.get_mut(&f.seq) else {
            if f.seq < rs.next_post {
                return Err(Error::Stranger(format!("{} sent a chunk of message {} that is already complete", self.peer_name(), f.seq)));
            }
            if !rs.parked.contains(&s.idx) {
                rs.parked.push(s.idx);
            }
            return Ok(None);
        };
        if f.tag != p.tag {
            return Err(Error::Mismatch(format!(
                "{} sent a message with tag {:#x} where tag {:#x} was expected (another collective or tag)",
                self.peer_name(), f.tag, p.tag
            )));
        }
        if f.total > p.cap as u64 {
            return Err(Error::Mismatch(format!(
                "{} sent {} bytes where a buffer of {} bytes was posted",
                self.peer_name(), f.total, p.cap
            )));
        }
        if f.offset + f.len as u64 > f.total || p.total.is_some_and(|t| t != f.total) {
            return Err(Error::Stranger(format!("{} sent an inconsistent frame", self.peer_name())));
        }
        if p.total.is_none() {
            p.total = Some(f.total);
            // `left` counted the capacity plus one until the real length was known.
            let excess = p.cap + 1 - f.total as usize;
            p.req.bytes.store(f.total as usize, Relaxed);
            if p.req.left.fetch_sub(excess, AcqRel) == excess {
                let p = rs.posted.remove(&f.seq).unwrap();
                drop(rs);
                self.complete(&p.req, f.total as usize);
                return Ok(Some(RxState::Head { buf: [0; FRAME_LEN], have: 0 }));
            }
        }
        if f.len == 0 {
            return Ok(Some(RxState::Head { buf: [0; FRAME_LEN], have: 0 }));
        }
        // SAFETY: offset + len <= total <= cap: inside the posted buffer.
        let dst = unsafe { p.dst.add(f.offset as usize) };
        Ok(Some(RxState::Body { dst, left: f.len, seq: f.seq }))
    }

    fn received(&self, seq: u64, n: usize) {
        let mut rs = self.recv.lock().unwrap();
        let Some(p) = rs.posted.get(&seq) else { return };
        if p.req.left.fetch_sub(n, AcqRel) == n {
            let p = rs.posted.remove(&seq).unwrap();
            drop(rs);
            let total = p.total.unwrap_or(0) as usize;
            self.complete(&p.req, total);
        }
    }
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
        self.inner.streams().len()
    }

    /// Whether the streams are made (always, but for a `pending` connection not yet attached).
    pub fn is_attached(&self) -> bool {
        self.inner.attached()
    }

    /// A handle that attaches the streams of this connection once they are made (by a dial
    /// driven by the reactor, or by the listener), from any thread, without keeping it alive.
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
    // SAFETY: unsafe to call: `isend` relies on its callers for this (`# Safety` above): `data..data+len` must stay valid and unmodified until the request completes or the connection is closed (engine threads read it until then).
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
            // active ones. Streams not made yet are not kicked: `attach` makes them (before it
            // takes this lock to pull), so checked under the lock, either they are here or
            // `attach` will find the chunks.
            let attached = c.attached();
            for (i, idle) in q.idle.iter_mut().enumerate().take(n).filter(|_| attached) {
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
            let st = &c.streams()[s];
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
    // SAFETY: unsafe to call: `irecv` relies on its callers for this (`# Safety` above): `data..data+cap` must stay valid, and not be read or written by anyone else, until the request completes or the connection is closed (engine threads ...
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
            let st = &c.streams()[s];
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
        let c = &*self.inner;
        *c.closing.lock().unwrap() = true;
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
    /// Give the connection its streams, all past their handshake: they are registered with the
    /// reactor, and what was posted meanwhile starts moving. An error fails the connection.
    pub fn attach(&self, socks: Vec<TcpStream>) -> Result<()> {
        let Some(c) = self.0.upgrade() else { return Ok(()) };
        let r = attach(&c, socks);
        if let Err(e) = &r {
            c.fail(e.clone());
        }
        r
    }

    /// Fail the connection (a dial that could not be made): its requests get `e`.
    pub fn fail(&self, e: Error) {
        if let Some(c) = self.0.upgrade() {
            c.fail(e);
        }
    }
}

impl Conn {
    /// A connection to `peer` (its address, for errors) whose `nstreams` streams are made later
    /// (`Attacher::attach`). Sends and receives may be posted at once: they wait, and move when
    /// the streams come.
    pub fn pending(reactor: &Arc<Reactor>, cfg: &NetConfig, peer: String, nstreams: usize) -> Conn {
        let inner = Arc::new(ConnInner {
            streams: OnceLock::new(),
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
    if socks.len() != c.nstreams {
        return Err(Error::Stranger(format!("{} came with {} streams where {} were expected", c.peer_name(), socks.len(), c.nstreams)));
    }
    // Held throughout: `close` either runs before (and the streams are shut here) or waits and
    // finds them registered, to forget.
    let closing = c.closing.lock().unwrap();
    if *closing || c.attached() {
        for s in &socks {
            let _ = s.shutdown(Shutdown::Both);
        }
        return if *closing { Ok(()) } else { Err(Error::Stranger(format!("{} connected twice", c.peer_name()))) };
    }
    for s in &socks {
        tune_socket(s, &c.cfg);
        s.set_nonblocking(true).map_err(|_| Error::os("fcntl"))?;
    }
    let reactor = &c.reactor;
    let streams: Vec<Arc<Stream>> = socks
        .into_iter()
        .enumerate()
        .map(|(idx, sock)| {
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
            return Err(Error::Unsupported(format!("cannot register a socket with epoll: {e}")));
        }
        regs.push((s.reactor, s.token, fd));
    }
    if c.streams.set(streams).is_err() {
        unreachable!("set once, under `closing`");
    }
    drop(closing);
    // A connection that failed while pending (a timeout, the group broken) shuts what came.
    if c.failed.load(Acquire) {
        for s in c.streams() {
            let _ = s.sock.shutdown(Shutdown::Both);
        }
    }
    // What was posted before the streams came: every stream pulls from the queue (all are idle),
    // and bytes that arrived before registration (edge-triggered: no event for them) are read.
    for s in c.streams() {
        let mut tx = s.tx.lock().unwrap();
        c.flush(s, &mut tx);
        drop(tx);
        let mut rx = s.rx.lock().unwrap();
        c.read(s, &mut rx);
    }
    c.notify();
    Ok(())
}
