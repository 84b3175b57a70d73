//! The peers each cross-host algorithm really talks to, on the simulated network at 64, 256 and
//! 1,024 members (the host leaders of the hierarchical collectives): what a rank connects to now
//! that connections are made on first use (hosts/mesh.rs), against the one connection per remote
//! rank of eager setup. The virtual time of the first small all_reduce among the leaders, the
//! collective part of a group's setup (docs/scale.md). And point-to-point patterns at 64 and 256
//! ranks with the connection step modelled (`SimConfig::connect_us`): all pairs, rings both
//! ways, random pairs; none may deadlock, each rank connects to the peers it used. The leaders'
//! all_gather, reduce_scatter, barrier and reduce (algo/leaders.rs), all_to_all
//! (algo/leaders_a2a.rs), gather and scatter (algo/leaders_gs.rs) at 64-1,024 hosts: a rank
//! talks to its leader, a leader to its host and O(log hosts) leaders.
//! `cargo test -p wirespeed-core --test sim_peers -- --nocapture` prints them.
use std::collections::BTreeSet;
use wirespeed_core::testing::direct::{self, Region};
use wirespeed_core::testing::{doubling, leaders, leaders_a2a, leaders_gs, ring, tree};
use wirespeed_core::testing::sim::{self, SimConfig, SimRank};
use wirespeed_core::testing::{Handle, Transport};
use wirespeed_core::{DType, ReduceOp, Result};

/// A simulated rank that remembers every peer it posts to or from.
struct Counted<'a> {
    t: &'a mut SimRank,
    peers: BTreeSet<usize>,
}

