//! TCP between ranks on different hosts: several streams per peer, messages cut into chunks that
//! go to the least-loaded stream, a handshake on every connection, typed errors.
//!
//! Connections. Every rank listens on one port (`Listener`, address from iface.rs, published
//! through the store). For each pair of ranks on different hosts, the lower rank dials the higher
//! one `nstreams` times. Each connection starts with a 48-byte hello naming the job (the store's
//! random token), both ranks, the stream index and the stream count; the acceptor answers with the
//! mirror hello. The stream index makes accept order irrelevant; the token and ranks make a
//! stranger, a peer of another job or a duplicate a refused connection, logged on stderr, that
//! never reaches a collective. The listener keeps refusing (and logging) after setup, so a port
//! scan or a late stranger cannot disturb a running job.
//!
//! Messages. A message from a rank to a peer has a per-pair sequence number; it is cut into chunks
//! of `chunk` bytes, each framed by a 40-byte header (magic, length, sequence, tag, total, offset)
//! and queued on the stream with the fewest queued bytes. One writer thread per stream writes
//! whole frames in queue order, so a stream carries the chunks of message k before those of k+1.
//! A send never blocks the caller: it returns a ticket that completes when every chunk is written
//! (then the buffer may be reused), so ranks that all send before they receive cannot deadlock.
//! The receiver reads frames from whichever stream is readable straight into the destination at
//! the frame's offset; a stream whose next frame belongs to a later message is held until then.
//! Every frame's total length and tag are checked against what the receiver posted (truncation or
//! a different collective is a `Mismatch`, never silent data).
//!
//! Failure. A closed or reset connection is a peer that exited or gave up (`PeerAborted`); no
//! progress for `timeout` is a `Timeout`; `shutdown` stops the writers and shuts every socket, so
//! remote peers blocked on this rank learn at once.
use crate::error::{Error, Result};
use std::collections::{HashSet, VecDeque};
use std::io::{Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::*};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const HELLO_MAGIC: u64 = 0x5753_5443_5048_0001; // "WSTCPH" v1
const HELLO_LEN: usize = 48;
const FRAME_MAGIC: u32 = 0x5753_4652; // "WSFR"
const FRAME_LEN: usize = 40;
/// How long an accepted connection may take to say who it is (a silent stranger costs a thread
/// for this long, never a collective).
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest single blocking wait: how often stop flags and deadlines are checked.
const SLICE: Duration = Duration::from_millis(50);
/// How long a receive polls without sleeping before it blocks (see `Link::recv`).
const RECV_SPIN: Duration = Duration::from_micros(50);

#[derive(Clone, Copy, Debug)]
pub struct Config {
    pub nstreams: usize,
    pub chunk: usize,
}

fn env_usize(name: &str, default: usize, min: usize, max: usize) -> Result<usize> {
    match std::env::var(name) {
        Err(_) => Ok(default),
        Ok(v) => match v.trim().parse::<usize>() {
            Ok(n) if (min..=max).contains(&n) => Ok(n),
            _ => Err(Error::Unsupported(format!("{name}={v:?}: give an integer from {min} to {max}, e.g. {default}"))),
        },
    }
}

