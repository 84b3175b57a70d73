//! Handshake: hellos, the listener, the dialer.
use super::conn::{make_conn, send_vectored, would_block, Conn};
use super::reactor::{Entry, Reactor};
use super::{NetConfig, HELLO_LEN, HELLO_MAGIC, HELLO_TIMEOUT, MAX_PENDING};
use crate::error::{Error, Result};
use mio::Interest;
use std::collections::{HashMap, VecDeque};
use std::io::{IoSlice, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicUsize, Ordering::*};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

fn hello_bytes(key: &[u8; 32], stream: u32, nstreams: u32) -> [u8; HELLO_LEN] {
    let mut b = [0u8; HELLO_LEN];
    b[0..8].copy_from_slice(&HELLO_MAGIC.to_le_bytes());
    b[8..40].copy_from_slice(key);
    b[40..44].copy_from_slice(&stream.to_le_bytes());
    b[44..48].copy_from_slice(&nstreams.to_le_bytes());
    b
}

fn parse_hello(b: &[u8; HELLO_LEN]) -> Option<([u8; 32], u32, u32)> {
    if u64::from_le_bytes(b[0..8].try_into().unwrap()) != HELLO_MAGIC {
        return None;
    }
    let w = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap());
    Some((b[8..40].try_into().unwrap(), w(40), w(44)))
}

/// Decides whether a dialer's key belongs here; the reason is logged when it does not.
pub type Vet = Box<dyn Fn(&[u8; 32]) -> std::result::Result<(), String> + Send + Sync>;
/// Where a listener says it refused a connection (the NCCL plugin passes NCCL's logger); without
/// one, the line goes to stderr.
pub type Report = Box<dyn Fn(&str) + Send + Sync>;

struct PendingHello {
    sock: TcpStream,
    from: SocketAddr,
    buf: [u8; HELLO_LEN],
    have: usize,
    since: Instant,
    token: usize,
    thread: usize,
}

struct Bundle {
    streams: Vec<Option<TcpStream>>,
    from: SocketAddr,
    since: Instant,
}

struct ListenerState {
    hellos: HashMap<usize, PendingHello>,
    next_hello: usize,
    bundles: HashMap<[u8; 32], Bundle>,
    ready: VecDeque<([u8; 32], Vec<TcpStream>, SocketAddr)>,
}

pub(super) struct ListenerInner {
    sock: TcpListener,
    reactor: Weak<Reactor>,
    vet: Vet,
    label: String,
    report: Option<Report>,
    state: Mutex<ListenerState>,
    refused: AtomicUsize,
    token: OnceLock<(usize, usize)>,
}

/// A listening socket whose connections are vetted in the background by the reactor.
pub struct Listener {
    inner: Arc<ListenerInner>,
    reactor: Arc<Reactor>,
    cfg: NetConfig,
    addr: SocketAddr,
}

impl ListenerInner {
    fn refuse(&self, from: SocketAddr, why: &str) {
        self.refused.fetch_add(1, SeqCst);
        let line = format!("{} refused a connection from {from}: {why}", self.label);
        match &self.report {
            Some(report) => report(&line),
            None => eprintln!("wirespeed: {line}"),
        }
    }

    pub(super) fn accept_all(self: &Arc<Self>) {
        let Some(reactor) = self.reactor.upgrade() else { return };
        // Bounded: what is left in the backlog raises the next edge's event after this batch.
        for _ in 0..64 {
            match self.sock.accept() {
                Ok((sock, from)) => {
                    let mut st = self.state.lock().unwrap();
                    if st.hellos.len() >= MAX_PENDING {
                        drop(st);
                        self.refuse(from, "too many connections waiting for their hello");
                        continue;
                    }
                    let _ = sock.set_nonblocking(true);
                    let id = st.next_hello;
                    st.next_hello += 1;
                    let thread = reactor.pick();
                    let fd = sock.as_raw_fd();
                    st.hellos.insert(id, PendingHello { sock, from, buf: [0; HELLO_LEN], have: 0, since: Instant::now(), token: 0, thread });
                    drop(st);
                    match reactor.register(thread, fd, Interest::READABLE, Entry::Hello(Arc::downgrade(self), id)) {
                        Ok(tok) => {
                            if let Some(h) = self.state.lock().unwrap().hellos.get_mut(&id) {
                                h.token = tok;
                            }
                            self.read_hello(id);
                        }
                        Err(_) => {
                            self.state.lock().unwrap().hellos.remove(&id);
                        }
                    }
                }
                Err(e) if would_block(&e) => return,
                Err(_) => return,
            }
        }
        // More may be queued: the edge will not fire again for them, so look again soon.
        if let Some((thread, _)) = self.token.get() {
            let _ = reactor.threads[*thread].waker.wake();
        }
    }

