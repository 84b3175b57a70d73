//! The peers each cross-host algorithm really talks to, on the simulated network at 64, 256 and
//! 1,024 members (the host leaders of the hierarchical collectives): what a rank would connect to
//! if connections were made along the algorithms' graph on first use (issue 29's second item,
//! not done), against the one connection per remote rank that setup makes now. And the virtual
//! time of the first small all_reduce among the leaders, the collective part of a group's setup
//! (docs/scale.md). `cargo test -p wirespeed-core --test sim_peers -- --nocapture` prints them.
use std::collections::BTreeSet;
use wirespeed_core::algo::direct;
use wirespeed_core::algo::{doubling, ring, tree};
use wirespeed_core::transport::sim::{self, SimConfig, SimRank};
use wirespeed_core::transport::{Handle, Transport};
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
    // SAFETY: unsafe to call: `Transport`'s contract (transport/mod.rs), passed on unchanged to the simulated rank
    unsafe fn post_send(&mut self, to: usize, data: *const u8, len: usize, tag: u64) -> Result<Handle> {
        self.peers.insert(to);
        // SAFETY: our caller keeps `data..data+len` readable until the handle completes, which is
        // what SimRank::post_send asks; nothing here touches the bytes.
        unsafe { self.t.post_send(to, data, len, tag) }
    }
    // SAFETY: unsafe to call: `Transport`'s contract (transport/mod.rs), passed on unchanged to the simulated rank
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
    let cfg = SimConfig { latency_us: 25.0, bandwidth: 1250.0, flow_cap: None, timeout_us: 60e6 };
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
