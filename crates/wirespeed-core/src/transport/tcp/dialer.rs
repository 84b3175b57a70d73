//! The dialer: one attempt at a connection (connect every stream, say hello on each, read the
//! listener's answers), polled by its owner (`Dialer`) or driven by the reactor (dial.rs).
use super::auth::{self, MAC_LEN, NONCE_LEN};
use super::conn::{make_conn, Conn};
use super::handshake::{hello_bytes, Told};
use super::reactor::Reactor;
use super::stream::{send_vectored, would_block};
use super::{NetConfig, AUTH_ACK, REFUSED_PREFIX};
use crate::error::{Error, Result};
use std::io::{IoSlice, Read};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

enum DialStream {
    Connecting(TcpStream),
    /// Sending `out`, then reading `want` bytes: the echo of the hello (no secret), or the
    /// listener's nonce and proof (`hello` kept to check it), then the acceptance.
    Greeting { sock: TcpStream, out: Vec<u8>, sent: usize, buf: Vec<u8>, got: usize, step: Greet },
    Ready(TcpStream),
}

#[derive(Clone, Copy, PartialEq)]
enum Greet {
    /// Expecting the hello echoed.
    Echo,
    /// Expecting the listener's nonce and its proof.
    Challenge,
    /// Our proof sent; expecting AUTH_ACK.
    Ack,
}

/// A connection being made without blocking: call `poll` until it returns the `Conn`.
pub struct Dialer {
    reactor: Arc<Reactor>,
    attempt: Attempt,
}