    fn drop_hello(&self, reactor: &Reactor, h: &PendingHello) {
        reactor.forget(h.thread, h.token, h.sock.as_raw_fd());
    }

    pub(super) fn read_hello(self: &Arc<Self>, id: usize) {
        let Some(reactor) = self.reactor.upgrade() else { return };
        let mut st = self.state.lock().unwrap();
        let Some(h) = st.hellos.get_mut(&id) else { return };
        loop {
            match (&h.sock).read(&mut h.buf[h.have..]) {
                Ok(0) => {
                    let h = st.hellos.remove(&id).unwrap();
                    drop(st);
                    self.drop_hello(&reactor, &h);
                    return self.refuse(h.from, "closed before its hello");
                }
                Ok(n) => {
                    h.have += n;
                    if h.have == HELLO_LEN {
                        break;
                    }
                }
                Err(e) if would_block(&e) => return,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    let h = st.hellos.remove(&id).unwrap();
                    drop(st);
                    self.drop_hello(&reactor, &h);
                    return self.refuse(h.from, &format!("failed during its hello ({e})"));
                }
            }
        }
        let h = st.hellos.remove(&id).unwrap();
        self.drop_hello(&reactor, &h);
        let verdict = match parse_hello(&h.buf) {
            None => Err("not a wirespeed hello (bad magic)".to_string()),
            Some((key, stream, n)) if n == 0 || n > 64 || stream >= n => Err(format!("stream {stream} of {n} makes no sense")).map(|_: ()| (key, stream, n)),
            Some((key, stream, n)) => (self.vet)(&key).map(|_| (key, stream, n)),
        };
        let (key, stream, n) = match verdict {
            Ok(v) => v,
            Err(why) => {
                drop(st);
                let _ = h.sock.shutdown(Shutdown::Both);
                return self.refuse(h.from, &why);
            }
        };
        let b = st.bundles.entry(key).or_insert_with(|| Bundle { streams: (0..n).map(|_| None).collect(), from: h.from, since: Instant::now() });
        if b.streams.len() != n as usize || b.streams[stream as usize].is_some() {
            drop(st);
            let _ = h.sock.shutdown(Shutdown::Both);
            return self.refuse(h.from, &format!("a duplicate or inconsistent stream {stream} of {n}"));
        }
        // Answer with the hello echoed: the dialer learns its key reached a wirespeed listener.
        let _ = h.sock.set_nonblocking(false);
        let _ = h.sock.set_write_timeout(Some(HELLO_TIMEOUT));
        if (&h.sock).write_all(&h.buf).is_err() {
            drop(st);
            return self.refuse(h.from, "went away during the handshake");
        }
        let _ = h.sock.set_nonblocking(true);
        b.streams[stream as usize] = Some(h.sock);
        if b.streams.iter().all(|s| s.is_some()) {
            let b = st.bundles.remove(&key).unwrap();
            st.ready.push_back((key, b.streams.into_iter().map(|s| s.unwrap()).collect(), b.from));
        }
    }

    /// Drop handshakes that took too long.
    pub(super) fn expire(&self) {
        let Some(reactor) = self.reactor.upgrade() else { return };
        let mut st = self.state.lock().unwrap();
        let old: Vec<usize> = st.hellos.iter().filter(|(_, h)| h.since.elapsed() > HELLO_TIMEOUT).map(|(&i, _)| i).collect();
        let mut refused = Vec::new();
        for i in old {
            let h = st.hellos.remove(&i).unwrap();
            self.drop_hello(&reactor, &h);
            refused.push((h.from, "said nothing for 5 s"));
        }
        let stale: Vec<[u8; 32]> = st.bundles.iter().filter(|(_, b)| b.since.elapsed() > HELLO_TIMEOUT).map(|(k, _)| *k).collect();
        for k in stale {
            let b = st.bundles.remove(&k).unwrap();
            refused.push((b.from, "opened some of its streams but not all within 5 s"));
        }
        drop(st);
        for (from, why) in refused {
            self.refuse(from, why);
        }
    }
}

impl Listener {
    /// Listen on `addr` (port 0 for any) and accept any key.
    pub fn bind(reactor: &Arc<Reactor>, cfg: &NetConfig, addr: SocketAddr) -> Result<Listener> {
        Listener::bind_vetted(reactor, cfg, addr, Box::new(|_| Ok(())), "wirespeed".into(), None)
    }

