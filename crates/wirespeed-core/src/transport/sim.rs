//! An in-memory simulated network: N ranks in one process, deterministic, with per-link latency
//! and bandwidth, a per-flow cap, and faults (a rank that dies, stalls, or sends garbage).
//!
//! Each rank runs the code under test on its own thread, but only one thread runs at a time: the
//! rank holding the turn runs until it waits on an operation that is not complete (or finishes);
//! then the scheduler hands the turn to the lowest-numbered rank whose wait is satisfied, and when
//! none is, advances virtual time to the next message arrival. The same program therefore gives
//! the same interleaving, the same virtual times and the same results on every run.
//!
//! The network. A send and a receive match in posting order per (sender, receiver) pair. A
//! matched message leaves when the sender's egress and the receiver's ingress are both free,
//! occupies them for len / rate (rate = min(link bandwidth, flow cap)), and arrives `latency`
//! later; then its bytes are copied and both sides complete (rendezvous, like shared memory).
//! A tag or length that differs from the receive's is a `Mismatch` for the receiver and nothing
//! is copied.
//!
//! Connections (`SimConfig::connect_us`, 0: not modelled). As a multi-host group connects on
//! first use (hosts/mesh.rs) after the store rendezvous gave each rank the addresses of the ranks
//! above it only, a pair of ranks has no connection until its lower rank posts toward the higher
//! one (a send or a receive; the higher rank's posts wait, it cannot dial); that post starts the
//! connection, which is up `connect_us` later, and no message of the pair leaves before. The
//! connection's time depends on the lower rank's clock alone: the real dial and accept are
//! driven by the engine's reactors, never by either rank's program afterwards. Every message of
//! the pair needs a post of the lower rank anyway (it sends or receives it), and messages here
//! are rendezvous (a send completes when its receive is matched), so a pattern that completes
//! without the model completes with it, only later (tests/sim_peers.rs runs p2p patterns at
//! 64-256 ranks). `SimReport::connections` counts each rank's connections.
//!
//! Faults. A rank told to die at its k-th post stops there: every operation of another rank that
//! involves it fails with `PeerDied` (the real transports learn it from a pidfd or a closed
//! socket). A rank that stalls simply stops taking turns: when nothing can move any more, virtual
//! time jumps by the timeout and every rank still waiting gets `Timeout`. A rank that sends
//! garbage has its k-th send delivered with a foreign tag, as a stranger's frame. A rank whose
//! program returns an error aborts, as the real groups do, failing its peers' operations with
//! `PeerAborted`.
use super::{Handle, Transport};
use crate::error::{Error, Result};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex};

#[derive(Clone, Copy, Debug)]
pub struct SimConfig {
    /// One-way latency of a message, microseconds.
    pub latency_us: f64,
    /// Link rate per rank and direction, bytes per microsecond (1000 = 1 GB/s).
    pub bandwidth: f64,
    /// Rate cap of one flow (one sender-receiver pair), bytes per microsecond; None = the link.
    pub flow_cap: Option<f64>,
    /// Virtual time without progress before waiting ranks time out, microseconds.
    pub timeout_us: f64,
    /// What a pair's connection costs, made on the first post toward the peer (TCP's handshake
    /// and wirespeed's hello: about two round trips); 0: connections are not modelled.
    pub connect_us: f64,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig { latency_us: 5.0, bandwidth: 1000.0, flow_cap: None, timeout_us: 10e6, connect_us: 0.0 }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The rank dies at its k-th post (counting from 0).
    Die { rank: usize, at_post: usize },
    /// The rank stops taking turns at its k-th post.
    Stall { rank: usize, at_post: usize },
    /// The rank's k-th send (counting sends only, from 0) arrives with a foreign tag.
    Garbage { rank: usize, at_send: usize },
}

/// A stranger's tag: no collective uses it.
const GARBAGE_TAG: u64 = 0xDEAD_BEEF_0BAD_F00D;
const NOBODY: usize = usize::MAX;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum RankState {
    NotStarted,
    Running,
    Waiting(usize),
    Done,
    Dead,
    Stalled,
}

struct Req {
    owner: usize,
    peer: usize,
    send: bool,
    ptr: usize,
    len: usize,
    tag: u64,
    done: bool,
    error: Option<Error>,
}

struct State {
    now: f64,
    turn: usize,
    ranks: Vec<RankState>,
    posts: Vec<usize>,
    /// Set when a rank's program returned: what its peers' later operations with it get.
    ended: Vec<Option<Error>>,
    sends_posted: Vec<usize>,
    reqs: Vec<Req>,
    sends: HashMap<(usize, usize), VecDeque<usize>>,
    recvs: HashMap<(usize, usize), VecDeque<usize>>,
    egress_free: Vec<f64>,
    ingress_free: Vec<f64>,
    /// (arrival time in ns, order of scheduling, send req, recv req)
    events: BinaryHeap<Reverse<(u64, u64, usize, usize)>>,
    order: u64,
    /// Messages delivered and bytes moved, for tests that count traffic.
    delivered: (u64, u64),
    /// When each connected pair's (lower rank, higher rank) connection is up (`connect_us`).
    up: HashMap<(usize, usize), f64>,
}

