//! A dial driven by the reactor: the connection's streams are connected, greeted and handed over
//! on the reactor's threads, on the sockets' events, so nobody's thread waits for it. This is what
//! makes a group's lazy connections safe (docs/transport.md, "Connections on first use"): the
//! thread that posted the first send to a peer returns at once, and the connection is made
//! whatever that thread, or the peer's application thread, does meanwhile.
//!
//! A try that fails (the peer's listener refused it, a reset, no route) is tried again after a
//! pause that doubles from 10 ms to 1 s, until `deadline`; a listener that proves to be a stranger
//! (another job's secret) ends the dial at once. `done` gets the streams, or the error (the last
//! try's reason in a timeout). A connect refused is final too: the dial's owner publishes an
//! address only once its listener is bound, so a refusal means that listener is gone. `wanted` is asked before each try: when it says no (the other side's
//! dial won), the dial stops quietly and `done` is not called (a try under way is finished
//! first, so that the peer reads a whole hello it refuses quietly, not a connection closed
//! before it said anything, which it would log as a stranger's).
use super::dialer::Attempt;
use super::reactor::{Entry, Reactor, Ready};
use super::NetConfig;
use crate::error::{Error, Result};
use mio::Interest;
use std::net::{SocketAddr, TcpStream};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

/// What a dial hands its owner: the streams past their handshake, or why there are none.
pub type DialDone = Box<dyn FnOnce(Result<Vec<TcpStream>>) + Send>;
/// Whether the owner still wants the connection (asked before each try).
pub type Wanted = Box<dyn Fn() -> bool + Send + Sync>;
/// Told why each failed try failed (for the owner's errors while it waits).
pub type Tried = Box<dyn Fn(&str) + Send + Sync>;

pub(super) struct DialTask {
    reactor: Weak<Reactor>,
    cfg: NetConfig,
    addr: SocketAddr,
    key: [u8; 32],
    nstreams: usize,
    deadline: Instant,
    timeout: Duration,
    thread: usize,
    token: usize,
    wanted: Wanted,
    tried: Tried,
    st: Mutex<DialState>,
}

struct DialState {
    attempt: Option<Attempt>,
    /// The sockets of `attempt` the reactor watches under this task's token.
    fds: Vec<i32>,
    retry_at: Instant,
    pause: Duration,
    last: Option<String>,
    /// Taken when the dial ends: None afterwards.
    done: Option<DialDone>,
}

/// Start dialling `addr` with `nstreams` streams greeting with `key`; the reactor carries it on
/// and calls `done` once, unless `wanted` says no first. The first try is made `after` from now
/// (at once when zero; else on a reactor tick, `wanted` asked first: a dial the peer made
/// meanwhile ends this one before it opens a socket). `timeout` from now is the deadline.
#[allow(clippy::too_many_arguments)]
pub fn spawn(reactor: &Arc<Reactor>, cfg: &NetConfig, addr: SocketAddr, key: [u8; 32], nstreams: usize, after: Duration, timeout: Duration, wanted: Wanted, tried: Tried, done: DialDone) -> Result<()> {
    let thread = reactor.pick();
    let now = Instant::now();
    let task = Arc::new_cyclic(|_: &Weak<DialTask>| DialTask {
        reactor: Arc::downgrade(reactor),
        cfg: *cfg,
        addr,
        key,
        nstreams,
        deadline: now + timeout,
        timeout,
        thread,
        token: reactor.next_token.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        wanted,
        tried,
        st: Mutex::new(DialState { attempt: None, fds: Vec::new(), retry_at: now + after, pause: Duration::from_millis(10), last: None, done: Some(done) }),
    });
    if !after.is_zero() {
        // The reactor's ticks (100 ms) start it once `retry_at` has come.
        reactor.threads[thread].entries.lock().unwrap().insert(task.token, Entry::Held(task));
        return Ok(());
    }
    // The first try starts here, on the caller's thread (the sockets' connects are
    // non-blocking); from the registration on, their events drive it on the reactor.
    reactor.threads[thread].entries.lock().unwrap().insert(task.token, Entry::Held(task.clone()));
    let mut st = task.st.lock().unwrap();
    if let Err(e) = task.try_again(reactor, &mut st) {
        drop(st);
        task.end(reactor);
        return Err(e);
    }
    Ok(())
}

/// A dial moves on at its sockets' events and at every tick (retries and its deadline, for
/// which no socket event comes).
impl Ready for DialTask {
    fn ready(self: Arc<Self>, _: bool, _: bool) {
        self.advance();
    }

    fn tick(self: Arc<Self>) {
        self.advance();
    }
}