impl Transport for Counted<'_> {
    fn rank(&self) -> usize {
        self.t.rank()
    }
    fn world(&self) -> usize {
        self.t.world()
    }
    // SAFETY: sound on Transport's contract alone, which the wrapped rank asks in turn.
    unsafe fn post_send(&mut self, to: usize, data: *const u8, len: usize, tag: u64) -> Result<Handle> {
        self.peers.insert(to);
        // SAFETY: our caller keeps `data..data+len` readable until the handle completes, which is
        // what SimRank::post_send asks; nothing here touches the bytes.
        unsafe { self.t.post_send(to, data, len, tag) }
    }
    // SAFETY: sound on Transport's contract alone, which the wrapped rank asks in turn.
    unsafe fn post_recv(&mut self, from: usize, data: *mut u8, len: usize, tag: u64) -> Result<Handle> {
        self.peers.insert(from);
        // SAFETY: our caller keeps `data..data+len` writable and unshared until the handle
        // completes, which is what SimRank::post_recv asks.
        unsafe { self.t.post_recv(from, data, len, tag) }
    }
    fn wait(&mut self, h: Handle) -> Result<()> {
        self.t.wait(h)
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Algo {
    Ring,
    Doubling,
    Tree,
    Barrier,
}

/// (most peers of any member, virtual microseconds) of one call of `algo` on `n` members over
/// 4 KiB, on a network of 25 us latency and 1.25 GB/s links (10 Gbit/s).
fn peers_of(algo: Algo, n: usize) -> (usize, f64) {
    let cfg = SimConfig { latency_us: 25.0, bandwidth: 1250.0, flow_cap: None, timeout_us: 60e6, connect_us: 0.0 };
    let members: Vec<usize> = (0..n).collect();
    let (res, rep) = sim::run(n, cfg, &[], |t| {
        let mut c = Counted { t, peers: BTreeSet::new() };
        let mut buf: Vec<u8> = (0..1024u32).flat_map(|i| (i as f32).to_le_bytes()).collect();
        let mut scratch = Vec::new();
        match algo {
            Algo::Ring => ring::all_reduce(&mut c, &members, 1, &mut buf, DType::F32, ReduceOp::Sum, n, &mut scratch)?,
            Algo::Doubling => doubling::all_reduce(&mut c, &members, 1, &mut buf, DType::F32, ReduceOp::Sum, n, &mut scratch)?,
            Algo::Tree => tree::broadcast(&mut c, &members, 1, &mut buf, 0)?,
            Algo::Barrier => direct::barrier(&mut c, &members, 1)?,
        }
        Ok(c.peers.len())
    });
    let most = res.into_iter().map(|r| r.expect("a simulated rank failed")).max().unwrap();
    (most, rep.elapsed_us)
}

/// Peers and virtual time of the leaders' collectives at `n` members (a power of two).
fn check(n: usize, with_ring: bool) {
    let log = n.trailing_zeros() as usize;
    let (dbl_p, dbl_us) = peers_of(Algo::Doubling, n);
    let (tree_p, tree_us) = peers_of(Algo::Tree, n);
    let (bar_p, bar_us) = peers_of(Algo::Barrier, n);
    println!(
        "members {n:>5}: most peers per member: doubling {dbl_p} ({dbl_us:.0} us), tree broadcast {tree_p} \
         ({tree_us:.0} us), barrier {bar_p} ({bar_us:.0} us); full mesh {}",
        n - 1
    );
    assert_eq!(dbl_p, log);
    assert_eq!(tree_p, log); // the root sends to log2(n) children
    assert!(bar_p < 2 * log, "{bar_p}"); // dissemination: log2(n) rounds, a peer each way
    // doubling's small all_reduce: log2(n) exchanges of about one latency each
    assert!(dbl_us >= log as f64 * 25.0 && dbl_us < log as f64 * 25.0 * 2.0, "{dbl_us}");
    if with_ring {
        let (ring_p, ring_us) = peers_of(Algo::Ring, n);
        println!("members {n:>5}: ring {ring_p} peers ({ring_us:.0} us: 2(n-1) steps of a latency)");
        assert_eq!(ring_p, 2);
    }
}

/// About 5 s in a debug build: a thread per member, one at a time. The ring (2 peers whatever
/// n) is run at 64 only: its 2(n-1) steps make 1,024 members take minutes.
#[test]
fn the_leaders_collectives_talk_to_a_logarithmic_number_of_peers() {
    check(64, true);
    check(256, false);
    check(1024, false);
}

/// Each rank's peers in the leaders' all_gather, reduce_scatter, barrier and reduce (root rank
/// 0) over `hosts` hosts of `per` ranks (ranks dealt in blocks), on one simulated network; and
/// the virtual microseconds all four took.
fn leaders_peers(hosts: usize, per: usize) -> (Vec<[usize; 4]>, f64) {
    let cfg = SimConfig { latency_us: 25.0, bandwidth: 1250.0, flow_cap: None, timeout_us: 60e6, connect_us: 0.0 };
    let n = hosts * per;
    let layout: Vec<Vec<usize>> = (0..hosts).map(|g| (g * per..(g + 1) * per).collect()).collect();
    let (res, rep) = sim::run(n, cfg, &[], |t| {
        let me = t.rank();
        let mut counts = [0usize; 4];
        let mut scratch = Vec::new();
        // all_gather of 4 bytes per rank.
        let mut c = Counted { t, peers: BTreeSet::new() };
        let mine = (me as u32).to_le_bytes();
        let mut all = vec![0u8; 4 * n];
        let recv: Vec<Region> = (0..n).map(|j| Region { ptr: all[4 * j..].as_mut_ptr(), len: 4 }).collect();
        // SAFETY: `mine` and `all` outlive the call; `recv` cuts `all` into disjoint 4-byte runs.
        unsafe { leaders::all_gather(&mut c, &layout, 1, Region { ptr: mine.as_ptr() as *mut u8, len: 4 }, &recv, &mut scratch)? };
        assert!((0..n).all(|j| all[4 * j..4 * j + 4] == (j as u32).to_le_bytes()), "all_gather on rank {me}");
        counts[0] = std::mem::take(&mut c.peers).len();
        // reduce_scatter of one f32 per rank.
        let mut input: Vec<u8> = (0..n).flat_map(|j| ((me + j) as f32).to_le_bytes()).collect();
        let chunks: Vec<Region> = (0..n).map(|j| Region { ptr: input[4 * j..].as_mut_ptr(), len: 4 }).collect();
        let mut out = [0u8; 4];
        // SAFETY: `input` and `out` outlive the call; `chunks` cuts `input` into disjoint runs.
        unsafe { leaders::reduce_scatter(&mut c, &layout, 2, &chunks, out.as_mut_ptr(), 1, DType::F32, ReduceOp::Sum, n, &mut scratch)? };
        assert_eq!(f32::from_le_bytes(out), (0..n).map(|r| (r + me) as f32).sum::<f32>(), "reduce_scatter on rank {me}");
        counts[1] = std::mem::take(&mut c.peers).len();
        leaders::barrier(&mut c, &layout, 3)?;
        counts[2] = std::mem::take(&mut c.peers).len();
        let mut b = 1f32.to_le_bytes().to_vec();
        leaders::reduce(&mut c, &layout, 4, &mut b, DType::F32, ReduceOp::Sum, 0, n, &mut scratch)?;
        if me == 0 {
            assert_eq!(b, (n as f32).to_le_bytes(), "reduce on the root");
        }
        counts[3] = c.peers.len();
        Ok(counts)
    });
    (res.into_iter().enumerate().map(|(r, x)| x.unwrap_or_else(|e| panic!("{hosts} hosts x {per}: rank {r}: {e}"))).collect(), rep.elapsed_us)
}

/// The leaders' all_gather, reduce_scatter and barrier across `hosts` hosts (a power of two) of
/// `per` ranks: a non-leader talks to its leader alone; a leader to its host's other ranks and
/// to 2·log2(hosts) - 1 leaders (Bruck's and the dissemination's rounds send to h - 2^k and
/// receive from h + 2^k, which meet once, at 2^k = hosts/2). The reduce's binomial tree: the
/// root's leader has log2(hosts) children.
fn leaders_case(hosts: usize, per: usize) {
    let log = hosts.trailing_zeros() as usize;
    let (peers, us) = leaders_peers(hosts, per);
    let leader = 2 * log - 1 + (per - 1);
    let most = |i: usize| peers.iter().map(|p| p[i]).max().unwrap();
    println!(
        "{hosts:>5} hosts x {per}: most peers of a leader: all_gather {}, reduce_scatter {}, barrier {}, reduce {}; \
         of any other rank: {}; full mesh {} ({us:.0} us for the four)",
        most(0), most(1), most(2), most(3),
        peers.iter().enumerate().filter(|(r, _)| r % per != 0).map(|(_, p)| p.iter().max().unwrap()).max().copied().unwrap_or(0),
        hosts * per - 1
    );
    for (r, p) in peers.iter().enumerate() {
        if r % per == 0 {
            assert_eq!(p[..3], [leader; 3], "{hosts} x {per}: leader {r}");
            assert!(p[3] <= log + per, "{hosts} x {per}: leader {r} in the reduce: {}", p[3]);
        } else {
            assert_eq!(*p, [1; 4], "{hosts} x {per}: rank {r} talks to its leader only");
        }
    }
    assert_eq!(peers[0][3], log + per - 1, "the root's leader: its children and its host");
}

/// 64 to 1,024 hosts of 2 ranks and 64 of 8 (2,048 simulated ranks at most, one thread each;
/// about 10 s in a debug build).
#[test]
fn the_leaders_gathers_and_barrier_talk_to_a_logarithmic_number_of_peers() {
    for (hosts, per) in [(64, 2), (256, 2), (1024, 2), (64, 8)] {
        leaders_case(hosts, per);
    }
}

/// Most peers of a leader and of a non-leader in one leaders' all_to_all (algo/leaders_a2a.rs)
/// over `nh` hosts of `per` ranks each, placed in blocks, one byte per pair (each checked), and
/// the virtual time.
fn leaders_a2a_peers(nh: usize, per: usize) -> (usize, usize, f64) {
    let cfg = SimConfig { latency_us: 25.0, bandwidth: 1250.0, flow_cap: None, timeout_us: 600e6, connect_us: 0.0 };
    let n = nh * per;
    let hosts: Vec<Vec<usize>> = (0..nh).map(|h| (h * per..(h + 1) * per).collect()).collect();
    let (res, rep) = sim::run(n, cfg, &[], |t| {
        let me = t.rank();
        let mut c = Counted { t, peers: BTreeSet::new() };
        let mut out: Vec<u8> = (0..n).map(|j| (me * 7 + j) as u8).collect();
        let mut inb = vec![0u8; n];
        let send: Vec<Region> = (0..n).map(|j| Region { ptr: out[j..].as_mut_ptr(), len: 1 }).collect();
        let recv: Vec<Region> = (0..n).map(|j| Region { ptr: inb[j..].as_mut_ptr(), len: 1 }).collect();
        // SAFETY: one byte of `out` or `inb` per region, both alive and untouched by anything
        // else during the call; the receive regions are distinct bytes of `inb`.
        unsafe { leaders_a2a::all_to_all(&mut c, &hosts, 1, &send, &recv)? };
        for (j, &b) in inb.iter().enumerate() {
            assert_eq!(b, (j * 7 + me) as u8, "rank {me}'s byte from {j}");
        }
        Ok((me % per == 0, c.peers.len()))
    });
    let res: Vec<(bool, usize)> = res.into_iter().map(|r| r.expect("a simulated rank failed")).collect();
    let lead = res.iter().filter(|r| r.0).map(|r| r.1).max().unwrap();
    let other = res.iter().filter(|r| !r.0).map(|r| r.1).max().unwrap_or(0);
    assert!(res.iter().filter(|r| !r.0).all(|r| r.1 == 1), "a non-leader talked to more than its leader");
    (lead, other, rep.elapsed_us)
}

/// all_to_all across hosts through the leaders: a non-leader talks to its leader only; a leader
/// to its host's other ranks and to at most 2 ceil(log2 H) leaders (Bruck's rounds: to p + 2^k,
/// from p - 2^k), where the direct exchange talks to all n - 1 ranks. At 1,024 hosts x 2 ranks
/// the simulation takes about a minute in a debug build.
#[test]
fn the_leaders_all_to_all_talks_to_a_logarithmic_number_of_peers() {
    // 100: a number of hosts that is not a power of two (p + 2^k and p - 2^k all differ).
    for nh in [64, 100, 256, 1024] {
        let per = 2;
        let (lead, other, us) = leaders_a2a_peers(nh, per);
        let log = (nh as f64).log2().ceil() as usize;
        let bound = 2 * log + (per - 1);
        println!("all_to_all through leaders, {nh} hosts x {per}: most peers of a leader {lead} (bound {bound}), of another rank {other} ({us:.0} us); full mesh {}", nh * per - 1);
        assert!(lead <= bound, "{lead} > {bound}");
        assert_eq!(other, 1);
    }
}

/// Each rank's peers in the leaders' gather and scatter (algo/leaders_gs.rs) over `nh` hosts of
/// `per` ranks (in blocks), from root 0 (a leader) and root 1 (not one): [gather 0, scatter 0,
/// gather 1, scatter 1], 4 bytes a rank, each result checked; and the virtual time of the four.
fn leaders_gs_peers(nh: usize, per: usize) -> (Vec<[usize; 4]>, f64) {
    let cfg = SimConfig { latency_us: 25.0, bandwidth: 1250.0, flow_cap: None, timeout_us: 60e6, connect_us: 0.0 };
    let n = nh * per;
    let hosts: Vec<Vec<usize>> = (0..nh).map(|h| (h * per..(h + 1) * per).collect()).collect();
    let (res, rep) = sim::run(n, cfg, &[], |t| {
        let me = t.rank();
        let mut c = Counted { t, peers: BTreeSet::new() };
        let mut scratch = Vec::new();
        let mut counts = [0usize; 4];
        for (k, root) in [0, 1].into_iter().enumerate() {
            let mine = (me as u32).to_le_bytes();
            let mut all = vec![0u8; 4 * n];
            let recv: Vec<Region> = if me == root { (0..n).map(|j| Region { ptr: all[4 * j..].as_mut_ptr(), len: 4 }).collect() } else { Vec::new() };
            // SAFETY: `mine` and `all` outlive the call; `recv` cuts `all` into disjoint 4-byte runs.
            unsafe { leaders_gs::gather(&mut c, &hosts, 1 + k as u64, Region { ptr: mine.as_ptr() as *mut u8, len: 4 }, &recv, root, &mut scratch)? };
            if me == root {
                assert!((0..n).all(|j| all[4 * j..4 * j + 4] == (j as u32).to_le_bytes()), "gather on root {root}");
            }
            counts[2 * k] = std::mem::take(&mut c.peers).len();
            let mut out = [0u8; 4];
            let send: Vec<Region> = if me == root { (0..n).map(|j| Region { ptr: all[4 * j..].as_mut_ptr(), len: 4 }).collect() } else { Vec::new() };
            // SAFETY: as for the gather; `out` is 4 bytes of our own.
            unsafe { leaders_gs::scatter(&mut c, &hosts, 3 + k as u64, &send, Region { ptr: out.as_mut_ptr(), len: 4 }, root, &mut scratch)? };
            assert_eq!(out, (me as u32).to_le_bytes(), "scatter from {root} on rank {me}");
            counts[2 * k + 1] = std::mem::take(&mut c.peers).len();
        }
        Ok(counts)
    });
    (res.into_iter().enumerate().map(|(r, x)| x.unwrap_or_else(|e| panic!("{nh} hosts x {per}: rank {r}: {e}"))).collect(), rep.elapsed_us)
}

/// gather and scatter across hosts through the leaders: a non-leader talks to its leader only
/// (the root too, when it leads no host); a leader to its host's other ranks and its parent and
/// children in the binomial tree over the leaders: at most ceil(log2 H) leaders, exactly that
/// many at the root's leader (its children), where a direct gather makes the root talk to all
/// n - 1 ranks.
#[test]
fn the_leaders_gather_and_scatter_talk_to_a_logarithmic_number_of_peers() {
    // 100: a number of hosts that is not a power of two.
    for nh in [64, 100, 256, 1024] {
        let per = 2;
        let (peers, us) = leaders_gs_peers(nh, per);
        let log = (nh as f64).log2().ceil() as usize;
        let bound = log + per - 1;
        let lead = peers.iter().step_by(per).flat_map(|p| p.iter().copied()).max().unwrap();
        println!("gather and scatter through leaders, {nh} hosts x {per}: most peers of a leader {lead} (bound {bound}), of another rank 1 ({us:.0} us for the four); direct: the root talks to {}", nh * per - 1);
        for (r, p) in peers.iter().enumerate() {
            if r % per == 0 {
                assert!(p.iter().all(|&x| x <= bound), "{nh} x {per}: leader {r}: {p:?} > {bound}");
            } else {
                assert_eq!(*p, [1; 4], "{nh} x {per}: rank {r} talks to its leader only");
            }
        }
        assert_eq!(peers[0], [bound; 4], "{nh} x {per}: the root's leader: its children and its host");
    }
}

/// A point-to-point pattern: what every rank sends to and receives from, round by round.
#[derive(Clone, Copy, Debug)]
enum P2p {
    /// Every rank sends to every other and receives from every other, all posted, then waited.
    AllPairs,
    /// Every rank sends to both ring neighbours and receives from both, all posted, then waited.
    RingBothWays,
    /// The ring of blocking calls that cannot deadlock: even ranks send then receive, odd ranks
    /// receive then send (each waited before the next is posted), rightwards then leftwards. A
    /// rank blocks in its first call while the connection is not made yet.
    RingBlocking,
    /// Random pairs (seeded), a new draw each round. Even rounds: a random permutation p, rank r
    /// sends to p(r) and receives from p^-1(r), both posted, then waited. Odd rounds: a random
    /// matching, blocking calls: the lower rank of a pair sends then receives, the higher
    /// receives then sends, so both ranks of a new pair dial at once (a crossing).
    RandomPairs,
}

fn lcg(x: &mut u64) -> u64 {
    *x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    *x >> 33
}

/// The permutation of round `k` over `n` ranks (the same on every rank).
fn perm(n: usize, k: usize) -> Vec<usize> {
    let mut p: Vec<usize> = (0..n).collect();
    let mut x = 0x5eed + k as u64;
    for i in (1..n).rev() {
        p.swap(i, (lcg(&mut x) % (i as u64 + 1)) as usize);
    }
    p
}

fn body(from: usize, to: usize, round: usize) -> Vec<u8> {
    (0..256).map(|i| (from * 7 + to * 3 + round * 11 + i) as u8).collect()
}

/// Run `pat` over `n` simulated ranks; per rank the peers it used, and the report.
fn run_p2p(pat: P2p, n: usize, connect_us: f64) -> (Vec<BTreeSet<usize>>, sim::SimReport) {
    let cfg = SimConfig { latency_us: 25.0, bandwidth: 1250.0, flow_cap: None, timeout_us: 60e6, connect_us };
    let rounds = 3;
    let (res, rep) = sim::run(n, cfg, &[], |t| {
        let me = t.rank();
        let mut c = Counted { t, peers: BTreeSet::new() };
        for k in 0..rounds {
            let tag = k as u64;
            match pat {
                P2p::AllPairs | P2p::RingBothWays => {
                    let (to, from): (Vec<usize>, Vec<usize>) = match pat {
                        P2p::AllPairs => (1..n).map(|i| ((me + i) % n, (me + n - i) % n)).unzip(),
                        _ => (vec![(me + 1) % n, (me + n - 1) % n], vec![(me + n - 1) % n, (me + 1) % n]),
                    };
                    let outs: Vec<Vec<u8>> = to.iter().map(|&p| body(me, p, k)).collect();
                    let mut ins: Vec<Vec<u8>> = from.iter().map(|_| vec![0u8; 256]).collect();
                    let mut hs: Vec<Handle> = Vec::new();
                    for (i, &p) in to.iter().enumerate() {
                        // SAFETY: `outs` outlives every handle, all waited below.
                        hs.push(unsafe { c.post_send(p, outs[i].as_ptr(), 256, tag)? });
                    }
                    for (i, &p) in from.iter().enumerate() {
                        // SAFETY: `ins` likewise, untouched until every handle is waited.
                        hs.push(unsafe { c.post_recv(p, ins[i].as_mut_ptr(), 256, tag)? });
                    }
                    for h in hs {
                        c.wait(h)?;
                    }
                    for (i, &p) in from.iter().enumerate() {
                        assert_eq!(ins[i], body(p, me, k), "rank {me} from {p} round {k}");
                    }
                }
                P2p::RingBlocking => {
                    for dir in [1, n - 1] {
                        let (to, from) = ((me + dir) % n, (me + n - dir) % n);
                        let out = body(me, to, k);
                        let mut inb = vec![0u8; 256];
                        let send = |c: &mut Counted| -> Result<()> {
                            // SAFETY: `out` outlives the handle, waited at once.
                            let h = unsafe { c.post_send(to, out.as_ptr(), 256, tag)? };
                            c.wait(h)
                        };
                        // Both orders are waited one call at a time: a rank that receives first
                        // waits there before its own send's connection exists.
                        if me % 2 == 0 {
                            send(&mut c)?;
                        }
                        // SAFETY: `inb` outlives the handle, waited at once.
                        let h = unsafe { c.post_recv(from, inb.as_mut_ptr(), 256, tag)? };
                        c.wait(h)?;
                        if me % 2 == 1 {
                            send(&mut c)?;
                        }
                        assert_eq!(inb, body(from, me, k));
                    }
                }
                P2p::RandomPairs => {
                    let p = perm(n, k);
                    let (to, from) = if k % 2 == 1 {
                        // The matching: consecutive entries of the permutation are pairs.
                        let i = p.iter().position(|&x| x == me).unwrap();
                        let mate = if i % 2 == 0 { p.get(i + 1) } else { Some(&p[i - 1]) };
                        match mate {
                            Some(&m) => (m, m),
                            None => continue, // odd n: one rank sits out
                        }
                    } else {
                        (p[me], p.iter().position(|&x| x == me).unwrap())
                    };
                    if to == me {
                        continue;
                    }
                    let out = body(me, to, k);
                    let mut inb = vec![0u8; 256];
                    if k % 2 == 1 {
                        let send = |c: &mut Counted| -> Result<()> {
                            // SAFETY: `out` outlives the handle, waited at once.
                            let h = unsafe { c.post_send(to, out.as_ptr(), 256, tag)? };
                            c.wait(h)
                        };
                        if me < to {
                            send(&mut c)?;
                        }
                        // SAFETY: `inb` outlives the handle, waited at once.
                        let h = unsafe { c.post_recv(from, inb.as_mut_ptr(), 256, tag)? };
                        c.wait(h)?;
                        if me > to {
                            send(&mut c)?;
                        }
                    } else {
                        // SAFETY: as above.
                        let s = unsafe { c.post_send(to, out.as_ptr(), 256, tag)? };
                        // SAFETY: as above.
                        let r = unsafe { c.post_recv(from, inb.as_mut_ptr(), 256, tag)? };
                        c.wait(r)?;
                        c.wait(s)?;
                    }
                    assert_eq!(inb, body(from, me, k));
                }
            }
        }
        Ok(c.peers)
    });
    let peers = res.into_iter().enumerate().map(|(r, x)| x.unwrap_or_else(|e| panic!("{pat:?} on {n} ranks: rank {r}: {e}"))).collect();
    (peers, rep)
}

/// `pat` on `n` ranks with connections modelled (the lower rank of a pair connects on its first
/// post toward the other) and without: the same peers, every rank's connections those of the
/// pattern's graph, and the connections' cost paid in time only.
fn p2p_case(pat: P2p, n: usize) {
    let connect_us = 200.0; // two round trips of 25 us, and the handshake's work, generously
    let (peers, rep) = run_p2p(pat, n, connect_us);
    let (peers0, rep0) = run_p2p(pat, n, 0.0);
    assert_eq!(peers, peers0);
    // Each rank connects to exactly the peers it (or they, toward it) used: the graph of the
    // pattern, not the job.
    for r in 0..n {
        let mut along: BTreeSet<usize> = peers[r].clone();
        along.extend((0..n).filter(|&q| peers[q].contains(&r)));
        assert_eq!(rep.connections[r], along.len(), "{pat:?}: rank {r}'s connections");
    }
    let most = rep.connections.iter().max().unwrap();
    // The connections cost time once per pair, never a deadlock: later than without them, by
    // no more than a connection per round in which new pairs meet (the rounds run in sequence).
    let extra = rep.elapsed_us - rep0.elapsed_us;
    println!("{pat:?} on {n} ranks: most connections per rank {most} (full mesh {}), {:.0} us ({:.0} us without the connection step)", n - 1, rep.elapsed_us, rep0.elapsed_us);
    assert!(extra >= connect_us * 0.99 && extra <= 4.0 * connect_us * 1.01, "{pat:?}: {extra} us more");
}

/// Point-to-point patterns with connections made on first use, at 64 and 256 simulated ranks:
/// none deadlocks (a deadlock would end in the simulator's timeout, an error on every waiting
/// rank), every message arrives whole, and each rank holds connections only to the peers the
/// pattern pairs it with.
#[test]
fn p2p_patterns_with_connections_on_first_use_never_deadlock() {
    p2p_case(P2p::AllPairs, 64);
    for n in [64, 256] {
        p2p_case(P2p::RingBothWays, n);
        p2p_case(P2p::RingBlocking, n);
        p2p_case(P2p::RandomPairs, n);
    }
}
