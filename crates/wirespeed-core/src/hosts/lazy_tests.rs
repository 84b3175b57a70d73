//! Lazy connections over real loopback sockets: meshes of ranks that are each "on their own
//! host", connected on first use (mesh.rs). What must hold: crossing first sends make one
//! connection and no refusal anyone sees; a receive posted before the peer ever sends is filled;
//! a rank holds streams only with the peers it used; a peer that never accepts is a timeout
//! naming it, and a peer that is gone an error naming it, never a hang.
use super::mesh::{Connect, MeshListener, Mesh};
use crate::error::Error;
use crate::transport::tcp::NetConfig;
use crate::transport::{Handle, Transport};
use std::net::IpAddr;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

const NSTREAMS: usize = 2;

/// `world` meshes (one per thread's rank, each rank its own host), set up as a group does:
/// every listener bound before any address is known, then `Mesh::connect` on every rank.
pub(super) fn meshes(world: usize, mode: Connect, timeout: Duration) -> Vec<Mesh> {
    meshes_with(world, mode, timeout, NetConfig::default())
}

/// Every rank holding every address dials on its own first post, toward lower ranks too (no
/// wait for their dial): the crossing of two first dials is what these meshes test.
fn meshes_with(world: usize, mode: Connect, timeout: Duration, cfg: NetConfig) -> Vec<Mesh> {
    let mut ms = meshes_full(world, mode, timeout, cfg, false);
    ms.iter_mut().for_each(|m| m.set_lower_dial_after(Duration::ZERO));
    ms
}

/// `partial`: each rank gets only the addresses of the ranks above it, as the store rendezvous
/// gives them (native/rendezvous.py's needed_records); the others are empty.
fn meshes_full(world: usize, mode: Connect, timeout: Duration, cfg: NetConfig, partial: bool) -> Vec<Mesh> {
    let token = [5u8; 16];
    let ip: IpAddr = "127.0.0.1".parse().unwrap();
    let streams_of = |r: usize| -> Vec<usize> { (0..world).map(|p| if p == r { 0 } else { NSTREAMS }).collect() };
    let listeners: Vec<MeshListener> = (0..world)
        .map(|r| MeshListener::bind(ip, r, world, token, cfg, &(0..r).collect::<Vec<_>>(), &streams_of(r), mode).unwrap())
        .collect();
    let addrs: Vec<String> = listeners.iter().map(|l| l.addr.to_string()).collect();
    let hs: Vec<_> = listeners
        .into_iter()
        .enumerate()
        .map(|(r, l)| {
            let (mut addrs, s) = (addrs.clone(), streams_of(r));
            if partial {
                addrs.iter_mut().take(r).for_each(|a| a.clear());
            }
            std::thread::spawn(move || Mesh::connect(l, r, &addrs, &s, token, timeout).unwrap())
        })
        .collect();
    hs.into_iter().map(|h| h.join().unwrap()).collect()
}

fn msg(from: usize, to: usize, i: usize, len: usize) -> Vec<u8> {
    (0..len).map(|k| (from * 31 + to * 7 + i * 13 + k) as u8).collect()
}

/// Run `f(rank, mesh)` on every rank's own thread; their results in rank order.
pub(super) fn on_every_rank<T: Send + 'static>(ms: Vec<Mesh>, f: impl Fn(usize, &mut Mesh) -> T + Send + Sync + 'static) -> Vec<(T, Mesh)> {
    let f = Arc::new(f);
    let hs: Vec<_> = ms
        .into_iter()
        .enumerate()
        .map(|(r, mut m)| {
            let f = f.clone();
            std::thread::spawn(move || (f(r, &mut m), m))
        })
        .collect();
    hs.into_iter().map(|h| h.join().unwrap()).collect()
}

/// Every rank sends to each peer in `to(r)` and receives from each in `from(r)`, all posted
/// before any is waited (sends first), then waits them all; each message checked.
fn exchange(r: usize, m: &mut Mesh, to: &[usize], from: &[usize], len: usize) -> crate::error::Result<()> {
    let outs: Vec<Vec<u8>> = to.iter().map(|&p| msg(r, p, 0, len)).collect();
    let mut ins: Vec<Vec<u8>> = from.iter().map(|_| vec![0u8; len]).collect();
    let mut hs = Vec::new();
    for (i, &p) in to.iter().enumerate() {
        // SAFETY: `outs` outlives every handle, all waited below (or the mesh shut on error).
        hs.push(unsafe { m.post_send(p, outs[i].as_ptr(), len, 1)? });
    }
    for (i, &p) in from.iter().enumerate() {
        // SAFETY: `ins` likewise, untouched until every handle is waited.
        hs.push(unsafe { m.post_recv(p, ins[i].as_mut_ptr(), len, 1)? });
    }
    let mut first = Ok(());
    for h in hs {
        if let Err(e) = m.wait(h) {
            first = first.and(Err(e));
        }
    }
    if first.is_err() {
        m.shutdown();
        return first;
    }
    for (i, &p) in from.iter().enumerate() {
        assert_eq!(ins[i], msg(p, r, 0, len), "rank {r}'s message from {p}");
    }
    Ok(())
}