struct Shared {
    st: Mutex<State>,
    turn: Vec<Condvar>,
    cfg: SimConfig,
    faults: Vec<Fault>,
}

/// One rank's end of the simulated network.
pub struct SimRank {
    rank: usize,
    world: usize,
    sh: Arc<Shared>,
}

/// What a run of the simulator observed.
#[derive(Debug, Clone)]
pub struct SimReport {
    /// Virtual time when the last rank finished, microseconds.
    pub elapsed_us: f64,
    pub messages: u64,
    pub bytes: u64,
    /// Connections each rank made or accepted (peers it posted to or from, or that posted to or
    /// from it), when `connect_us` models them; else empty.
    pub connections: Vec<usize>,
}

impl State {
    fn fail(&mut self, id: usize, e: Error) {
        let r = &mut self.reqs[id];
        if !r.done {
            r.done = true;
            r.error = Some(e);
        }
    }

    /// Why rank r can no longer take part, if it cannot: it died, or its program ended.
    fn gone(&self, r: usize) -> Option<Error> {
        match self.ranks[r] {
            RankState::Dead => Some(Error::PeerDied { rank: r, pid: 0 }),
            _ => self.ended[r].clone(),
        }
    }

    /// Pair up posted sends and receives of (from, to) in order and schedule their transfers.
    fn match_pair(&mut self, cfg: &SimConfig, from: usize, to: usize) {
        loop {
            let (Some(&s), Some(&r)) = (self.sends.get(&(from, to)).and_then(|q| q.front()), self.recvs.get(&(from, to)).and_then(|q| q.front())) else {
                return;
            };
            self.sends.get_mut(&(from, to)).unwrap().pop_front();
            self.recvs.get_mut(&(from, to)).unwrap().pop_front();
            let len = self.reqs[s].len;
            let rate = cfg.flow_cap.map_or(cfg.bandwidth, |c| c.min(cfg.bandwidth));
            let up = self.up.get(&(from.min(to), from.max(to))).copied().unwrap_or(0.0);
            let start = self.now.max(self.egress_free[from]).max(self.ingress_free[to]).max(up);
            let busy = len as f64 / rate;
            self.egress_free[from] = start + busy;
            self.ingress_free[to] = start + busy;
            let arrive = start + busy + cfg.latency_us;
            self.order += 1;
            self.events.push(Reverse(((arrive * 1000.0) as u64, self.order, s, r)));
        }
    }

    fn deliver(&mut self, s: usize, r: usize) {
        if self.reqs[s].done || self.reqs[r].done {
            // One side failed (its rank died or aborted) while the message travelled.
            return;
        }
        let (sl, st, rl, rt) = (self.reqs[s].len, self.reqs[s].tag, self.reqs[r].len, self.reqs[r].tag);
        let (from, me) = (self.reqs[s].owner, self.reqs[r].owner);
        if st != rt {
            self.fail(r, Error::Mismatch(format!("rank {from} sent a message with tag {st:#x} to rank {me}, which expects tag {rt:#x}")));
            self.reqs[s].done = true;
            return;
        }
        if sl != rl {
            self.fail(r, Error::Mismatch(format!("rank {from} sent {sl} bytes to rank {me}, which expects {rl}")));
            self.reqs[s].done = true;
            return;
        }
        if sl > 0 {
            // SAFETY: both requests are pending, so by the Transport contract both buffers are
            // live and the receiver's is touched by nobody else; they belong to different
            // ranks' posts, and a rank never posts overlapping send and receive buffers.
            unsafe { std::ptr::copy(self.reqs[s].ptr as *const u8, self.reqs[r].ptr as *mut u8, sl) };
        }
        self.reqs[s].done = true;
        self.reqs[r].done = true;
        self.delivered.0 += 1;
        self.delivered.1 += sl as u64;
    }

    /// Fail every pending operation that involves rank `x` with `e` (its own ones are dropped).
    fn cut_off(&mut self, x: usize, e: &Error) {
        for id in 0..self.reqs.len() {
            let (owner, peer, done) = (self.reqs[id].owner, self.reqs[id].peer, self.reqs[id].done);
            if done {
                continue;
            }
            if owner == x {
                // The rank's own buffers are not touched again.
                self.reqs[id].done = true;
            } else if peer == x {
                self.fail(id, e.clone());
            }
        }
    }