    /// Listen on `addr`; `vet` decides on each dialer's key, `label` names this end in logs, and
    /// `report` (stderr when None) receives each refusal's line. Accepted connections are made
    /// with `cfg`'s chunk size, spin and socket options.
    pub fn bind_vetted(reactor: &Arc<Reactor>, cfg: &NetConfig, addr: SocketAddr, vet: Vet, label: String, report: Option<Report>) -> Result<Listener> {
        let cfg = *cfg;
        let sock = TcpListener::bind(addr).map_err(|e| Error::Unsupported(format!("cannot listen on {addr}: {e}")))?;
        let addr = sock.local_addr().map_err(|_| Error::os("getsockname"))?;
        sock.set_nonblocking(true).map_err(|_| Error::os("fcntl"))?;
        let inner = Arc::new(ListenerInner {
            sock,
            reactor: Arc::downgrade(reactor),
            vet,
            label,
            report,
            state: Mutex::new(ListenerState { hellos: HashMap::new(), next_hello: 0, bundles: HashMap::new(), ready: VecDeque::new() }),
            refused: AtomicUsize::new(0),
            token: OnceLock::new(),
        });
        let thread = reactor.pick();
        let fd = inner.sock.as_raw_fd();
        let tok = reactor.register(thread, fd, Interest::READABLE, Entry::Listener(Arc::downgrade(&inner)))?;
        let _ = inner.token.set((thread, tok));
        // Connections queued before registration raise no edge.
        inner.accept_all();
        Ok(Listener { inner, reactor: reactor.clone(), cfg, addr })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Connections refused so far (strangers, bad hellos, duplicates, timeouts).
    pub fn refused(&self) -> usize {
        self.inner.refused.load(SeqCst)
    }

    /// A connection whose streams have all arrived and passed vetting, with its key; never blocks.
    pub fn poll_accept(&self) -> Result<Option<([u8; 32], Conn)>> {
        let next = self.inner.state.lock().unwrap().ready.pop_front();
        match next {
            None => Ok(None),
            Some((key, socks, from)) => Ok(Some((key, make_conn(&self.reactor, &self.cfg, socks, from)?))),
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Some(&(thread, tok)) = self.inner.token.get() {
            self.reactor.forget(thread, tok, self.inner.sock.as_raw_fd());
        }
        let st = std::mem::replace(&mut *self.inner.state.lock().unwrap(), ListenerState { hellos: HashMap::new(), next_hello: 0, bundles: HashMap::new(), ready: VecDeque::new() });
        for h in st.hellos.values() {
            self.reactor.forget(h.thread, h.token, h.sock.as_raw_fd());
        }
    }
}

enum DialStream {
    Connecting(TcpStream),
    Greeting { sock: TcpStream, sent: usize, got: usize, buf: [u8; HELLO_LEN] },
    Ready(TcpStream),
}

/// A connection being made without blocking: call `poll` until it returns the `Conn`.
pub struct Dialer {
    reactor: Arc<Reactor>,
    cfg: NetConfig,
    addr: SocketAddr,
    key: [u8; 32],
    streams: Vec<Option<DialStream>>,
}

fn connect_nonblocking(addr: SocketAddr) -> Result<TcpStream> {
    let domain = if addr.is_ipv4() { libc::AF_INET } else { libc::AF_INET6 };
    // SAFETY: plain socket creation; the fd is owned by the TcpStream below.
    let fd = unsafe { libc::socket(domain, libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(Error::os("socket"));
    }
    // SAFETY: fd is a fresh socket that nothing else owns.
    let sock = unsafe { <TcpStream as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    let (sa, len) = sockaddr(addr);
    // SAFETY: sa is a valid sockaddr of `len` bytes.
    let r = unsafe { libc::connect(fd, &sa as *const _ as *const libc::sockaddr, len) };
    if r != 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINPROGRESS) {
            return Err(Error::PeerLost(format!("connecting to {addr} failed ({e})")));
        }
    }
    Ok(sock)
}

fn sockaddr(addr: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is plain data; zero is a valid starting value.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match addr {
        SocketAddr::V4(a) => {
            // SAFETY: sockaddr_storage is large and aligned enough for sockaddr_in.
            let sin = unsafe { &mut *(&mut ss as *mut _ as *mut libc::sockaddr_in) };
            sin.sin_family = libc::AF_INET as _;
            sin.sin_port = a.port().to_be();
            sin.sin_addr.s_addr = u32::from_ne_bytes(a.ip().octets());
            std::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            // SAFETY: as above, for sockaddr_in6.
            let sin6 = unsafe { &mut *(&mut ss as *mut _ as *mut libc::sockaddr_in6) };
            sin6.sin6_family = libc::AF_INET6 as _;
            sin6.sin6_port = a.port().to_be();
            sin6.sin6_addr.s6_addr = a.ip().octets();
            sin6.sin6_scope_id = a.scope_id();
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (ss, len as libc::socklen_t)
}

impl Dialer {
    /// Start `nstreams` connections to `addr`, each to greet the listener with `key`; the
    /// connection is made with `cfg`'s chunk size, spin and socket options.
    pub fn start(reactor: &Arc<Reactor>, cfg: &NetConfig, addr: SocketAddr, key: [u8; 32], nstreams: usize) -> Result<Dialer> {
        if nstreams == 0 || nstreams > 64 {
            return Err(Error::Unsupported(format!("{nstreams} streams per connection: give 1 to 64")));
        }
        let cfg = *cfg;
        let streams = (0..nstreams).map(|_| connect_nonblocking(addr).map(|s| Some(DialStream::Connecting(s)))).collect::<Result<Vec<_>>>()?;
        Ok(Dialer { reactor: reactor.clone(), cfg, addr, key, streams })
    }

    /// Advance every stream as far as it goes without blocking; the `Conn` once all are greeted.
    pub fn poll(&mut self) -> Result<Option<Conn>> {
        let n = self.streams.len() as u32;
        let addr = self.addr;
        let lost = |why: String| Error::PeerLost(format!("connecting to {addr}: {why}"));
        for (i, slot) in self.streams.iter_mut().enumerate() {
            let st = slot.take().unwrap();
            *slot = Some(match st {
                DialStream::Connecting(sock) => {
                    let mut p = libc::pollfd { fd: sock.as_raw_fd(), events: libc::POLLOUT, revents: 0 };
                    // SAFETY: one valid pollfd, zero timeout.
                    unsafe { libc::poll(&mut p, 1, 0) };
                    if p.revents == 0 {
                        DialStream::Connecting(sock)
                    } else {
                        if let Ok(Some(e)) = sock.take_error() {
                            return Err(lost(format!("{e}")));
                        }
                        if p.revents & (libc::POLLERR | libc::POLLHUP) != 0 {
                            return Err(lost("the connection was refused or reset".into()));
                        }
                        DialStream::Greeting { sock, sent: 0, got: 0, buf: [0; HELLO_LEN] }
                    }
                }
                DialStream::Greeting { sock, mut sent, mut got, mut buf } => {
                    let hello = hello_bytes(&self.key, i as u32, n);
                    while sent < HELLO_LEN {
                        match send_vectored(sock.as_raw_fd(), &[IoSlice::new(&hello[sent..])]) {
                            Ok(k) => sent += k,
                            Err(e) if would_block(&e) => break,
                            Err(e) => return Err(lost(format!("the handshake failed ({e})"))),
                        }
                    }
                    while sent == HELLO_LEN && got < HELLO_LEN {
                        match (&sock).read(&mut buf[got..]) {
                            Ok(0) => return Err(lost("the listener refused this connection (wrong job, rank or key)".into())),
                            Ok(k) => got += k,
                            Err(e) if would_block(&e) => break,
                            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                            Err(e) => return Err(lost(format!("the handshake failed ({e})"))),
                        }
                    }
                    if got == HELLO_LEN {
                        if buf != hello {
                            return Err(Error::Stranger(format!("the process at {addr} answered the handshake with something else")));
                        }
                        DialStream::Ready(sock)
                    } else {
                        DialStream::Greeting { sock, sent, got, buf }
                    }
                }
                ready => ready,
            });
        }
        if !self.streams.iter().all(|s| matches!(s, Some(DialStream::Ready(_)))) {
            return Ok(None);
        }
        let socks = self.streams.drain(..).map(|s| match s {
            Some(DialStream::Ready(s)) => s,
            _ => unreachable!("checked above"),
        }).collect();
        make_conn(&self.reactor, &self.cfg, socks, self.addr).map(Some)
    }

    /// Poll until connected or `deadline`, sleeping briefly between polls.
    pub fn finish(mut self, deadline: Instant) -> Result<Conn> {
        loop {
            if let Some(c) = self.poll()? {
                return Ok(c);
            }
            if Instant::now() >= deadline {
                return Err(Error::Timeout { what: format!("a connection to {}", self.addr), secs: 0.0 });
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}
