//! The streams of a connection and the state they share (`ConnInner`): framing, the send queue
//! the streams pull from, a stream's writes (`flush`) and its reads into posted receives (`read`,
//! `accept_frame`), and completing or failing requests. conn.rs makes connections of them and
//! posts into them.
use super::reactor::{Reactor, Ready};
use super::{NetConfig, ABORT_MAGIC, ABORT_MAX, FRAME_LEN, FRAME_MAGIC};
use crate::error::{Error, Result};
use std::collections::{HashMap, VecDeque};
use std::io::{IoSlice, Read};
use std::net::{Shutdown, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::*};
use std::sync::{Arc, Condvar, Mutex, OnceLock, Weak};
use std::time::Duration;

/// A posted send or receive. Complete when `done`; its outcome is `bytes` or `error`.
pub(super) struct ReqState {
    pub(super) done: AtomicBool,
    /// Chunks (send) or bytes (receive) still to move.
    pub(super) left: AtomicUsize,
    pub(super) bytes: AtomicUsize,
    pub(super) error: Mutex<Option<Error>>,
}

pub(super) struct TxChunk {
    pub(super) head: [u8; FRAME_LEN],
    pub(super) ptr: *const u8,
    pub(super) len: usize,
    /// Bytes of header + body already written.
    pub(super) sent: usize,
    pub(super) req: Arc<ReqState>,
}

// SAFETY: `ptr` points into a caller's buffer that `isend`'s contract keeps alive and unmodified
// until the request completes; only the thread holding the stream's lock reads through it.
unsafe impl Send for TxChunk {}

/// A stream's send side: the chunk it is writing, if any.
#[derive(Default)]
pub(super) struct TxState {
    pub(super) cur: Option<TxChunk>,
}

/// The connection's chunks waiting for a stream, and which streams wait for a chunk.
pub(super) struct SendQueue {
    pub(super) chunks: VecDeque<TxChunk>,
    /// `idle[i]`: stream i has no chunk and found this queue empty. No socket event will come for
    /// it (it is not blocked on a full socket), so whoever queues a chunk must kick it.
    pub(super) idle: Vec<bool>,
}

#[derive(Clone, Copy)]
pub(super) struct Frame {
    pub(super) len: usize,
    pub(super) seq: u64,
    pub(super) tag: u64,
    pub(super) total: u64,
    pub(super) offset: u64,
}