#[test]
fn crossing_first_sends_make_one_connection_and_no_refusal() {
    crossing_rounds(NetConfig::default());
}

#[test]
fn crossing_first_sends_with_a_job_secret() {
    // With a secret each stream is vetted twice (its hello, then its proof): the pair's state
    // must hold across both.
    let cfg = NetConfig { secret: crate::transport::tcp::Secret::from_text("lazy-crossing-test-secret-0123456789abcdef"), ..NetConfig::default() };
    assert!(cfg.secret.is_some());
    crossing_rounds(cfg);
}

fn crossing_rounds(cfg: NetConfig) {
    // Both ranks send first, at once: each dials, and the lower rank's dial must win on both
    // sides. Many rounds, fresh meshes each, so the crossing lands at every step. Whether a round
    // crosses is up to the scheduler (a loaded machine may run one rank's first send well before
    // the other's): at least MIN_ROUNDS, then more until one crossed, within a bound, so that
    // the crossing is tested in every run that passes.
    const MIN_ROUNDS: usize = 20;
    const MAX_ROUNDS: usize = 200;
    let budget = Duration::from_secs(20);
    let start = Instant::now();
    let mut crossed = 0;
    let mut rounds = 0;
    while rounds < MIN_ROUNDS || (crossed == 0 && rounds < MAX_ROUNDS && start.elapsed() < budget) {
        let round = rounds;
        rounds += 1;
        let ms = meshes_with(2, Connect::Lazy, Duration::from_secs(10), cfg);
        let go = Arc::new(Barrier::new(2));
        let out = on_every_rank(ms, move |r, m| {
            go.wait();
            let p = 1 - r;
            exchange(r, m, &[p], &[p], 100_000 + round)
        });
        // Both ranks' outcomes at once: one rank's failure often makes the other's (a rank
        // that fails shuts its mesh, and its peer then waits for nothing).
        if out.iter().any(|(res, _)| res.is_err()) {
            let said: Vec<String> = out.iter().enumerate().map(|(r, (res, m))| format!("rank {r}: {res:?} (streams {}, refused {}, crossings refused {})", m.streams_to(1 - r), m.refused(), m.crossings_refused())).collect();
            panic!("round {round}: {}", said.join("; "));
        }
        for (r, (_, m)) in out.iter().enumerate() {
            assert_eq!(m.streams_to(1 - r), NSTREAMS, "round {round}: rank {r} holds one connection of {NSTREAMS} streams");
            assert_eq!(m.refused(), 0, "round {round}: the crossing dial was refused aloud on rank {r}");
            // Only the lower rank decides, so only it refuses.
            assert!(r == 0 || m.crossings_refused() == 0);
            crossed += m.crossings_refused();
        }
    }
    eprintln!("crossing dials refused quietly in {rounds} rounds: {crossed} streams");
    assert!(crossed > 0, "no round of {rounds} crossed (in {:.1} s): the test did not test the crossing", start.elapsed().as_secs_f64());
}

#[test]
fn a_receive_posted_before_the_peer_ever_sends_is_filled() {
    // Rank 1 posts its receive first, and that first use dials rank 0; rank 0 sends only later,
    // over the connection rank 1 made.
    let ms = meshes(2, Connect::Lazy, Duration::from_secs(10));
    let out = on_every_rank(ms, |r, m| {
        if r == 0 {
            std::thread::sleep(Duration::from_millis(300));
            let streams_before = m.streams_to(1);
            exchange(0, m, &[1], &[], 1 << 20).map(|_| streams_before)
        } else {
            exchange(1, m, &[], &[0], 1 << 20).map(|_| 0)
        }
    });
    let (res0, _) = &out[0];
    // By the time rank 0 sends, rank 1's dial has long attached (the reactor did it while
    // rank 0's thread slept).
    assert_eq!(*res0.as_ref().unwrap(), NSTREAMS);
    out[1].0.as_ref().unwrap();
}

