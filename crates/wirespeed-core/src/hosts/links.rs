//! Connections on first use (lazy mode, hosts/mesh.rs): the keys that name a pair's dials, each
//! remote rank's `Link` (where its connection stands, shared by the rank's thread, its listener's
//! vetting and routing, and the reactor threads that end its dials), and the dials that make a
//! pair's connection and open the rest of its streams (`Lazy::dial_first`, `Lazy::dial_rest`).
//! mesh.rs's opening says why each rule is what it is.
use crate::error::{Error, Result};
use crate::transport::tcp::{dial, Attacher, NetConfig, Reactor};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering::*};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

const KEY_MAGIC: [u8; 4] = *b"WSG1";
/// A key's magic for the rest of a grown pair's streams (`Lazy::dial_rest`).
const KEY_MAGIC_MORE: [u8; 4] = *b"WSG+";

/// What a dial's key says: the job token, from, to, world, the streams of this dial, and whether
/// they are the rest of a pair's streams (`KEY_MAGIC_MORE`) rather than its first.
pub(super) type Hello = ([u8; 16], usize, usize, usize, usize, bool);

pub(super) fn key(token: &[u8; 16], from: usize, to: usize, world: usize, nstreams: usize) -> [u8; 32] {
    key_of(token, from, to, world, nstreams, false)
}

pub(super) fn key_of(token: &[u8; 16], from: usize, to: usize, world: usize, nstreams: usize, more: bool) -> [u8; 32] {
    let mut k = [0u8; 32];
    k[0..16].copy_from_slice(token);
    k[16..20].copy_from_slice(&(from as u32).to_le_bytes());
    k[20..24].copy_from_slice(&(to as u32).to_le_bytes());
    k[24..26].copy_from_slice(&(world as u16).to_le_bytes());
    k[26..28].copy_from_slice(&(nstreams as u16).to_le_bytes());
    k[28..32].copy_from_slice(if more { &KEY_MAGIC_MORE } else { &KEY_MAGIC });
    k
}

pub(super) fn parse_key(k: &[u8; 32]) -> Option<Hello> {
    let more = match &k[28..32] {
        m if *m == KEY_MAGIC => false,
        m if *m == KEY_MAGIC_MORE => true,
        _ => return None,
    };
    let w32 = |i: usize| u32::from_le_bytes(k[i..i + 4].try_into().unwrap()) as usize;
    let w16 = |i: usize| u16::from_le_bytes(k[i..i + 2].try_into().unwrap()) as usize;
    Some((k[0..16].try_into().unwrap(), w32(16), w32(20), w16(24), w16(26), more))
}

/// Where the connection with one remote rank stands, in lazy mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum State {
    /// Nothing yet.
    Idle,
    /// This rank's dial is under way.
    Dialing,
    /// The peer's dial was vetted here; its streams are coming.
    Accepting,
    /// The streams are attached (`dialled`: by this rank's dial).
    Up { dialled: bool },
}

/// Where the rest of a pair's streams stand, in lazy mode (`Lazy::dial_rest`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum More {
    /// Not asked for: the pair has the streams of its first dial.
    No,
    /// Dialled here, or vetted here from the peer, and on their way.
    Asked,
    /// Attached (or the first dial brought them all).
    Done,
}

pub(super) struct Link {
    pub(super) state: State,
    /// The rest of the pair's streams.
    pub(super) more: More,
    /// Streams of the connection's first dial, once vetted or dialled (0 before).
    pub(super) first: usize,
    /// The `Conn` waiting for the streams, once `Mesh::connect` made it.
    pub(super) attacher: Option<Attacher>,
    /// Streams accepted before `Mesh::connect` made the `Conn` (a fast peer's first send).
    pub(super) early: Option<Vec<TcpStream>>,
    /// Why this rank's last try to dial the peer failed, for a wait that times out meanwhile.
    pub(super) last_try: Option<String>,
    /// The peer dialled with another job token before its `Conn` was made: made failed.
    pub(super) refused: Option<Error>,
}

/// Every remote rank's `Link`, shared by the rank's thread (first posts), its listener's vetting
/// and routing, and its dials' ends (reactor threads).
pub(super) struct Links {
    pub(super) links: Vec<Mutex<Link>>,
    /// Set by `Mesh::shutdown`: dials stop, and nothing new attaches.
    pub(super) closed: AtomicBool,
}