impl Frame {
    pub(super) fn encode(&self) -> [u8; FRAME_LEN] {
        let mut b = [0u8; FRAME_LEN];
        b[0..4].copy_from_slice(&FRAME_MAGIC.to_le_bytes());
        b[4..8].copy_from_slice(&(self.len as u32).to_le_bytes());
        b[8..16].copy_from_slice(&self.seq.to_le_bytes());
        b[16..24].copy_from_slice(&self.tag.to_le_bytes());
        b[24..32].copy_from_slice(&self.total.to_le_bytes());
        b[32..40].copy_from_slice(&self.offset.to_le_bytes());
        b
    }
    pub(super) fn decode(b: &[u8; FRAME_LEN]) -> Option<Frame> {
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
    /// An abort frame's reason, `want` bytes, arriving.
    Reason { buf: Vec<u8>, want: usize },
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
    pub(super) sock: TcpStream,
    pub(super) idx: usize,
    pub(super) conn: Weak<ConnInner>,
    pub(super) tx: Mutex<TxState>,
    pub(super) rx: Mutex<RxState>,
    pub(super) token: usize,
    pub(super) reactor: usize,
}

pub(super) struct PostedRecv {
    pub(super) dst: *mut u8,
    pub(super) cap: usize,
    pub(super) tag: u64,
    /// Message length once a chunk has told it.
    pub(super) total: Option<u64>,
    pub(super) req: Arc<ReqState>,
}

// SAFETY: as for RxState::Body.
unsafe impl Send for PostedRecv {}

#[derive(Default)]
pub(super) struct RecvSide {
    pub(super) next_post: u64,
    pub(super) posted: HashMap<u64, PostedRecv>,
    /// Streams parked on a header whose receive was not posted when it arrived.
    pub(super) parked: Vec<usize>,
}

pub(super) struct ConnInner {
    /// The streams, slot i holding stream i once it is made: all at once for a `Conn` made of a
    /// finished handshake; for one made `pending` (a group's lazy connections, docs/transport.md)
    /// on first use, in one or more batches (`attach`: a group opens one stream first and the
    /// rest when the pair's traffic needs them). Until the first comes, sends wait in `sendq` and
    /// receives in `recv`, as they would for a stream that is busy.
    pub(super) slots: Box<[OnceLock<Arc<Stream>>]>,
    /// Slots filled, a prefix of `slots`: stored (Release) after the batch's slots are set.
    pub(super) made: AtomicUsize,
    /// Streams on their way that this connection must not be judged without: a batch being
    /// attached, and the batches its owner said are coming (`Attacher::expect`). Until they are
    /// in, the peer may hold streams this side has not made yet, whose data a close on the made
    /// ones can overtake: the connection is not lost by closes while this is above 0.
    pub(super) coming: AtomicUsize,
    /// How many streams the connection may have: the slots.
    pub(super) nstreams: usize,
    pub(super) cfg: NetConfig,
    /// Set by `close`: streams attached later are shut at once (`attach` and `close` take it).
    pub(super) closing: Mutex<bool>,
    /// Streams this side sends on: the first `active` of them pull chunks, the others stay idle
    /// (set_active). The receiver reads every stream whatever this is, and a chunk's frame says
    /// where it goes, so the sender alone chooses and the peer need not agree. Kept apart from
    /// the streams, so a pending connection keeps a count chosen before it is attached.
    pub(super) active: AtomicUsize,
    pub(super) chunk: usize,
    pub(super) spin: Duration,
    pub(super) next_send: Mutex<u64>,
    pub(super) recv: Mutex<RecvSide>,
    pub(super) error: Mutex<Option<Error>>,
    pub(super) failed: AtomicBool,
    /// Streams the peer closed between frames. A peer that is done closes all of them, and the
    /// FIN on one stream can overtake data still arriving on another: only when every stream
    /// is closed (or one closes mid-frame) is the connection lost.
    pub(super) closed_streams: AtomicUsize,
    /// Who is at the other end, for errors: a rank when the owner set one, else the address.
    pub(super) peer_rank: AtomicUsize,
    pub(super) peer_addr: String,
    pub(super) sendq: Mutex<SendQueue>,
    pub(super) wake_lock: Mutex<()>,
    pub(super) wake: Condvar,
    pub(super) sleepers: AtomicUsize,
    pub(super) reactor: Arc<Reactor>,
}

pub(super) const NO_RANK: usize = usize::MAX;

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
pub(super) fn fail_req(r: &ReqState, e: &Error) {
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

    pub(super) fn lost(&self, why: String) -> Error {
        match self.peer_rank.load(Relaxed) {
            NO_RANK => Error::PeerLost(format!("the connection to {} {why}", self.peer_addr)),
            r => Error::PeerAborted { rank: r, reason: format!("its connection {why}: it exited or gave up") },
        }
    }

    pub(super) fn attached(&self) -> bool {
        self.made() > 0
    }

    /// Streams made so far.
    pub(super) fn made(&self) -> usize {
        self.made.load(Acquire)
    }

    /// Every stream in a slot, in slot order: those made, and a batch being attached (which
    /// `fail` and `close` must reach too: its streams may be registered already).
    pub(super) fn streams(&self) -> impl Iterator<Item = &Arc<Stream>> {
        self.slots.iter().map_while(|s| s.get())
    }

    /// Lost when every stream made is closed and none is coming (`coming`).
    pub(super) fn check_closed(&self) {
        let closed = self.closed_streams.load(Acquire);
        if self.coming.load(Acquire) == 0 && closed > 0 && closed >= self.made() {
            self.fail(self.lost("was closed".into()));
        }
    }

    /// Stream `i`, which is made (`i < made()`).
    pub(super) fn stream(&self, i: usize) -> &Arc<Stream> {
        self.slots[i].get().expect("a stream that is made")
    }

    pub(super) fn notify(&self) {
        if self.sleepers.load(SeqCst) > 0 {
            let _g = self.wake_lock.lock().unwrap();
            self.wake.notify_all();
        }
    }

    pub(super) fn complete(&self, req: &ReqState, bytes: usize) {
        req.bytes.store(bytes, Release);
        req.done.store(true, SeqCst);
        self.notify();
    }

    /// Fail the connection: every pending request gets `e`; later posts fail at once.
    pub(super) fn fail(&self, e: Error) {
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

    /// Before a close that breaks this rank's group: why, as an abort frame on every stream that
    /// is between frames, so the peer's error names the cause rather than a closed connection.
    /// Best effort: written without waiting (a few bytes into a send buffer that a live peer
    /// drains), skipped on a stream mid-frame or mid-I/O; the peer that misses it sees the close.
    pub(super) fn tell_abort(&self, why: &str) {
        if self.failed.load(Acquire) {
            return;
        }
        let mut why = why.as_bytes();
        if why.len() > ABORT_MAX {
            why = &why[..ABORT_MAX];
        }
        let mut head = [0u8; FRAME_LEN];
        head[0..4].copy_from_slice(&ABORT_MAGIC.to_le_bytes());
        head[4..8].copy_from_slice(&(why.len() as u32).to_le_bytes());
        for s in self.streams() {
            let Ok(tx) = s.tx.try_lock() else { continue };
            if tx.cur.as_ref().is_some_and(|c| c.sent > 0) {
                continue; // mid-frame: the reason's bytes would read as the frame's
            }
            let _ = send_vectored(s.sock.as_raw_fd(), &[IoSlice::new(&head), IoSlice::new(why)]);
        }
    }

    /// The error of a peer's abort frame.
    fn aborted(&self, why: &[u8]) -> Error {
        let why = String::from_utf8_lossy(why).into_owned();
        match self.peer_rank.load(Relaxed) {
            NO_RANK => Error::PeerLost(format!("the connection to {} was closed by its peer: {why}", self.peer_addr)),
            r => Error::PeerAborted { rank: r, reason: why },
        }
    }

    pub(super) fn error(&self) -> Option<Error> {
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
    pub(super) fn fail_queue(&self, tx: &mut TxState) {
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
                RxState::Reason { buf, want } => {
                    let have = buf.len();
                    buf.resize(*want, 0);
                    match (&s.sock).read(&mut buf[have..]) {
                        Ok(0) => {
                            buf.truncate(have);
                            return self.fail(self.aborted(buf)); // cut short: what came
                        }
                        Ok(n) => {
                            buf.truncate(have + n);
                            if buf.len() == *want {
                                return self.fail(self.aborted(buf));
                            }
                        }
                        Err(e) => {
                            buf.truncate(have);
                            if would_block(&e) {
                                return;
                            }
                            if e.kind() != std::io::ErrorKind::Interrupted {
                                return self.fail(self.aborted(buf));
                            }
                        }
                    }
                }
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
                        // Against the streams made, unless more are coming: a peer that closes
                        // before this side asked for more has closed every one there is.
                        self.closed_streams.fetch_add(1, AcqRel);
                        return self.check_closed();
                    }
                    Ok(0) => return self.fail(self.lost("was closed in the middle of a frame".into())),
                    Ok(n) => {
                        *have += n;
                        if *have == FRAME_LEN {
                            if u32::from_le_bytes(buf[0..4].try_into().unwrap()) == ABORT_MAGIC {
                                let want = (u32::from_le_bytes(buf[4..8].try_into().unwrap()) as usize).min(ABORT_MAX);
                                *rx = RxState::Reason { buf: Vec::with_capacity(want), want };
                                continue;
                            }
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
    pub(super) fn accept_frame(&self, s: &Stream, f: Frame) -> Result<Option<RxState>> {
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

    pub(super) fn received(&self, seq: u64, n: usize) {
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