//! Handshake: hellos and the listener, which vets them (dialer.rs dials).
use super::conn::{make_conn, Conn};
use super::stream::would_block;
use super::reactor::{Entry, Reactor, Ready};
use super::auth::{self, Secret, MAC_LEN, NONCE_LEN};
use super::{NetConfig, AUTH_ACK, HELLO_AUTH_LEN, HELLO_LEN, HELLO_MAGIC, HELLO_MAGIC_AUTH, HELLO_TIMEOUT, MAX_PENDING, REFUSED_PREFIX};
use crate::error::{Error, Result};
use mio::Interest;
use std::collections::{HashMap, VecDeque};
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicUsize, Ordering::*};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

/// A stream's hello: 48 bytes, and with a job secret the dialer's nonce after them (the magic
/// says which).
pub(super) fn hello_bytes(key: &[u8; 32], stream: u32, nstreams: u32, nonce: Option<&[u8; NONCE_LEN]>) -> Vec<u8> {
    let magic = if nonce.is_some() { HELLO_MAGIC_AUTH } else { HELLO_MAGIC };
    let mut b = Vec::with_capacity(HELLO_AUTH_LEN);
    b.extend_from_slice(&magic.to_le_bytes());
    b.extend_from_slice(key);
    b.extend_from_slice(&stream.to_le_bytes());
    b.extend_from_slice(&nstreams.to_le_bytes());
    if let Some(n) = nonce {
        b.extend_from_slice(n);
    }
    b
}

fn magic_of(b: &[u8]) -> u64 {
    u64::from_le_bytes(b[0..8].try_into().unwrap())
}

/// (key, stream, nstreams) of a whole hello of either kind; None for a bad magic.
fn parse_hello(b: &[u8]) -> Option<([u8; 32], u32, u32)> {
    if ![HELLO_MAGIC, HELLO_MAGIC_AUTH].contains(&magic_of(b)) {
        return None;
    }
    let w = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap());
    Some((b[8..40].try_into().unwrap(), w(40), w(44)))
}

/// Whether the dialer closed `sock` (end of stream, or a reset): a stream in a bundle is silent
/// until its connection is whole, so anything but "nothing to read yet" or bytes means it is gone.
fn dialer_closed(sock: &TcpStream) -> bool {
    let mut b = [0u8; 1];
    match sock.peek(&mut b) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => !would_block(&e) && e.kind() != std::io::ErrorKind::Interrupted,
    }
}

/// Drop `key`'s bundle if its dialer closed any stream of it. A dialer makes one try at a time
/// and closes every stream of a try that failed (one stream refused or reset) before it tries
/// again (dial.rs, and the eager dialers in hosts/mesh.rs), so such a bundle is the leftover of
/// an abandoned try: kept, its streams would refuse the retry's streams of the same index as
/// duplicates (until it expired, 5 s later), or complete it with streams nobody writes to, and
/// the connection would be made of two tries, one side holding a stream the other side closed.
/// Not a refusal: the dialer itself gave those streams up.
fn forget_abandoned(bundles: &mut HashMap<[u8; 32], Bundle>, key: &[u8; 32]) {
    if bundles.get(key).is_some_and(|b| b.streams.iter().flatten().any(dialer_closed)) {
        bundles.remove(key);
    }
}

/// Write a few handshake bytes on a non-blocking socket: into an empty send buffer they always
/// fit at once, and a peer that stops reading gets HELLO_TIMEOUT (the reactor thread waits that
/// long at most, as it always did for the echo).
fn write_small(sock: &TcpStream, bytes: &[u8]) -> bool {
    let _ = sock.set_nonblocking(false);
    let _ = sock.set_write_timeout(Some(HELLO_TIMEOUT));
    let ok = (&*sock).write_all(bytes).is_ok();
    let _ = sock.set_nonblocking(true);
    ok
}

/// Decides whether a dialer's key belongs here; the reason is logged when it does not, except
/// an empty reason: a refusal that is part of the protocol (a group's crossing dials, where the
/// lower rank's dial wins), dropped quietly and not counted.
pub type Vet = Box<dyn Fn(&[u8; 32]) -> std::result::Result<(), Refusal> + Send + Sync>;