impl Links {
    /// The lazy vetting of a dial of `n` streams from rank `from` to `me`, whose pair has `cap`,
    /// with the pair's lock: the lower rank of the pair decides which of two crossing dials is
    /// kept, so exactly one connection is made. A first dial brings one stream or all `cap`; the
    /// rest of them (`more`) come only from the rank that made the connection, once.
    pub(super) fn vet(&self, me: usize, from: usize, n: usize, cap: usize, more: bool) -> std::result::Result<(), String> {
        let mut l = self.links[from].lock().unwrap();
        if more {
            let made_there = matches!(l.state, State::Accepting | State::Up { dialled: false });
            return match l.more {
                More::No if made_there && l.first + n == cap => {
                    l.more = More::Asked;
                    // The peer may send on them before they are attached here: the connection
                    // is not judged by its first streams' closes until they are (`route`).
                    if let Some(a) = &l.attacher {
                        a.expect(n);
                    }
                    Ok(())
                }
                // The batch's other streams (and each stream's proof, with a job secret).
                More::Asked if made_there && l.first + n == cap => Ok(()),
                _ => Err(format!("rank {from} sent {n} more streams to a pair of {cap} that has {} and did not ask for them there", l.first)),
            };
        }
        if n != cap && n != 1 {
            return Err(format!("hello from rank {from} with {n} streams; this rank expects 1 or {cap} from it"));
        }
        let accept = |l: &mut Link| {
            l.state = State::Accepting;
            l.first = n;
            l.more = if n == cap { More::Done } else { More::No };
        };
        match (l.state, me < from) {
            (State::Idle, _) => {
                accept(&mut l);
                Ok(())
            }
            // The other streams of the connection vetted, and each stream's proof (job secret).
            (State::Accepting, _) => Ok(()),
            // This rank is the lower one and dialled first: its dial wins, the peer's is
            // dropped quietly (its owner sees the refusal and stops once this dial arrives).
            (State::Dialing | State::Up { dialled: true }, true) => Err(String::new()),
            // The lower rank dialled: its dial wins; this rank's own dial stops (dial.rs asks
            // `wanted`, which now says no, and the lower rank refuses what is in flight).
            (State::Dialing, false) => {
                accept(&mut l);
                Ok(())
            }
            (State::Up { .. }, _) => Err(format!("rank {from} is connected already (a duplicate)")),
        }
    }

    /// Rank `from` of this group dialled with another job token: its `Conn` fails with `e`, so
    /// this rank's waits on it end now rather than at the timeout (the dialer, told so by the
    /// refusal, fails at once too). A stranger that read the store could do this; it could as
    /// well write the store's note that breaks every group (admission.py): no new power.
    pub(super) fn refuse_peer(&self, from: usize, e: Error) {
        let mut l = self.links[from].lock().unwrap();
        match &l.attacher {
            Some(a) => a.fail(e),
            None => l.refused = Some(e),
        }
    }

    /// An accepted connection from `from`, all streams of its dial in (`more`: the rest of the
    /// pair's streams): attach them to the waiting `Conn`.
    pub(super) fn route(&self, from: usize, socks: Vec<TcpStream>, more: bool) {
        let mut l = self.links[from].lock().unwrap();
        if self.closed.load(Acquire) {
            return; // dropped: its streams close
        }
        if more {
            if l.more != More::Asked {
                return;
            }
            l.more = More::Done;
        } else {
            if l.state != State::Accepting {
                return;
            }
            l.state = State::Up { dialled: false };
        }
        match &l.attacher {
            // An error fails that Conn, whose requests then say why.
            Some(a) => {
                let n = socks.len();
                let _ = a.attach(socks);
                if more {
                    a.arrived(n);
                }
            }
            None => l.early.get_or_insert_with(Vec::new).extend(socks),
        }
    }
}


/// What a lazy dial needs from its mesh: the engine, this rank, the world and the timeout.
pub(super) struct Dialing<'a> {
    pub(super) reactor: &'a Arc<Reactor>,
    pub(super) cfg: &'a NetConfig,
    pub(super) me: usize,
    pub(super) world: usize,
    pub(super) timeout: Duration,
}

pub(super) struct Lazy {
    pub(super) links: Arc<Links>,
    pub(super) addrs: Vec<Option<SocketAddr>>,
    pub(super) streams: Vec<usize>,
    pub(super) token: [u8; 16],
    /// How long a first post toward a lower rank waits for that rank's dial before this rank
    /// dials it itself (`LOWER_DIAL_AFTER`, at most a quarter of the timeout).
    pub(super) lower_after: Duration,
    /// WIRESPEED_GROW_BYTES (`NetConfig::grow_bytes`).
    pub(super) grow_at: Option<usize>,
}

impl Lazy {
    /// The least bytes of a message that open all of a pair's `cap` streams (`tcp::grow_at`).
    fn grow_at(&self, cap: usize) -> usize {
        crate::transport::tcp::grow_at(self.grow_at, cap)
    }