    fn ready(&self, r: usize) -> bool {
        match self.ranks[r] {
            RankState::NotStarted => true,
            RankState::Waiting(h) => self.reqs[h].done,
            _ => false,
        }
    }
}

impl Shared {
    /// Hand the turn to the next rank that can run, moving virtual time as needed.
    fn advance(&self, st: &mut State) {
        loop {
            if let Some(r) = (0..st.ranks.len()).find(|&r| st.ready(r)) {
                st.turn = r;
                self.turn[r].notify_one();
                return;
            }
            if let Some(Reverse((t, _, s, r))) = st.events.pop() {
                st.now = st.now.max(t as f64 / 1000.0);
                st.deliver(s, r);
                continue;
            }
            let waiting: Vec<usize> = (0..st.ranks.len()).filter(|&r| matches!(st.ranks[r], RankState::Waiting(_))).collect();
            if waiting.is_empty() {
                st.turn = NOBODY;
                for c in &self.turn {
                    c.notify_one();
                }
                return;
            }
            // Nothing can move: the ranks still waiting give up after the timeout.
            st.now += self.cfg.timeout_us;
            for r in waiting {
                if let RankState::Waiting(h) = st.ranks[r] {
                    let peer = st.reqs[h].peer;
                    let what = if st.reqs[h].send { format!("rank {peer} to take a message from rank {r}") } else { format!("rank {peer} to send to rank {r}") };
                    st.fail(h, Error::Timeout { what, secs: self.cfg.timeout_us / 1e6 });
                }
            }
        }
    }

    fn fault_at(&self, rank: usize, post: usize, send: Option<usize>) -> Option<Fault> {
        self.faults.iter().copied().find(|f| match *f {
            Fault::Die { rank: r, at_post } | Fault::Stall { rank: r, at_post } => r == rank && at_post == post,
            Fault::Garbage { rank: r, at_send } => r == rank && Some(at_send) == send,
        })
    }
}

/// Raised inside a rank that the simulation killed or stalled, to unwind its program.
fn stopped(rank: usize) -> Error {
    Error::Broken(format!("rank {rank} was stopped by the simulation's fault"))
}

impl SimRank {
    fn post(&mut self, send: bool, peer: usize, ptr: usize, len: usize, tag: u64) -> Result<Handle> {
        if peer >= self.world || peer == self.rank {
            return Err(Error::Unsupported(format!("rank {peer} is not a peer of rank {} in a world of {}", self.rank, self.world)));
        }
        let mut st = self.sh.st.lock().unwrap();
        let k = st.posts[self.rank];
        st.posts[self.rank] += 1;
        let nth_send = send.then(|| st.sends_posted[self.rank]);
        if send {
            st.sends_posted[self.rank] += 1;
        }
        let mut tag = tag;
        match self.sh.fault_at(self.rank, k, nth_send) {
            Some(Fault::Die { .. }) => {
                st.ranks[self.rank] = RankState::Dead;
                let e = Error::PeerDied { rank: self.rank, pid: 0 };
                st.cut_off(self.rank, &e);
                self.sh.advance(&mut st);
                return Err(stopped(self.rank));
            }
            Some(Fault::Stall { .. }) => {
                st.ranks[self.rank] = RankState::Stalled;
                self.sh.advance(&mut st);
                // Never runs again; released when the simulation ends.
                while st.turn != NOBODY {
                    st = self.sh.turn[self.rank].wait(st).unwrap();
                }
                return Err(stopped(self.rank));
            }
            Some(Fault::Garbage { .. }) if send => tag = GARBAGE_TAG,
            _ => {}
        }
        let id = st.reqs.len();
        st.reqs.push(Req { owner: self.rank, peer, send, ptr, len, tag, done: false, error: None });
        if let Some(e) = st.gone(peer) {
            st.fail(id, e);
        } else {
            if self.sh.cfg.connect_us > 0.0 && self.rank < peer {
                // The lower rank's first post toward the pair starts the connection now, on its
                // clock alone (see "Connections" above).
                let now = st.now;
                st.up.entry((self.rank, peer)).or_insert(now + self.sh.cfg.connect_us);
            }
            let (from, to) = if send { (self.rank, peer) } else { (peer, self.rank) };
            let q = if send { &mut st.sends } else { &mut st.recvs };
            q.entry((from, to)).or_default().push_back(id);
            st.match_pair(&self.sh.cfg, from, to);
        }
        Ok(Handle(id))
    }

    /// Virtual time now, microseconds.
    pub fn now_us(&self) -> f64 {
        self.sh.st.lock().unwrap().now
    }
}