/// What a refused dialer is told before the listener closes: nothing (it may try again, as for a
/// listener not ready for it yet), or that its job's token or secret is not this rank's, which
/// no retry can change. Only those few words: the dialer is not authenticated, and a stranger
/// learns nothing from them it did not send (its own key, its own secret or lack of one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Told {
    Nothing = 0,
    /// The key's job token differs (with the job identities compared at rendezvous: the secret).
    OtherToken = 1,
    /// The dialer proves a secret, this rank has none.
    NoSecretHere = 2,
    /// This rank requires a secret, the dialer has none.
    SecretRequired = 3,
    /// The dialer's proof of the secret is wrong.
    WrongSecret = 4,
}

impl Told {
    /// The refusal frame's text at the dialer (dialer.rs); None for an unknown code.
    pub(super) fn from_code(c: u8) -> Option<Told> {
        [Told::OtherToken, Told::NoSecretHere, Told::SecretRequired, Told::WrongSecret].into_iter().find(|t| *t as u8 == c)
    }
    pub(super) fn text(self) -> &'static str {
        match self {
            Told::Nothing => "refused",
            Told::OtherToken => "its job secret is not this rank's (the job tokens they prove differ)",
            Told::NoSecretHere => "it has no job secret and this rank has one",
            Told::SecretRequired => "it requires a job secret and this rank has none",
            Told::WrongSecret => "its job secret is not this rank's (it refused this rank's proof)",
        }
    }
}

/// A `Vet`'s no: the line the listener logs, and what the dialer is told.
#[derive(Debug)]
pub struct Refusal {
    pub why: String,
    pub told: Told,
}

impl From<String> for Refusal {
    fn from(why: String) -> Refusal {
        Refusal { why, told: Told::Nothing }
    }
}

impl From<&str> for Refusal {
    fn from(why: &str) -> Refusal {
        why.to_string().into()
    }
}
/// Where a listener says it refused a connection (the NCCL plugin passes NCCL's logger); without
/// one, the line goes to stderr.
pub type Report = Box<dyn Fn(&str) + Send + Sync>;
/// Where a listener hands a connection whose streams all passed their handshake, instead of
/// queueing it for `poll_accept`: (key, streams in index order, the dialer's address). Called
/// on a reactor thread, with no lock of the listener held.
pub type Handoff = Box<dyn Fn(&[u8; 32], Vec<TcpStream>, SocketAddr) + Send + Sync>;

/// Where an accepted stream is in its handshake.
enum Phase {
    /// Reading the hello (`want` grows to HELLO_AUTH_LEN when its magic says a proof follows).
    Hello,
    /// Challenged with `nonce`; reading the dialer's proof into `proof`.
    Proof { key: [u8; 32], stream: u32, n: u32, nonce: [u8; NONCE_LEN], proof: [u8; MAC_LEN], got: usize },
}

struct PendingHello {
    sock: TcpStream,
    from: SocketAddr,
    buf: [u8; HELLO_AUTH_LEN],
    have: usize,
    want: usize,
    phase: Phase,
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
    secret: Option<Secret>,
    label: String,
    report: Option<Report>,
    route: Option<Handoff>,
    state: Mutex<ListenerState>,
    refused: AtomicUsize,
    /// Refusals of the protocol's own (`Vet`'s empty reason): not logged, not in `refused`.
    quiet_refusals: AtomicUsize,
    /// Per reason: when it was last logged, and refusals of it not logged since. A peer that
    /// retries (12 streams a dial, a dial every second) must not fill the log.
    quiet: Mutex<HashMap<String, (Instant, usize)>>,
    token: OnceLock<(usize, usize)>,
}

/// A reason already logged is logged again at most this often, with the count in between.
const REFUSAL_LOG_EVERY: Duration = Duration::from_secs(5);

/// A listening socket whose connections are vetted in the background by the reactor.
pub struct Listener {
    inner: Arc<ListenerInner>,
    reactor: Arc<Reactor>,
    cfg: NetConfig,
    addr: SocketAddr,
}

impl Ready for ListenerInner {
    fn ready(self: Arc<Self>, _: bool, _: bool) {
        self.accept_all();
    }

    fn tick(self: Arc<Self>) {
        self.expire();
        // A connection whose accept failed (no descriptor free, for a moment) is still
        // queued, and only a new connection would raise the listener's edge again: a
        // dialer (a group's lazy dial, whose peer waits on it) would stall to its
        // deadline. One accept that finds nothing, per listener and tick, otherwise.
        self.accept_all();
    }
}