    /// Lazy mode: the first post toward `r` (of `len` bytes) dials it (unless `r` dialled first,
    /// or this rank does not hold its address: then `r` dials on its own first post toward this
    /// rank), with one stream if `len` is below the pair's growth size (`tcp::grow_at`), else with
    /// all of the pair's. Returns at once: the reactor makes the connection, and the post waits
    /// in the `Conn` meanwhile.
    pub(super) fn dial_first(&self, d: &Dialing, r: usize, len: usize) -> Result<()> {
        let lz = self;
        let (Some(addr), Some(l)) = (lz.addrs.get(r).copied().flatten(), lz.links.links.get(r)) else { return Ok(()) };
        let mut g = l.lock().unwrap();
        if g.state != State::Idle {
            return Ok(());
        }
        g.state = State::Dialing;
        let attacher = g.attacher.clone().expect("made in Mesh::lazy");
        let (me, world) = (d.me, d.world);
        let cap = lz.streams[r];
        let n = if len < lz.grow_at(cap) { 1 } else { cap };
        g.first = n;
        g.more = if n == cap { More::Done } else { More::No };
        let weak: Weak<Links> = Arc::downgrade(&lz.links);
        let (wanted, tried) = (wanted(&weak, r, |l| l.state == State::Dialing), tried(&weak, r));
        let done = Box::new(move |res: Result<Vec<TcpStream>>| {
            let Some(ls) = weak.upgrade() else { return };
            let mut g = ls.links[r].lock().unwrap();
            if g.state != State::Dialing {
                return; // the peer's dial won meanwhile: these streams (if any) close
            }
            match res {
                Ok(socks) => {
                    g.state = State::Up { dialled: true };
                    let _ = attacher.attach(socks);
                }
                Err(e) => attacher.fail(dial_error(e, me, r)),
            }
        }) as dial::DialDone;
        // Toward a lower rank, its own dial is awaited first (LOWER_DIAL_AFTER): that is the
        // usual way the pair connects, and the crossing rule settles a late one either way.
        let after = if r < me { lz.lower_after } else { Duration::ZERO };
        dial::spawn(d.reactor, d.cfg, addr, key(&lz.token, me, r, world, n), n, after, d.timeout, wanted, tried, done).map_err(|e| {
            g.state = State::Idle;
            dial_error(e, me, r)
        })
    }

    /// Lazy mode: a post of `len` bytes toward `r`, whose connection has fewer streams than the
    /// pair's: from the growth size on, the rank that made the connection dials the rest of its
    /// streams, once (the pair's other rank sees the same sizes: every message is posted on both
    /// sides with its length). Returns at once; the streams join the connection when made, and
    /// take chunks from what is queued then. A dial that fails leaves the pair on the streams
    /// it has (a dead peer fails those anyway).
    pub(super) fn dial_rest(&self, d: &Dialing, r: usize, len: usize) -> Result<()> {
        let lz = self;
        let cap = lz.streams[r];
        if len < lz.grow_at(cap) {
            return Ok(());
        }
        let (Some(addr), Some(l)) = (lz.addrs.get(r).copied().flatten(), lz.links.links.get(r)) else { return Ok(()) };
        let mut g = l.lock().unwrap();
        if g.state != (State::Up { dialled: true }) || g.more != More::No {
            return Ok(());
        }
        g.more = More::Asked;
        let attacher = g.attacher.clone().expect("made in Mesh::lazy");
        let n = cap - g.first;
        let weak: Weak<Links> = Arc::downgrade(&lz.links);
        let (wanted, tried) = (wanted(&weak, r, |l| l.more == More::Asked), tried(&weak, r));
        // The peer may send on these as soon as it has them, before this rank attaches them:
        // the connection is not judged by its first streams' closes until they are in.
        attacher.expect(n);
        let promised = attacher.clone();
        let done = Box::new(move |res: Result<Vec<TcpStream>>| {
            let Some(ls) = weak.upgrade() else { return };
            let mut g = ls.links[r].lock().unwrap();
            match res {
                Ok(socks) if g.more == More::Asked => {
                    g.more = More::Done;
                    let _ = attacher.attach(socks);
                }
                Ok(_) => {} // not wanted any more (shut down meanwhile): these streams close
                Err(e) => g.last_try = Some(format!("the rest of the pair's streams: {e}")),
            }
            attacher.arrived(n);
        }) as dial::DialDone;
        let key = key_of(&lz.token, d.me, r, d.world, n, true);
        dial::spawn(d.reactor, d.cfg, addr, key, n, Duration::ZERO, d.timeout, wanted, tried, done).map_err(|e| {
            promised.arrived(n); // never dialled
            dial_error(e, d.me, r)
        })
    }
}