impl Config {
    /// 4 streams: enough to fill a link whose per-flow share is capped (clouds cap single flows) or
    /// whose one flow stalls on a loss, few enough that each keeps a large congestion window.
    /// 512 KiB chunks: big enough that a frame header and a system call are noise, small enough
    /// that a 4 MiB piece spreads over every stream.
    pub fn from_env() -> Result<Config> {
        Ok(Config {
            nstreams: env_usize("WIRESPEED_NSTREAMS", 4, 1, 64)?,
            chunk: env_usize("WIRESPEED_CHUNK_BYTES", 512 << 10, 4096, 1 << 30)?,
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Hello {
    token: [u8; 16],
    from: u32,
    to: u32,
    stream: u32,
    nstreams: u32,
    world: u32,
}

impl Hello {
    fn encode(&self) -> [u8; HELLO_LEN] {
        let mut b = [0u8; HELLO_LEN];
        b[0..8].copy_from_slice(&HELLO_MAGIC.to_le_bytes());
        b[8..24].copy_from_slice(&self.token);
        for (i, v) in [self.from, self.to, self.stream, self.nstreams, self.world].iter().enumerate() {
            b[24 + 4 * i..28 + 4 * i].copy_from_slice(&v.to_le_bytes());
        }
        b
    }
    fn decode(b: &[u8; HELLO_LEN]) -> Option<Hello> {
        if u64::from_le_bytes(b[0..8].try_into().unwrap()) != HELLO_MAGIC {
            return None;
        }
        let w = |i: usize| u32::from_le_bytes(b[24 + 4 * i..28 + 4 * i].try_into().unwrap());
        Some(Hello { token: b[8..24].try_into().unwrap(), from: w(0), to: w(1), stream: w(2), nstreams: w(3), world: w(4) })
    }
}

/// Who this rank is, for checking hellos.
#[derive(Clone, Copy)]
struct Me {
    rank: usize,
    world: usize,
    token: [u8; 16],
    nstreams: usize,
}

/// This rank's listening socket and the thread that vets every connection made to it.
pub struct Listener {
    pub addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    accepted: mpsc::Receiver<(usize, usize, TcpStream)>,
    /// Connections refused so far (strangers, other jobs, duplicates): for tests and logs.
    pub refused: Arc<AtomicUsize>,
}

impl Listener {
    /// Listen on `ip` for the `nstreams` connections of each rank in `dialers`.
    pub fn bind(ip: IpAddr, rank: usize, world: usize, token: [u8; 16], cfg: Config, dialers: &[usize]) -> Result<Listener> {
        let l = TcpListener::bind((ip, 0)).map_err(|e| Error::Unsupported(format!("cannot listen on {ip}: {e}")))?;
        let addr = l.local_addr().map_err(|_| Error::os("getsockname"))?;
        l.set_nonblocking(true).map_err(|_| Error::os("fcntl"))?;
        let expected: HashSet<(usize, usize)> = dialers.iter().flat_map(|&r| (0..cfg.nstreams).map(move |s| (r, s))).collect();
        let me = Me { rank, world, token, nstreams: cfg.nstreams };
        let stop = Arc::new(AtomicBool::new(false));
        let refused = Arc::new(AtomicUsize::new(0));
        let (tx, rx) = mpsc::channel();
        let (s, r) = (stop.clone(), refused.clone());
        let thread = std::thread::Builder::new()
            .name("wirespeed-accept".into())
            .spawn(move || accept_loop(l, me, Arc::new(Mutex::new(expected)), tx, s, r))
            .map_err(|_| Error::os("spawning the accept thread"))?;
        Ok(Listener { addr, stop, thread: Some(thread), accepted: rx, refused })
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.stop.store(true, Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn accept_loop(l: TcpListener, me: Me, expected: Arc<Mutex<HashSet<(usize, usize)>>>, tx: mpsc::Sender<(usize, usize, TcpStream)>, stop: Arc<AtomicBool>, refused: Arc<AtomicUsize>) {
    let mut pfd = libc::pollfd { fd: l.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    while !stop.load(Acquire) {
        unsafe { libc::poll(&mut pfd, 1, SLICE.as_millis() as i32) };
        let Ok((sock, from)) = l.accept() else { continue };
        // Each hello is read on its own short-lived thread: a stranger that connects and says
        // nothing must not delay the real peers queued behind it.
        let (expected, tx, refused) = (expected.clone(), tx.clone(), refused.clone());
        let _ = std::thread::Builder::new().name("wirespeed-hello".into()).spawn(move || {
            match vet(&sock, &me, &expected) {
                Ok((r, s)) => {
                    let _ = tx.send((r, s, sock));
                }
                Err(why) => {
                    refused.fetch_add(1, SeqCst);
                    eprintln!("wirespeed: rank {} refused a connection from {from}: {why}", me.rank);
                    let _ = sock.shutdown(Shutdown::Both);
                }
            }
        });
    }
}

/// Check an incoming connection's hello; answer it if it is an expected peer of this job.
fn vet(sock: &TcpStream, me: &Me, expected: &Mutex<HashSet<(usize, usize)>>) -> std::result::Result<(usize, usize), String> {
    let _ = sock.set_nonblocking(false);
    let _ = sock.set_read_timeout(Some(HELLO_TIMEOUT));
    let mut b = [0u8; HELLO_LEN];
    (&*sock).read_exact(&mut b).map_err(|e| format!("no wirespeed hello ({e})"))?;
    let h = Hello::decode(&b).ok_or("not a wirespeed hello (bad magic)")?;
    if h.token != me.token {
        return Err(format!("rank {} of another job (job token differs)", h.from));
    }
    if h.to as usize != me.rank || h.world as usize != me.world || h.nstreams as usize != me.nstreams {
        return Err(format!("hello for rank {} of {} with {} streams; this is rank {} of {} with {}",
            h.to, h.world, h.nstreams, me.rank, me.world, me.nstreams));
    }
    let key = (h.from as usize, h.stream as usize);
    if !expected.lock().unwrap().remove(&key) {
        return Err(format!("rank {} stream {} is not expected here (a duplicate, or after setup)", h.from, h.stream));
    }
    let ack = Hello { from: me.rank as u32, to: h.from, ..h };
    (&*sock).write_all(&ack.encode()).map_err(|e| format!("answering its hello failed ({e})"))?;
    Ok(key)
}

/// Dial rank `to` at `addr` for stream `stream` and check that the answer is that rank of this job.
fn dial(addr: SocketAddr, me: &Me, to: usize, stream: usize, deadline: Instant) -> Result<TcpStream> {
    let sock = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match TcpStream::connect_timeout(&addr, left.clamp(Duration::from_millis(10), Duration::from_secs(5))) {
            Ok(s) => break s,
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => return Err(Error::Timeout { what: format!("a connection to rank {to} at {addr} ({e})"), secs: 0.0 }),
        }
    };
    let hello = Hello { token: me.token, from: me.rank as u32, to: to as u32, stream: stream as u32, nstreams: me.nstreams as u32, world: me.world as u32 };
    let io = |e: std::io::Error| Error::PeerAborted { rank: to, reason: format!("the connection to {addr} failed during the handshake ({e})") };
    (&sock).write_all(&hello.encode()).map_err(io)?;
    let _ = sock.set_read_timeout(Some(deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(10))));
    let mut b = [0u8; HELLO_LEN];
    (&sock).read_exact(&mut b).map_err(io)?;
    let want = Hello { from: to as u32, to: me.rank as u32, ..hello };
    if Hello::decode(&b) != Some(want) {
        return Err(Error::Stranger(format!("the process at {addr} is not rank {to} of this job")));
    }
    let _ = sock.set_read_timeout(None);
    Ok(sock)
}

struct Chunk {
    head: [u8; FRAME_LEN],
    ptr: usize,
    len: usize,
    left: Arc<AtomicUsize>,
}

/// What the caller and one peer's writer threads share.
struct TxShared {
    queues: Vec<Mutex<VecDeque<Chunk>>>,
    ready: Vec<Condvar>,
    queued: Vec<AtomicUsize>,
    done_lock: Mutex<()>,
    done: Condvar,
    error: Mutex<Option<Error>>,
    stop: AtomicBool,
}

/// A send in flight: complete when every chunk is written.
pub struct SendTicket {
    tx: Arc<TxShared>,
    left: Arc<AtomicUsize>,
    to: usize,
    timeout: Duration,
}

impl SendTicket {
    pub fn is_done(&self) -> bool {
        self.left.load(Acquire) == 0 || self.tx.error.lock().unwrap().is_some()
    }
    pub fn wait(&self) -> Result<()> {
        let start = Instant::now();
        let mut g = self.tx.done_lock.lock().unwrap();
        loop {
            if self.left.load(Acquire) == 0 {
                return Ok(());
            }
            if let Some(e) = self.tx.error.lock().unwrap().clone() {
                return Err(e);
            }
            if start.elapsed() >= self.timeout {
                return Err(Error::Timeout { what: format!("rank {} to take a message", self.to), secs: self.timeout.as_secs_f64() });
            }
            g = self.tx.done.wait_timeout(g, SLICE).unwrap().0;
        }
    }
}

enum Rx {
    Head { buf: [u8; FRAME_LEN], have: usize },
    Body { dst: usize, left: usize },
    Held(Frame),
    /// The peer closed this stream between frames: nothing more will come on it.
    Closed,
}

#[derive(Clone, Copy)]
struct Frame {
    len: usize,
    seq: u64,
    tag: u64,
    total: u64,
    offset: u64,
}

fn frame_bytes(f: &Frame) -> [u8; FRAME_LEN] {
    let mut b = [0u8; FRAME_LEN];
    b[0..4].copy_from_slice(&FRAME_MAGIC.to_le_bytes());
    b[4..8].copy_from_slice(&(f.len as u32).to_le_bytes());
    b[8..16].copy_from_slice(&f.seq.to_le_bytes());
    b[16..24].copy_from_slice(&f.tag.to_le_bytes());
    b[24..32].copy_from_slice(&f.total.to_le_bytes());
    b[32..40].copy_from_slice(&f.offset.to_le_bytes());
    b
}

fn parse_frame(b: &[u8; FRAME_LEN]) -> Option<Frame> {
    if u32::from_le_bytes(b[0..4].try_into().unwrap()) != FRAME_MAGIC {
        return None;
    }
    let q = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
    Some(Frame { len: u32::from_le_bytes(b[4..8].try_into().unwrap()) as usize, seq: q(8), tag: q(16), total: q(24), offset: q(32) })
}

/// The streams to one remote rank.
struct Link {
    rank: usize,
    socks: Vec<Arc<TcpStream>>,
    tx: Arc<TxShared>,
    writers: Vec<JoinHandle<()>>,
    rx: Vec<Rx>,
    send_seq: u64,
    recv_seq: u64,
}

/// Write all of `b`, in SLICE-long blocking attempts so a stop request is seen.
fn send_all(sock: &TcpStream, mut b: &[u8], stop: &AtomicBool) -> std::result::Result<(), String> {
    while !b.is_empty() {
        let n = unsafe { libc::send(sock.as_raw_fd(), b.as_ptr() as *const libc::c_void, b.len(), libc::MSG_NOSIGNAL) };
        if n > 0 {
            b = &b[n as usize..];
            continue;
        }
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EAGAIN) | Some(libc::EINTR) => {
                if stop.load(Acquire) {
                    return Err("stopped".into());
                }
            }
            _ => return Err(e.to_string()),
        }
    }
    Ok(())
}

fn writer_loop(tx: &TxShared, s: usize, sock: &TcpStream, rank: usize) {
    loop {
        let c = {
            let mut q = tx.queues[s].lock().unwrap();
            loop {
                if tx.stop.load(Acquire) {
                    return;
                }
                if let Some(c) = q.pop_front() {
                    break c;
                }
                q = tx.ready[s].wait_timeout(q, SLICE).unwrap().0;
            }
        };
        // An empty message may carry a null pointer (a zero-element tensor): no slice from it.
        let body: &[u8] = if c.len == 0 {
            &[]
        } else {
            unsafe { std::slice::from_raw_parts(c.ptr as *const u8, c.len) }
        };
        let r = send_all(sock, &c.head, &tx.stop).and_then(|_| send_all(sock, body, &tx.stop));
        tx.queued[s].fetch_sub(FRAME_LEN + c.len, SeqCst);
        match r {
            Ok(()) => {
                if c.left.fetch_sub(1, SeqCst) == 1 {
                    let _g = tx.done_lock.lock().unwrap();
                    tx.done.notify_all();
                }
            }
            Err(why) => {
                tx.error.lock().unwrap().get_or_insert(Error::PeerAborted {
                    rank,
                    reason: format!("sending to it failed ({why}): it exited or gave up"),
                });
                let _g = tx.done_lock.lock().unwrap();
                tx.done.notify_all();
                return;
            }
        }
    }
}

/// The TCP side of a rank: one `Link` per rank on another host.
pub struct Tcp {
    pub rank: usize,
    links: Vec<Option<Link>>,
    listener: Listener,
    timeout: Duration,
    cfg: Config,
}

impl Tcp {
    /// Dial the remote ranks above this one and accept those below, `nstreams` each; `addrs[r]`
    /// is rank r's listening address ("ip:port"), `remote[r]` whether r is on another host.
    pub fn connect(listener: Listener, rank: usize, addrs: &[String], remote: &[bool], token: [u8; 16], cfg: Config, timeout: Duration) -> Result<Tcp> {
        let world = addrs.len();
        let me = Me { rank, world, token, nstreams: cfg.nstreams };
        let deadline = Instant::now() + timeout;
        let mut socks: Vec<Vec<Option<TcpStream>>> = (0..world).map(|_| (0..cfg.nstreams).map(|_| None).collect()).collect();
        for r in (rank + 1..world).filter(|&r| remote[r]) {
            let addr: SocketAddr = addrs[r].parse().map_err(|_| Error::Unsupported(format!("rank {r} published a bad address {:?}", addrs[r])))?;
            for s in 0..cfg.nstreams {
                socks[r][s] = Some(dial(addr, &me, r, s, deadline)?);
            }
        }
        let mut missing = (0..rank).filter(|&r| remote[r]).count() * cfg.nstreams;
        while missing > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            match listener.accepted.recv_timeout(left.min(SLICE)) {
                Ok((r, s, sock)) => {
                    socks[r][s] = Some(sock);
                    missing -= 1;
                }
                Err(_) if Instant::now() < deadline => {}
                Err(_) => {
                    let who: Vec<usize> = (0..rank).filter(|&r| remote[r] && socks[r].iter().any(|s| s.is_none())).collect();
                    return Err(Error::Timeout { what: format!("connections from ranks {who:?}"), secs: timeout.as_secs_f64() });
                }
            }
        }
        let mut links = Vec::with_capacity(world);
        for (r, ss) in socks.into_iter().enumerate() {
            if !remote[r] {
                links.push(None);
                continue;
            }
            let socks: Vec<Arc<TcpStream>> = ss.into_iter().map(|s| Arc::new(s.expect("every stream connected"))).collect();
            for s in &socks {
                let _ = s.set_nodelay(true);
                let _ = s.set_write_timeout(Some(SLICE));
            }
            let n = socks.len();
            let tx = Arc::new(TxShared {
                queues: (0..n).map(|_| Mutex::new(VecDeque::new())).collect(),
                ready: (0..n).map(|_| Condvar::new()).collect(),
                queued: (0..n).map(|_| AtomicUsize::new(0)).collect(),
                done_lock: Mutex::new(()),
                done: Condvar::new(),
                error: Mutex::new(None),
                stop: AtomicBool::new(false),
            });
            let writers = (0..n)
                .map(|s| {
                    let (tx, sock) = (tx.clone(), socks[s].clone());
                    std::thread::Builder::new()
                        .name(format!("wirespeed-tx{r}.{s}"))
                        .spawn(move || writer_loop(&tx, s, &sock, r))
                        .map_err(|_| Error::os("spawning a writer thread"))
                })
                .collect::<Result<Vec<_>>>()?;
            let rx = (0..n).map(|_| Rx::Head { buf: [0; FRAME_LEN], have: 0 }).collect();
            links.push(Some(Link { rank: r, socks, tx, writers, rx, send_seq: 0, recv_seq: 0 }));
        }
        Ok(Tcp { rank, links, listener, timeout, cfg })
    }

    /// Connections refused so far by this rank's listener.
    pub fn refused(&self) -> usize {
        self.listener.refused.load(SeqCst)
    }

    fn link(&mut self, r: usize) -> Result<&mut Link> {
        self.links.get_mut(r).and_then(|l| l.as_mut()).ok_or_else(|| Error::Unsupported(format!("rank {r} is not reached over TCP")))
    }

    /// Queue `len` bytes at `ptr` for rank `to`; the caller keeps the buffer alive until the
    /// ticket completes.
    pub fn send(&mut self, to: usize, ptr: usize, len: usize, tag: u64) -> Result<SendTicket> {
        let (chunk, timeout) = (self.cfg.chunk, self.timeout);
        let l = self.link(to)?;
        if let Some(e) = l.tx.error.lock().unwrap().clone() {
            return Err(e);
        }
        let seq = l.send_seq;
        l.send_seq += 1;
        let n = len.div_ceil(chunk).max(1);
        let left = Arc::new(AtomicUsize::new(n));
        for i in 0..n {
            let off = i * chunk;
            let clen = chunk.min(len - off);
            let f = Frame { len: clen, seq, tag, total: len as u64, offset: off as u64 };
            // Least-loaded stream: a slow or stalled flow gets fewer chunks, not an equal share.
            let s = (0..l.socks.len()).min_by_key(|&s| l.tx.queued[s].load(SeqCst)).unwrap();
            l.tx.queued[s].fetch_add(FRAME_LEN + clen, SeqCst);
            l.tx.queues[s].lock().unwrap().push_back(Chunk { head: frame_bytes(&f), ptr: ptr + off, len: clen, left: left.clone() });
            l.tx.ready[s].notify_one();
        }
        Ok(SendTicket { tx: l.tx.clone(), left, to, timeout })
    }

    /// Receive exactly `len` bytes with `tag` from rank `from` into `dst` (the next message from it).
    pub fn recv(&mut self, from: usize, dst: usize, len: usize, tag: u64) -> Result<()> {
        let me = self.rank;
        let timeout = self.timeout;
        let l = self.link(from)?;
        l.recv(me, dst, len, tag, timeout)
    }

    /// Stop the writers and shut every connection, so peers blocked on this rank fail at once.
    /// Afterwards no thread touches any caller buffer.
    pub fn shutdown(&mut self) {
        for l in self.links.iter_mut().flatten() {
            l.tx.stop.store(true, SeqCst);
            l.tx.error.lock().unwrap().get_or_insert(Error::Broken("this rank shut its connections".into()));
            for s in &l.socks {
                let _ = s.shutdown(Shutdown::Both);
            }
            for c in &l.tx.ready {
                c.notify_all();
            }
            for w in l.writers.drain(..) {
                let _ = w.join();
            }
        }
    }
}

impl Drop for Tcp {
    fn drop(&mut self) {
        self.shutdown();
    }
}

impl Link {
    fn recv(&mut self, me: usize, dst: usize, len: usize, tag: u64, timeout: Duration) -> Result<()> {
        let seq = self.recv_seq;
        let from = self.rank;
        let mut got = 0usize;
        let mut frames = 0usize;
        let start = Instant::now();
        // A frame of this message already read while receiving the previous one.
        for s in 0..self.rx.len() {
            if let Rx::Held(f) = self.rx[s] {
                if f.seq == seq {
                    self.rx[s] = accept_frame(f, seq, from, me, dst, len, tag)?;
                    frames += 1;
                }
            }
        }
        let fds: Vec<i32> = self.socks.iter().map(|s| s.as_raw_fd()).collect();
        // When nothing is readable, poll without sleeping for RECV_SPIN first: a wake-up from a
        // blocking poll costs tens of microseconds here, as much as a small message's whole trip.
        let mut idle_since: Option<Instant> = None;
        loop {
            let active: Vec<usize> = (0..self.rx.len()).filter(|&s| !matches!(self.rx[s], Rx::Held(_) | Rx::Closed)).collect();
            let busy = self.rx.iter().any(|r| matches!(r, Rx::Body { .. }));
            if got == len && frames > 0 && !busy {
                break;
            }
            if active.is_empty() {
                if self.rx.iter().any(|r| matches!(r, Rx::Closed)) {
                    return Err(closed(from, "closed".into()));
                }
                return Err(Error::Mismatch(format!("rank {from} moved past message {seq} before sending all of it")));
            }
            let mut polls: Vec<libc::pollfd> = active.iter().map(|&s| libc::pollfd { fd: fds[s], events: libc::POLLIN, revents: 0 }).collect();
            let spinning = idle_since.get_or_insert_with(Instant::now).elapsed() < RECV_SPIN;
            let wait_ms = if spinning { 0 } else { SLICE.as_millis() as i32 };
            let n = unsafe { libc::poll(polls.as_mut_ptr(), polls.len() as libc::nfds_t, wait_ms) };
            if n > 0 {
                idle_since = None;
            } else if spinning {
                std::hint::spin_loop();
                continue;
            }
            if n <= 0 {
                if let Some(e) = self.tx.error.lock().unwrap().clone() {
                    return Err(e);
                }
                if start.elapsed() >= timeout {
                    return Err(Error::Timeout { what: format!("rank {from} to send {len} bytes to rank {me}"), secs: timeout.as_secs_f64() });
                }
                continue;
            }
            for (k, &s) in active.iter().enumerate() {
                if polls[k].revents == 0 {
                    continue;
                }
                // Drain what this stream has, up to its next frame of a later message.
                loop {
                    match &mut self.rx[s] {
                        Rx::Held(_) | Rx::Closed => break,
                        Rx::Head { buf, have } => {
                            // A peer that finished its part may close streams this message does
                            // not use: only a close in the middle of a frame loses data.
                            let n = match read_some(fds[s], &mut buf[*have..]) {
                                Err(w) if *have == 0 && w == "closed" => {
                                    self.rx[s] = Rx::Closed;
                                    break;
                                }
                                r => r.map_err(|w| closed(from, w))?,
                            };
                            if n == 0 {
                                break;
                            }
                            *have += n;
                            if *have < FRAME_LEN {
                                continue;
                            }
                            let f = parse_frame(buf).ok_or_else(|| Error::Stranger(format!("rank {from} sent a malformed frame")))?;
                            if f.seq == seq {
                                self.rx[s] = accept_frame(f, seq, from, me, dst, len, tag)?;
                                frames += 1;
                            } else if f.seq > seq {
                                self.rx[s] = Rx::Held(f);
                            } else {
                                return Err(Error::Stranger(format!("rank {from} sent a frame of an old message")));
                            }
                        }
                        Rx::Body { dst: d, left } => {
                            let buf = unsafe { std::slice::from_raw_parts_mut(*d as *mut u8, *left) };
                            let n = read_some(fds[s], buf).map_err(|w| closed(from, w))?;
                            if n == 0 {
                                break;
                            }
                            *d += n;
                            *left -= n;
                            got += n;
                            if *left == 0 {
                                self.rx[s] = Rx::Head { buf: [0; FRAME_LEN], have: 0 };
                            }
                        }
                    }
                }
            }
        }
        self.recv_seq += 1;
        Ok(())
    }
}

fn closed(rank: usize, why: String) -> Error {
    Error::PeerAborted { rank, reason: format!("its connection {why}: it exited or gave up") }
}

/// Check a frame of the message being received against what the receiver posted.
fn accept_frame(f: Frame, seq: u64, from: usize, me: usize, dst: usize, len: usize, tag: u64) -> Result<Rx> {
    if f.total != len as u64 {
        return Err(Error::Mismatch(format!("rank {from} sent {} bytes to rank {me}, which expects {len} (message {seq})", f.total)));
    }
    if f.tag != tag {
        return Err(Error::Mismatch(format!("rank {from} sent a message with tag {:#x} to rank {me}, which expects tag {tag:#x} (another collective or tag)", f.tag)));
    }
    if f.offset + f.len as u64 > f.total {
        return Err(Error::Stranger(format!("rank {from} sent a frame past the end of its message")));
    }
    Ok(if f.len == 0 { Rx::Head { buf: [0; FRAME_LEN], have: 0 } } else { Rx::Body { dst: dst + f.offset as usize, left: f.len } })
}

/// Non-blocking read: Ok(0) when nothing is there now; Err on a closed or broken connection.
fn read_some(fd: i32, buf: &mut [u8]) -> std::result::Result<usize, String> {
    if buf.is_empty() {
        return Ok(0);
    }
    loop {
        let n = unsafe { libc::recv(fd, buf.as_mut_ptr() as *mut libc::c_void, buf.len(), libc::MSG_DONTWAIT) };
        if n > 0 {
            return Ok(n as usize);
        }
        if n == 0 {
            return Err("closed".into());
        }
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EAGAIN) => return Ok(0),
            Some(libc::EINTR) => continue,
            _ => return Err(format!("failed ({e})")),
        }
    }
}