#[test]
fn each_rank_connects_to_the_peers_it_uses_and_all_pairs_connect_all() {
    let world = 16;
    // A ring both ways: every rank sends to and receives from both neighbours (every pair
    // crosses), and holds streams with those two only.
    let ms = meshes(world, Connect::Lazy, Duration::from_secs(20));
    let out = on_every_rank(ms, move |r, m| {
        let (l, rr) = ((r + world - 1) % world, (r + 1) % world);
        exchange(r, m, &[rr, l], &[l, rr], 70_000)
    });
    for (r, (res, m)) in out.iter().enumerate() {
        res.as_ref().unwrap();
        let mut want = vec![(r + world - 1) % world, (r + 1) % world];
        want.sort();
        assert_eq!(m.connected(), want, "rank {r}");
        assert!(want.iter().all(|&p| m.streams_to(p) == NSTREAMS));
        assert_eq!(m.refused(), 0);
    }
    // Then all pairs on the same meshes: the ring's connections are reused, the rest made.
    let ms: Vec<Mesh> = out.into_iter().map(|(_, m)| m).collect();
    let out = on_every_rank(ms, move |r, m| {
        let others: Vec<usize> = (0..world).filter(|&p| p != r).collect();
        exchange(r, m, &others, &others, 5_000)
    });
    for (r, (res, m)) in out.iter().enumerate() {
        res.as_ref().unwrap();
        assert_eq!(m.connected().len(), world - 1, "rank {r}");
        assert_eq!(m.refused(), 0);
    }
}

#[test]
fn with_the_addresses_the_rendezvous_gives_the_lower_rank_dials_on_its_first_post() {
    // Rank 1 holds no address of rank 0: its send waits in the Conn (it cannot dial) until
    // rank 0 posts its receive, which dials; then the message moves, and rank 0's reply too.
    let ms = meshes_full(2, Connect::Lazy, Duration::from_secs(10), NetConfig::default(), true);
    let out = on_every_rank(ms, |r, m| {
        if r == 1 {
            let data = msg(1, 0, 0, 50_000);
            // SAFETY: `data` outlives the handle, waited below.
            let h = unsafe { m.post_send(0, data.as_ptr(), data.len(), 1) }.unwrap();
            std::thread::sleep(Duration::from_millis(300));
            let before = m.streams_to(0);
            m.wait(h).unwrap();
            exchange(1, m, &[], &[0], 1000).map(|_| before)
        } else {
            std::thread::sleep(Duration::from_millis(200));
            let before = m.streams_to(1);
            let mut got = vec![0u8; 50_000];
            // SAFETY: `got` outlives the handle, waited at once.
            let h = unsafe { m.post_recv(1, got.as_mut_ptr(), got.len(), 1) }.unwrap();
            m.wait(h).unwrap();
            assert_eq!(got, msg(1, 0, 0, 50_000));
            exchange(0, m, &[1], &[], 1000).map(|_| before)
        }
    });
    // Nobody connected before rank 0's first post (rank 1 could not dial).
    assert_eq!(*out[0].0.as_ref().unwrap(), 0);
    out[1].0.as_ref().unwrap();
    assert!(out.iter().all(|(_, m)| m.refused() == 0 && m.crossings_refused() == 0));

    // 16 ranks, all pairs and rings both ways, each rank holding the higher ranks' addresses only.
    let world = 16;
    let ms = meshes_full(world, Connect::Lazy, Duration::from_secs(20), NetConfig::default(), true);
    let out = on_every_rank(ms, move |r, m| {
        let (l, rr) = ((r + world - 1) % world, (r + 1) % world);
        exchange(r, m, &[rr, l], &[l, rr], 70_000)?;
        let others: Vec<usize> = (0..world).filter(|&p| p != r).collect();
        exchange(r, m, &others, &others, 3_000)
    });
    for (r, (res, m)) in out.iter().enumerate() {
        res.as_ref().unwrap();
        assert_eq!(m.connected().len(), world - 1, "rank {r}");
        assert_eq!(m.refused() + m.crossings_refused(), 0, "rank {r}: only the lower rank dials here");
    }
}

#[test]
fn a_lower_rank_that_died_before_its_first_post_is_an_error_soon_on_the_higher_side() {
    // Rank 0 (the pair's dialer) is gone before it posted anything; rank 1 holds its address
    // and, after waiting a moment for a dial that never comes, dials it: nothing listens there,
    // so its receive fails naming rank 0, well before the group's timeout.
    let timeout = Duration::from_secs(60);
    let mut ms = meshes_full(2, Connect::Lazy, timeout, NetConfig::default(), false);
    let mut m1 = ms.pop().unwrap();
    drop(ms); // rank 0's mesh and listener
    let mut got = vec![0u8; 1000];
    let t = Instant::now();
    // SAFETY: `got` outlives the handle, waited at once.
    let e = unsafe { m1.post_recv(0, got.as_mut_ptr(), got.len(), 1) }.and_then(|h| m1.wait(h)).unwrap_err();
    let took = t.elapsed();
    assert!(took < Duration::from_secs(5), "took {took:?}");
    assert!(matches!(e, Error::PeerAborted { rank: 0, .. }), "{e}");
}