/// A higher rank's wait for the lower rank's dial before it dials that rank itself. A lower rank
/// that is alive and slower than this to reach the pair's first message gets a connection made
/// the other way (its listener accepts it, mesh vetting as for any crossing); one that died
/// before its first post is found at once then (nothing listens at its address), rather than at
/// the group's timeout. Short enough to report a dead peer within seconds, long enough that
/// ranks which reach a collective together (the usual case) leave the dial to the lower rank.
pub(super) const LOWER_DIAL_AFTER: Duration = Duration::from_secs(1);

/// A dial's question to its pair (dial.rs `Wanted`): is the mesh still open, and `r`'s link
/// still where this dial left it (`still`)? A dial that another ended stops.
fn wanted(weak: &Weak<Links>, r: usize, still: fn(&Link) -> bool) -> dial::Wanted {
    let weak = weak.clone();
    Box::new(move || weak.upgrade().is_some_and(|ls| !ls.closed.load(Acquire) && still(&ls.links[r].lock().unwrap())))
}

/// A dial's note of each failed try in `r`'s link (dial.rs `Tried`), for the timeout's message.
fn tried(weak: &Weak<Links>, r: usize) -> dial::Tried {
    let weak = weak.clone();
    Box::new(move |e: &str| {
        if let Some(ls) = weak.upgrade() {
            ls.links[r].lock().unwrap().last_try = Some(e.to_string());
        }
    })
}

/// A lazy dial's failure, naming both ranks: the peer never accepted (a timeout), its listener
/// is gone, or it is not this job's rank.
pub(super) fn dial_error(e: Error, me: usize, r: usize) -> Error {
    match e {
        Error::Timeout { what, secs } => Error::Timeout { what: format!("rank {r} to accept rank {me}'s connection, made on first use: {what}"), secs },
        Error::Stranger(why) => Error::Stranger(format!("rank {r}: {why}: give every rank the same WIRESPEED_JOB_SECRET (or none)")),
        Error::PeerLost(why) => Error::PeerAborted { rank: r, reason: format!("rank {me} could not connect to it: {why}") },
        e => e,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip_and_other_magic_is_not_a_key() {
        let t = [9u8; 16];
        let k = key(&t, 3, 5, 8, 4);
        assert_eq!(parse_key(&k), Some((t, 3, 5, 8, 4, false)));
        assert_eq!(parse_key(&key_of(&t, 3, 5, 8, 2, true)), Some((t, 3, 5, 8, 2, true)));
        let mut bad = k;
        bad[31] ^= 1;
        assert_eq!(parse_key(&bad), None);
    }

    /// The listener's vetting of a pair's dials (lazy mode): a first dial of one stream or all,
    /// then the rest once, from the rank that made the connection, in the count that fills it.
    #[test]
    fn the_rest_of_a_pairs_streams_are_taken_once_from_the_rank_that_made_it() {
        let links = || Links { links: (0..3).map(|_| Mutex::new(Link { state: State::Idle, more: More::No, first: 0, attacher: None, early: None, last_try: None, refused: None })).collect(), closed: AtomicBool::new(false) };
        let ls = links();
        assert!(ls.vet(1, 0, 3, 4, true).is_err(), "no rest before a first dial");
        assert!(ls.vet(1, 0, 2, 4, false).is_err(), "a first dial brings 1 or all");
        ls.vet(1, 0, 1, 4, false).unwrap();
        assert!(ls.vet(1, 0, 2, 4, true).is_err(), "the rest is 3 here");
        ls.vet(1, 0, 3, 4, true).unwrap();
        ls.vet(1, 0, 3, 4, true).unwrap(); // the batch's next stream
        ls.route(0, Vec::new(), false);
        ls.route(0, Vec::new(), true);
        assert_eq!(ls.links[0].lock().unwrap().more, More::Done);
        assert!(ls.vet(1, 0, 3, 4, true).is_err(), "only once");
        // A rank that dialled (this rank's own dial made the pair) takes no rest from the peer.
        let ls = links();
        ls.links[2].lock().unwrap().state = State::Up { dialled: true };
        ls.links[2].lock().unwrap().first = 1;
        assert!(ls.vet(1, 2, 3, 4, true).is_err());
        // A first dial of all streams leaves nothing to add.
        let ls = links();
        ls.vet(1, 0, 4, 4, false).unwrap();
        assert!(ls.vet(1, 0, 0, 4, true).is_err());
    }
}