/// An accepted stream saying hello: its listener reads it (while the listener lives).
struct Hello {
    listener: Weak<ListenerInner>,
    id: usize,
}

impl Ready for Hello {
    fn ready(self: Arc<Self>, _: bool, _: bool) {
        if let Some(l) = self.listener.upgrade() {
            l.read_hello(self.id);
        }
    }
}

impl ListenerInner {
    fn refuse(&self, from: SocketAddr, why: &str) {
        if why.is_empty() {
            self.quiet_refusals.fetch_add(1, SeqCst);
            return; // a refusal of the protocol's own (see `Vet`)
        }
        self.refused.fetch_add(1, SeqCst);
        let mut more = String::new();
        {
            let mut quiet = self.quiet.lock().unwrap();
            let now = Instant::now();
            match quiet.get_mut(why) {
                Some((at, n)) if now.duration_since(*at) < REFUSAL_LOG_EVERY => {
                    *n += 1;
                    return;
                }
                Some((at, n)) => {
                    if *n > 0 {
                        more = format!(" ({n} more for this reason since it was last logged)");
                    }
                    (*at, *n) = (now, 0);
                }
                None => {
                    if quiet.len() >= 256 {
                        quiet.clear(); // reasons can carry a stranger's numbers: bounded memory
                    }
                    quiet.insert(why.to_string(), (now, 0));
                }
            }
        }
        let line = format!("{} refused a connection from {from}: {why}{more}", self.label);
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
                    st.hellos.insert(id, PendingHello { sock, from, buf: [0; HELLO_AUTH_LEN], have: 0, want: HELLO_LEN, phase: Phase::Hello, since: Instant::now(), token: 0, thread });
                    drop(st);
                    match reactor.register(thread, fd, Interest::READABLE, Entry::Held(Arc::new(Hello { listener: Arc::downgrade(self), id }))) {
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
                // A connection reset in the queue, or a signal: the next one may be fine.
                Err(e) if matches!(e.kind(), std::io::ErrorKind::ConnectionAborted | std::io::ErrorKind::Interrupted) => continue,
                // Out of descriptors or memory, for now: what stays queued raises no new edge,
                // so the reactor's tick calls this again (reactor.rs).
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

    /// Give up on a pending stream: forget it, shut it, log why.
    fn give_up(&self, reactor: &Reactor, st: std::sync::MutexGuard<'_, ListenerState>, id: usize, why: &str) {
        self.give_up_telling(reactor, st, id, &Refusal { why: why.to_string(), told: Told::Nothing });
    }

    /// `give_up`, first telling the dialer why when the refusal is final (`Told`): 8 bytes, fewer
    /// than any answer the dialer reads, so they are read whole before the close.
    fn give_up_telling(&self, reactor: &Reactor, st: std::sync::MutexGuard<'_, ListenerState>, id: usize, r: &Refusal) {
        let mut st = st;
        let Some(h) = st.hellos.remove(&id) else { return };
        drop(st);
        self.drop_hello(reactor, &h);
        if r.told != Told::Nothing {
            let mut frame = REFUSED_PREFIX.to_vec();
            frame.push(r.told as u8);
            let _ = write_small(&h.sock, &frame);
        }
        let _ = h.sock.shutdown(Shutdown::Both);
        self.refuse(h.from, &r.why);
    }

    /// Read what a pending stream has sent, and move its handshake on: a whole hello is vetted
    /// (and, with a job secret, answered with a challenge), a whole proof checked.
    pub(super) fn read_hello(self: &Arc<Self>, id: usize) {
        let Some(reactor) = self.reactor.upgrade() else { return };
        let mut st = self.state.lock().unwrap();
        loop {
            let state = &mut *st; // disjoint borrows of the pending streams and the bundles
            let Some(h) = state.hellos.get_mut(&id) else { return };
            // Read into what this phase still wants, never past it.
            let (target, have): (&mut [u8], &mut usize) = match &mut h.phase {
                Phase::Hello => (&mut h.buf[..h.want], &mut h.have),
                Phase::Proof { proof, got, .. } => (&mut proof[..], got),
            };
            if *have < target.len() {
                match (&h.sock).read(&mut target[*have..]) {
                    Ok(0) => return self.give_up(&reactor, st, id, "closed before its handshake ended"),
                    Ok(n) => *have += n,
                    Err(e) if would_block(&e) => return,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => return self.give_up(&reactor, st, id, &format!("failed during its hello ({e})")),
                }
                // The magic tells whether a nonce follows the 48 bytes.
                if matches!(h.phase, Phase::Hello) && h.want == HELLO_LEN && h.have >= 8 && magic_of(&h.buf) == HELLO_MAGIC_AUTH {
                    h.want = HELLO_AUTH_LEN;
                }
                continue;
            }
            // This phase's bytes are all here.
            match h.phase {
                Phase::Hello => {
                    let hello = h.buf[..h.want].to_vec();
                    let verdict = match parse_hello(&hello) {
                        None => Err(Refusal::from("not a wirespeed hello (bad magic)")),
                        Some((_, stream, n)) if n == 0 || n > 64 || stream >= n => Err(format!("stream {stream} of {n} makes no sense").into()),
                        Some((key, stream, n)) => (self.vet)(&key).map(|_| (key, stream, n)),
                    };
                    let (key, stream, n) = match verdict {
                        Ok(v) => v,
                        Err(r) => return self.give_up_telling(&reactor, st, id, &r),
                    };
                    let proves = magic_of(&hello) == HELLO_MAGIC_AUTH;
                    let secret = match (self.secret, proves) {
                        (None, false) => None,
                        (Some(s), true) => Some(s),
                        (Some(_), false) => return self.give_up_telling(&reactor, st, id, &Refusal { why: "it has no job secret, and this job requires one: give every rank the same WIRESPEED_JOB_SECRET".into(), told: Told::SecretRequired }),
                        (None, true) => return self.give_up_telling(&reactor, st, id, &Refusal { why: "it proves a job secret and this rank has none: give every rank the same WIRESPEED_JOB_SECRET".into(), told: Told::NoSecretHere }),
                    };
                    forget_abandoned(&mut state.bundles, &key);
                    if let Some(b) = state.bundles.get(&key) {
                        if b.streams.len() != n as usize || b.streams[stream as usize].is_some() {
                            return self.give_up(&reactor, st, id, &format!("a duplicate or inconsistent stream {stream} of {n}"));
                        }
                    }
                    let Some(secret) = secret else {
                        // No secret: the hello echoed accepts the stream.
                        let h = st.hellos.remove(&id).unwrap();
                        self.drop_hello(&reactor, &h);
                        return self.accept_stream(st, h.sock, h.from, key, stream, n, &hello);
                    };
                    let nonce = match auth::nonce() {
                        Ok(nonce) => nonce,
                        Err(e) => return self.give_up(&reactor, st, id, &format!("no nonce to challenge it with ({e})")),
                    };
                    let mut challenge = nonce.to_vec();
                    challenge.extend_from_slice(&secret.listener_proof(&hello, &nonce));
                    if !write_small(&h.sock, &challenge) {
                        return self.give_up(&reactor, st, id, "went away during the handshake");
                    }
                    h.phase = Phase::Proof { key, stream, n, nonce, proof: [0; MAC_LEN], got: 0 };
                }
                Phase::Proof { key, stream, n, nonce, proof, .. } => {
                    let hello = h.buf[..h.want].to_vec();
                    let ok = self.secret.is_some_and(|s| s.check_dialer(&hello, &nonce, &proof));
                    if !ok {
                        return self.give_up_telling(&reactor, st, id, &Refusal { why: "it does not know this job's secret (a rank of another job, or not a rank at all)".into(), told: Told::WrongSecret });
                    }
                    // Vetted again: the listener may have stopped expecting this key (setup
                    // sealed) while the proof was on its way.
                    if let Err(r) = (self.vet)(&key) {
                        return self.give_up_telling(&reactor, st, id, &r);
                    }
                    let h = st.hellos.remove(&id).unwrap();
                    self.drop_hello(&reactor, &h);
                    return self.accept_stream(st, h.sock, h.from, key, stream, n, &AUTH_ACK);
                }
            }
        }
    }

    /// A stream whose handshake held: tell the dialer (`reply`) and add it to its connection's
    /// bundle, which is ready once every stream of the key has come.
    #[allow(clippy::too_many_arguments)]
    fn accept_stream(&self, mut st: std::sync::MutexGuard<'_, ListenerState>, sock: TcpStream, from: SocketAddr, key: [u8; 32], stream: u32, n: u32, reply: &[u8]) {
        // Again here: with a job secret, the proof took a round trip since the hello's check.
        forget_abandoned(&mut st.bundles, &key);
        let b = st.bundles.entry(key).or_insert_with(|| Bundle { streams: (0..n).map(|_| None).collect(), from, since: Instant::now() });
        if b.streams.len() != n as usize || b.streams[stream as usize].is_some() {
            drop(st);
            let _ = sock.shutdown(Shutdown::Both);
            return self.refuse(from, &format!("a duplicate or inconsistent stream {stream} of {n}"));
        }
        if !write_small(&sock, reply) {
            drop(st);
            return self.refuse(from, "went away during the handshake");
        }
        b.streams[stream as usize] = Some(sock);
        if b.streams.iter().all(|s| s.is_some()) {
            let b = st.bundles.remove(&key).unwrap();
            let socks: Vec<TcpStream> = b.streams.into_iter().map(|s| s.unwrap()).collect();
            match &self.route {
                Some(route) => {
                    drop(st);
                    route(&key, socks, b.from);
                }
                None => st.ready.push_back((key, socks, b.from)),
            }
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
            refused.push((h.from, "did not finish its handshake within 5 s"));
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

/// Connections the kernel may hold for this listener before `accept`: std's `bind` listens with
/// 128, and at setup every stream of every rank on other hosts dials at once (docs/scale.md:
/// ~19,000 at 1,024 hosts x 8 ranks), so SYNs past 128 would be dropped and retried after 1, 2, 4 s,
/// and setup would stall in steps. The kernel caps this at `net.core.somaxconn`; rank 0 says so
/// when that is below what its group's layout may dial at one rank (hosts/fds.rs, `backlog_line`).
const LISTEN_BACKLOG: libc::c_int = 65_535;

fn deepen_backlog(sock: &TcpListener) {
    use std::os::fd::AsRawFd;
    // SAFETY: listen() on a socket this function borrows, open and bound; a second listen() on a
    // listening socket only changes its backlog (Linux), and a failure leaves the old one.
    let _ = unsafe { libc::listen(sock.as_raw_fd(), LISTEN_BACKLOG) };
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
        Listener::bind_routed(reactor, cfg, addr, vet, label, report, None)
    }

    /// `bind_vetted`, and with `route` every connection accepted goes there, on the reactor's
    /// thread, as soon as its streams are all in (`poll_accept` then has nothing): how a
    /// group's lazy connections attach to the `Conn` already waiting for them.
    pub fn bind_routed(reactor: &Arc<Reactor>, cfg: &NetConfig, addr: SocketAddr, vet: Vet, label: String, report: Option<Report>, route: Option<Handoff>) -> Result<Listener> {
        let cfg = *cfg;
        let sock = TcpListener::bind(addr).map_err(|e| Error::Unsupported(format!("cannot listen on {addr}: {e}")))?;
        deepen_backlog(&sock);
        let addr = sock.local_addr().map_err(|_| Error::os("getsockname"))?;
        sock.set_nonblocking(true).map_err(|_| Error::os("fcntl"))?;
        let inner = Arc::new(ListenerInner {
            sock,
            reactor: Arc::downgrade(reactor),
            vet,
            secret: cfg.secret,
            label,
            report,
            route,
            state: Mutex::new(ListenerState { hellos: HashMap::new(), next_hello: 0, bundles: HashMap::new(), ready: VecDeque::new() }),
            refused: AtomicUsize::new(0),
            quiet_refusals: AtomicUsize::new(0),
            quiet: Mutex::new(HashMap::new()),
            token: OnceLock::new(),
        });
        let thread = reactor.pick();
        let fd = inner.sock.as_raw_fd();
        let tok = reactor.register(thread, fd, Interest::READABLE, Entry::Ticked(Arc::downgrade(&inner) as Weak<ListenerInner>))?;
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

    /// `refused`, as a function that outlives this borrow (for errors raised later).
    pub fn clone_refused(&self) -> Arc<dyn Fn() -> usize + Send + Sync> {
        let inner = self.inner.clone();
        Arc::new(move || inner.refused.load(SeqCst))
    }

    /// Streams refused quietly, as the protocol asks (`Vet`): a group's crossing dials.
    pub fn quiet_refusals(&self) -> usize {
        self.inner.quiet_refusals.load(SeqCst)
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