#[test]
fn a_lower_rank_slower_than_the_wait_is_dialled_by_the_higher_one() {
    // No false alarm for a live lower rank that reaches the pair's first message late: rank 1
    // dials it (its listener accepts), and the message moves over that one connection.
    let ms = meshes_full(2, Connect::Lazy, Duration::from_secs(20), NetConfig::default(), false);
    let out = on_every_rank(ms, |r, m| {
        if r == 0 {
            std::thread::sleep(Duration::from_millis(2500));
            let before = m.streams_to(1);
            exchange(0, m, &[], &[1], 30_000).map(|_| before)
        } else {
            exchange(1, m, &[0], &[], 30_000).map(|_| 0)
        }
    });
    // Rank 1's dial made the connection while rank 0 was still away: one stream, its message
    // being below the pair's growth size.
    assert_eq!(*out[0].0.as_ref().unwrap(), 1);
    out[1].0.as_ref().unwrap();
    for (r, (_, m)) in out.iter().enumerate() {
        assert_eq!(m.streams_to(1 - r), 1, "rank {r}");
        assert_eq!(m.refused() + m.crossings_refused(), 0, "rank {r}");
    }
}

#[test]
fn eager_mode_connects_every_pair_at_setup() {
    let ms = meshes(3, Connect::Eager, Duration::from_secs(10));
    for (r, m) in ms.iter().enumerate() {
        assert_eq!(m.connected().len(), 2, "rank {r}");
    }
}

#[test]
fn a_peer_that_never_accepts_is_a_timeout_naming_it() {
    // Rank 1's published address is a socket that completes TCP connects (the kernel's backlog)
    // and never answers a hello: the first send to it must fail within the group's timeout,
    // naming rank 1, on the thread waiting for the send.
    let token = [6u8; 16];
    let ip: IpAddr = "127.0.0.1".parse().unwrap();
    let mute = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let l = MeshListener::bind(ip, 0, 2, token, NetConfig::default(), &[], &[0, NSTREAMS], Connect::Lazy).unwrap();
    let addrs = vec![l.addr.to_string(), mute.local_addr().unwrap().to_string()];
    let timeout = Duration::from_millis(1500);
    let mut m = Mesh::connect(l, 0, &addrs, &[0, NSTREAMS], token, timeout).unwrap();
    let data = vec![1u8; 1000];
    let t = Instant::now();
    // SAFETY: `data` outlives the handle, waited just below.
    let h = unsafe { m.post_send(1, data.as_ptr(), data.len(), 3) }.unwrap();
    let e = m.wait(h).unwrap_err();
    let took = t.elapsed();
    assert!(took < timeout + Duration::from_secs(2), "took {took:?}");
    assert!(matches!(e, Error::Timeout { .. }), "{e}");
    assert!(e.to_string().contains("rank 1"), "{e}");
    drop(mute);

    // A peer whose listener is gone (a rank that exited): an error naming it, at once.
    let l = MeshListener::bind(ip, 0, 2, token, NetConfig::default(), &[], &[0, NSTREAMS], Connect::Lazy).unwrap();
    let gone = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addrs = vec![l.addr.to_string(), gone.local_addr().unwrap().to_string()];
    drop(gone);
    let mut m = Mesh::connect(l, 0, &addrs, &[0, NSTREAMS], token, Duration::from_secs(30)).unwrap();
    let t = Instant::now();
    // On loopback the refusal comes at once, from the post's own connect(); elsewhere later, to
    // the wait: either way an error naming rank 1.
    // SAFETY: as above.
    let e = unsafe { m.post_send(1, data.as_ptr(), data.len(), 3) }.and_then(|h| m.wait(h)).unwrap_err();
    assert!(t.elapsed() < Duration::from_secs(5), "took {:?}", t.elapsed());
    assert!(matches!(e, Error::PeerAborted { rank: 1, .. }), "{e}");
}