/// One try at a connection's streams: connect, hello, (proofs,) echo. Polled by a `Dialer`'s
/// caller or, for a `DialTask`, by the reactor on the sockets' events.
pub(super) struct Attempt {
    /// Set when a stream's connect was refused: nothing listens at the address.
    pub(super) refused: bool,
    cfg: NetConfig,
    addr: SocketAddr,
    key: [u8; 32],
    /// Each stream's nonce, with a job secret (its hello carries it); empty without.
    nonces: Vec<[u8; NONCE_LEN]>,
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
        Ok(Dialer { reactor: reactor.clone(), attempt: Attempt::start(cfg, addr, key, nstreams)? })
    }

    /// Advance every stream as far as it goes without blocking; the `Conn` once all are greeted.
    pub fn poll(&mut self) -> Result<Option<Conn>> {
        match self.attempt.poll()? {
            None => Ok(None),
            Some(socks) => make_conn(&self.reactor, &self.attempt.cfg, socks, self.attempt.addr).map(Some),
        }
    }

    /// Poll until connected or `deadline`, sleeping briefly between polls.
    pub fn finish(mut self, deadline: Instant) -> Result<Conn> {
        loop {
            if let Some(c) = self.poll()? {
                return Ok(c);
            }
            if Instant::now() >= deadline {
                return Err(Error::Timeout { what: format!("a connection to {}", self.attempt.addr), secs: 0.0 });
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

impl Attempt {
    pub(super) fn start(cfg: &NetConfig, addr: SocketAddr, key: [u8; 32], nstreams: usize) -> Result<Attempt> {
        if nstreams == 0 || nstreams > 64 {
            return Err(Error::Unsupported(format!("{nstreams} streams per connection: give 1 to 64")));
        }
        let cfg = *cfg;
        let nonces = match cfg.secret {
            Some(_) => (0..nstreams).map(|_| auth::nonce()).collect::<Result<Vec<_>>>()?,
            None => vec![],
        };
        let streams = (0..nstreams).map(|_| connect_nonblocking(addr).map(|s| Some(DialStream::Connecting(s)))).collect::<Result<Vec<_>>>()?;
        Ok(Attempt { cfg, addr, key, nonces, streams, refused: false })
    }

    /// The sockets of this try, for the reactor to watch.
    pub(super) fn fds(&self) -> Vec<i32> {
        self.streams.iter().flatten().map(|s| match s {
            DialStream::Connecting(sock) | DialStream::Greeting { sock, .. } | DialStream::Ready(sock) => sock.as_raw_fd(),
        }).collect()
    }

    /// Advance every stream as far as it goes without blocking; the streams once all are greeted.
    /// A loss on one stream (refused, reset: the listener's process may have left at once after
    /// refusing) gives way to a final refusal another stream of the try was told before it
    /// (the listener wrote it before it closed, so it is already here): that is the cause.
    pub(super) fn poll(&mut self) -> Result<Option<Vec<TcpStream>>> {
        let r = self.poll_streams();
        if let Err(Error::PeerLost(_)) = &r {
            if let Some(t) = self.told_on_any() {
                self.refused = false;
                return Err(Error::Stranger(format!("the listener at {} refused this rank: {}", self.addr, t.text())));
            }
        }
        r
    }

    /// A final refusal waiting on a stream still greeting, read without taking it.
    fn told_on_any(&self) -> Option<Told> {
        self.streams.iter().flatten().find_map(|s| match s {
            DialStream::Greeting { sock, buf, got, .. } => {
                let mut answer = buf[..*got].to_vec();
                let mut more = [0u8; REFUSED_PREFIX.len() + 1];
                let want = more.len().saturating_sub(*got);
                if let Ok(n) = sock.peek(&mut more[..want]) {
                    answer.extend_from_slice(&more[..n]);
                }
                told(&answer)
            }
            _ => None,
        })
    }

    fn poll_streams(&mut self) -> Result<Option<Vec<TcpStream>>> {
        let n = self.streams.len() as u32;
        let addr = self.addr;
        let lost = |why: String| Error::PeerLost(format!("connecting to {addr}: {why}"));
        // What the listener said before it closed (handshake.rs `Told`): final, so a Stranger.
        let refused = |t: Told| Error::Stranger(format!("the listener at {addr} refused this rank: {}", t.text()));
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
                            self.refused |= e.kind() == std::io::ErrorKind::ConnectionRefused;
                            return Err(lost(format!("{e}")));
                        }
                        if p.revents & (libc::POLLERR | libc::POLLHUP) != 0 {
                            return Err(lost("the connection was refused or reset".into()));
                        }
                        let hello = hello_bytes(&self.key, i as u32, n, self.nonces.get(i));
                        let (want, step) = if self.cfg.secret.is_some() { (NONCE_LEN + MAC_LEN, Greet::Challenge) } else { (hello.len(), Greet::Echo) };
                        DialStream::Greeting { sock, out: hello, sent: 0, buf: vec![0; want], got: 0, step }
                    }
                }
                DialStream::Greeting { sock, mut out, mut sent, mut buf, mut got, mut step } => {
                    loop {
                        while sent < out.len() {
                            match send_vectored(sock.as_raw_fd(), &[IoSlice::new(&out[sent..])]) {
                                Ok(k) => sent += k,
                                Err(e) if would_block(&e) => break,
                                Err(e) => return Err(lost(format!("the handshake failed ({e})"))),
                            }
                        }
                        while sent == out.len() && got < buf.len() {
                            match (&sock).read(&mut buf[got..]) {
                                Ok(0) if told(&buf[..got]).is_some() => return Err(refused(told(&buf[..got]).unwrap())),
                                Ok(0) => return Err(lost(if step == Greet::Echo {
                                    "the listener refused this connection (wrong job, rank or key)".into()
                                } else {
                                    "the listener refused this connection (wrong job, rank, key or job secret)".into()
                                })),
                                Ok(k) => got += k,
                                Err(e) if would_block(&e) => break,
                                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                                Err(e) => return Err(lost(format!("the handshake failed ({e})"))),
                            }
                        }
                        if got < buf.len() {
                            break DialStream::Greeting { sock, out, sent, buf, got, step };
                        }
                        // A final refusal fills an 8-byte answer (the proof's ack) exactly.
                        if let Some(t) = told(&buf) {
                            return Err(refused(t));
                        }
                        let hello = hello_bytes(&self.key, i as u32, n, self.nonces.get(i));
                        match step {
                            Greet::Echo if buf == hello => break DialStream::Ready(sock),
                            Greet::Ack if buf == AUTH_ACK => break DialStream::Ready(sock),
                            Greet::Echo | Greet::Ack => {
                                return Err(Error::Stranger(format!("the process at {addr} answered the handshake with something else")))
                            }
                            Greet::Challenge => {
                                let secret = self.cfg.secret.expect("a challenge is read only with a secret");
                                let (nonce, proof) = buf.split_at(NONCE_LEN);
                                if !secret.check_listener(&hello, nonce, proof) {
                                    return Err(Error::Stranger(format!(
                                        "the process at {addr} does not know this job's secret: a rank of another job, or not a rank at all, listens where a rank should"
                                    )));
                                }
                                out = secret.dialer_proof(&hello, nonce).to_vec();
                                (sent, got, buf, step) = (0, 0, vec![0; AUTH_ACK.len()], Greet::Ack);
                            }
                        }
                    }
                }
                ready => ready,
            });
        }
        if !self.streams.iter().all(|s| matches!(s, Some(DialStream::Ready(_)))) {
            return Ok(None);
        }
        Ok(Some(self.streams.drain(..).map(|s| match s {
            Some(DialStream::Ready(s)) => s,
            _ => unreachable!("checked above"),
        }).collect()))
    }
}

/// The listener's final refusal, when `answer` (what it sent before closing) is one.
fn told(answer: &[u8]) -> Option<Told> {
    (answer.len() == REFUSED_PREFIX.len() + 1 && answer[..REFUSED_PREFIX.len()] == REFUSED_PREFIX).then(|| Told::from_code(answer[REFUSED_PREFIX.len()])).flatten()
}