impl DialTask {
    /// Open a new try's sockets and watch them. epoll reports a socket that is already
    /// connected when it is added, so a fast connect raises its event too.
    fn try_again(&self, reactor: &Reactor, st: &mut DialState) -> Result<()> {
        let a = Attempt::start(&self.cfg, self.addr, self.key, self.nstreams)?;
        st.fds = a.fds();
        st.attempt = Some(a);
        for &fd in &st.fds {
            reactor.watch(self.thread, self.token, fd, Interest::READABLE | Interest::WRITABLE)?;
        }
        Ok(())
    }

    fn drop_try(&self, reactor: &Reactor, st: &mut DialState) {
        for fd in st.fds.drain(..) {
            reactor.unwatch(self.thread, fd);
        }
        st.attempt = None;
    }

    /// Forget this task in the reactor (the entry held it alive).
    fn end(&self, reactor: &Reactor) {
        reactor.threads[self.thread].entries.lock().unwrap().remove(&self.token);
    }

    /// Move the dial on: on a socket's event, and on every reactor tick (retries, the deadline).
    pub(super) fn advance(&self) {
        let Some(reactor) = self.reactor.upgrade() else { return };
        // Asked before our lock is taken: the owner's answer takes its own locks, and the owner
        // may hold them while it starts a dial (never while it waits for this one).
        let wanted = (self.wanted)();
        let mut st = self.st.lock().unwrap();
        if st.done.is_none() {
            return;
        }
        let now = Instant::now();
        let outcome: Option<Result<Vec<TcpStream>>> = if !wanted && (st.attempt.is_none() || now >= self.deadline) {
            st.done = None; // quietly: the owner has its connection another way
            self.drop_try(&reactor, &mut st);
            None
        } else if !wanted {
            // A try under way is finished, not cut: the peer's listener refuses it quietly once
            // it has read the hello, where sockets closed before their hello would be logged
            // there as strangers' ("closed before its handshake ended").
            let a = st.attempt.as_mut().expect("checked above");
            match a.poll().and_then(|r| if r.is_none() { a.poll() } else { Ok(r) }) {
                Ok(None) => return,
                _ => {
                    st.done = None;
                    self.drop_try(&reactor, &mut st);
                    None
                }
            }
        } else {
            if st.attempt.is_none() && now >= st.retry_at && now < self.deadline {
                if let Err(e) = self.try_again(&reactor, &mut st) {
                    (self.tried)(&e.to_string());
                    st.last = Some(e.to_string());
                    self.drop_try(&reactor, &mut st);
                    st.retry_at = now + st.pause;
                    st.pause = (st.pause * 2).min(Duration::from_secs(1));
                }
            }
            // Twice: a stream that just connected sends its hello on the second pass (no new
            // event would come for a socket that was writable all along).
            let mut r = Ok(None);
            if let Some(a) = st.attempt.as_mut() {
                r = a.poll();
                if matches!(r, Ok(None)) {
                    r = a.poll();
                }
                // Nothing listens at the address. Its owner published it only once its
                // listener was bound, so the listener is gone (the process exited): final.
                if let (true, Err(e)) = (a.refused, &r) {
                    let e = Error::PeerLost(format!("{e}: nothing listens there any more (the process exited or closed its listener)"));
                    self.drop_try(&reactor, &mut st);
                    let done = st.done.take().expect("checked above");
                    drop(st);
                    self.end(&reactor);
                    return done(Err(e));
                }
            }
            match r {
                Ok(Some(socks)) => {
                    self.drop_try(&reactor, &mut st);
                    Some(Ok(socks))
                }
                // Another job's process (or one with another secret) at the address: trying
                // again cannot change that.
                Err(e @ Error::Stranger(_)) => {
                    self.drop_try(&reactor, &mut st);
                    Some(Err(e))
                }
                Err(e) => {
                    (self.tried)(&e.to_string());
                    st.last = Some(e.to_string());
                    self.drop_try(&reactor, &mut st);
                    st.retry_at = now + st.pause;
                    st.pause = (st.pause * 2).min(Duration::from_secs(1));
                    None
                }
                Ok(None) if now >= self.deadline => {
                    self.drop_try(&reactor, &mut st);
                    let last = st.last.as_ref().map(|l| format!(" (last try: {l})")).unwrap_or_default();
                    Some(Err(Error::Timeout { what: format!("a connection to {}{last}", self.addr), secs: self.timeout.as_secs_f64() }))
                }
                Ok(None) => None,
            }
        };
        let Some(outcome) = outcome else {
            if st.done.is_none() {
                drop(st);
                self.end(&reactor);
            }
            return;
        };
        let done = st.done.take().expect("checked above");
        drop(st);
        self.end(&reactor);
        done(outcome);
    }
}