/// Each method's contract is `Transport`'s (transport/mod.rs). The simulator only records the
/// address of a post; `deliver` copies between a send and a receive while both are pending. A
/// rank whose program returns (or that dies) is cut off (`cut_off`) before the turn passes, and
/// only the turn holder delivers, so its buffers are never touched again: this transport's
/// "shut down".
impl Transport for SimRank {
    fn rank(&self) -> usize {
        self.rank
    }
    fn world(&self) -> usize {
        self.world
    }
    // SAFETY: sound on Transport's contract alone: the simulated network copies from `data` only
    // while the send is pending.
    unsafe fn post_send(&mut self, to: usize, data: *const u8, len: usize, tag: u64) -> Result<Handle> {
        self.post(true, to, data as usize, len, tag)
    }
    // SAFETY: sound on Transport's contract alone: the simulated network writes `data` only while
    // the receive is pending.
    unsafe fn post_recv(&mut self, from: usize, data: *mut u8, len: usize, tag: u64) -> Result<Handle> {
        self.post(false, from, data as usize, len, tag)
    }
    fn wait(&mut self, h: Handle) -> Result<()> {
        let mut st = self.sh.st.lock().unwrap();
        if h.0 >= st.reqs.len() || st.reqs[h.0].owner != self.rank {
            return Err(Error::Unsupported(format!("handle {} is not rank {}'s", h.0, self.rank)));
        }
        if !st.reqs[h.0].done {
            st.ranks[self.rank] = RankState::Waiting(h.0);
            self.sh.advance(&mut st);
            while st.turn != self.rank {
                if st.turn == NOBODY && !st.reqs[h.0].done {
                    return Err(stopped(self.rank));
                }
                st = self.sh.turn[self.rank].wait(st).unwrap();
            }
            st.ranks[self.rank] = RankState::Running;
        }
        match st.reqs[h.0].error.clone() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// Run `program` on `world` simulated ranks; each rank's result in rank order, and a report.
pub fn run<T: Send>(world: usize, cfg: SimConfig, faults: &[Fault], program: impl Fn(&mut SimRank) -> Result<T> + Sync) -> (Vec<Result<T>>, SimReport) {
    let sh = Arc::new(Shared {
        st: Mutex::new(State {
            now: 0.0,
            turn: NOBODY,
            ranks: vec![RankState::NotStarted; world],
            posts: vec![0; world],
            ended: vec![None; world],
            sends_posted: vec![0; world],
            reqs: Vec::new(),
            sends: HashMap::new(),
            recvs: HashMap::new(),
            egress_free: vec![0.0; world],
            ingress_free: vec![0.0; world],
            events: BinaryHeap::new(),
            order: 0,
            delivered: (0, 0),
            up: HashMap::new(),
        }),
        turn: (0..world).map(|_| Condvar::new()).collect(),
        cfg,
        faults: faults.to_vec(),
    });
    let results: Vec<Result<T>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..world)
            .map(|rank| {
                let sh = sh.clone();
                let program = &program;
                std::thread::Builder::new()
                    .name(format!("sim-rank{rank}"))
                    .stack_size(1 << 20)
                    .spawn_scoped(scope, move || {
                        {
                            let mut st = sh.st.lock().unwrap();
                            while st.turn != rank {
                                st = sh.turn[rank].wait(st).unwrap();
                            }
                            st.ranks[rank] = RankState::Running;
                        }
                        let mut me = SimRank { rank, world, sh: sh.clone() };
                        let r = program(&mut me);
                        let mut st = sh.st.lock().unwrap();
                        match (&r, st.ranks[rank]) {
                            (_, RankState::Dead | RankState::Stalled) => {}
                            (Err(e), _) => {
                                st.ranks[rank] = RankState::Done;
                                let e = Error::PeerAborted { rank, reason: e.to_string() };
                                st.cut_off(rank, &e);
                                st.ended[rank] = Some(e);
                            }
                            (Ok(_), _) => {
                                st.ranks[rank] = RankState::Done;
                                // Operations it posted and never waited are dropped with it.
                                let e = Error::PeerAborted { rank, reason: "it finished its program".into() };
                                st.cut_off(rank, &e);
                                st.ended[rank] = Some(e);
                            }
                        }
                        // Only the rank holding the turn passes it on (a dead rank passed it when it died).
                        if st.turn == rank {
                            sh.advance(&mut st);
                        }
                        r
                    })
                    .expect("spawning a simulated rank")
            })
            .collect();
        {
            let mut st = sh.st.lock().unwrap();
            sh.advance(&mut st);
        }
        handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(Error::Broken("a simulated rank panicked".into())))).collect()
    });
    let st = sh.st.lock().unwrap();
    let mut connections = vec![0; if cfg.connect_us > 0.0 { world } else { 0 }];
    for &(a, b) in st.up.keys() {
        connections[a] += 1;
        connections[b] += 1;
    }
    (results, SimReport { elapsed_us: st.now, messages: st.delivered.0, bytes: st.delivered.1, connections })
}