/// The algorithms run over the mesh alone (every rank on its own host): a ring all_reduce
/// over loopback, then a handle waited twice is refused.
#[test]
fn the_ring_runs_over_the_mesh_alone() {
    let world = 3;
    let ms = meshes(world, Connect::Eager, Duration::from_secs(10));
    let out = on_every_rank(ms, move |r, m| {
        let mut v: Vec<i32> = (0..1000).map(|i| i * (r as i32 + 1)).collect();
        // SAFETY: `v` is a live Vec of i32 viewed as bytes for the call only.
        let b = unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr() as *mut u8, v.len() * 4) };
        let members: Vec<usize> = (0..world).collect();
        crate::algo::ring::all_reduce(m, &members, 1, b, crate::DType::I32, crate::ReduceOp::Sum, world, &mut Vec::new()).unwrap();
        (v, m.wait(Handle(0)).is_err())
    });
    for ((v, refused), _) in out {
        assert!(v.iter().enumerate().all(|(i, &x)| x == i as i32 * 6), "wrong sum");
        assert!(refused, "a handle waited twice must be refused");
    }
}

/// Poll until rank `r`'s streams to `p` are `n` (a grown pair's last streams attach on the
/// reactor's thread, possibly just after the message that asked for them completed).
fn streams_become(m: &Mesh, p: usize, n: usize) -> usize {
    let t = Instant::now();
    while m.streams_to(p) != n && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(2));
    }
    m.streams_to(p)
}

/// A pair starts with one stream while its messages are below the growth size, and opens the
/// rest on its first larger message, whichever rank posts it first, with the addresses the
/// rendezvous gives (only the lower rank can dial) and with every address (the first dials may
/// cross), with and without a job secret (each later stream proves it too): every message
/// checked, nothing refused aloud.
#[test]
fn a_pair_opens_one_stream_for_small_messages_and_the_rest_for_a_large_one() {
    let grow = crate::transport::tcp::grow_at(None, NSTREAMS);
    let secret = NetConfig { secret: crate::transport::tcp::Secret::from_text("lazy-growth-test-secret-0123456789abcdef"), ..NetConfig::default() };
    for (partial, cfg) in [(true, NetConfig::default()), (false, NetConfig::default()), (true, secret)] {
        for round in 0..4 {
            let mut ms = meshes_full(2, Connect::Lazy, Duration::from_secs(20), cfg, partial);
            ms.iter_mut().for_each(|m| m.set_lower_dial_after(Duration::ZERO));
            // Both ranks count before either posts the large message (which may grow the pair).
            let counted = Arc::new(Barrier::new(2));
            let out = on_every_rank(ms, move |r, m| {
                let p = 1 - r;
                let before = exchange(r, m, &[p], &[p], grow - 1).and_then(|_| exchange(r, m, &[p], &[p], 3000));
                let small = m.streams_to(p);
                counted.wait(); // reached on an error too (a failed peer fails this rank's exchange)
                before?;
                // The large message goes one way only, from either rank: its receiver sees its
                // size too, and the rank that made the connection grows it.
                let sender = round % 2;
                for i in 0..3 {
                    let len = grow + i * 100_003;
                    if r == sender { exchange(r, m, &[p], &[], len)? } else { exchange(r, m, &[], &[p], len)? }
                }
                exchange(r, m, &[p], &[p], 2 << 20)?;
                Ok::<_, Error>(small)
            });
            for (r, (res, m)) in out.iter().enumerate() {
                let small = res.as_ref().unwrap_or_else(|e| panic!("partial {partial} round {round} rank {r}: {e}"));
                assert_eq!(*small, 1, "partial {partial} round {round}: rank {r} before any large message (now {}, refused {}, crossings {})", m.streams_to(1 - r), m.refused(), m.crossings_refused());
                assert_eq!(streams_become(m, 1 - r, NSTREAMS), NSTREAMS, "partial {partial} round {round}: rank {r} after");
                assert_eq!(m.refused(), 0, "partial {partial} round {round}: rank {r}");
            }
        }
    }
}

/// A first message at the growth size dials every stream at once; WIRESPEED_GROW_BYTES=0 opens
/// every stream on any first message.
#[test]
fn a_large_first_message_or_growth_size_0_opens_every_stream_at_once() {
    let grow = crate::transport::tcp::grow_at(None, NSTREAMS);
    for (cfg, len) in [(NetConfig::default(), grow), (NetConfig { grow_bytes: Some(0), ..NetConfig::default() }, 10)] {
        let ms = meshes_full(2, Connect::Lazy, Duration::from_secs(20), cfg, true);
        let out = on_every_rank(ms, move |r, m| exchange(r, m, &[1 - r], &[1 - r], len));
        for (r, (res, m)) in out.iter().enumerate() {
            res.as_ref().unwrap();
            assert_eq!(streams_become(m, 1 - r, NSTREAMS), NSTREAMS, "rank {r}, {len} bytes");
        }
    }
}
