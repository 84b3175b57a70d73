//! The leaders' all_to_all (algo/leaders_a2a.rs), gather and scatter (algo/leaders_gs.rs, from
//! every root) on the simulated network: every byte checked over layouts that are uneven (hosts
//! of 3, 1 and 2 ranks), cyclic (rank order interleaving hosts), of a number of hosts that is not
//! a power of two, one host, one rank per host; piece lengths drawn per pair (zeros among them),
//! in place and not; and a length a receiver does not expect is a Mismatch naming both ranks on
//! that receiver, every other rank ending (no hang).
use wirespeed_core::testing::direct::Region;
use wirespeed_core::testing::leaders_a2a;
use wirespeed_core::testing::sim::{self, SimConfig};
use wirespeed_core::testing::Transport;
use wirespeed_core::Error;

fn lcg(x: &mut u64) -> u64 {
    *x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    *x >> 33
}

/// Bytes rank `from` sends rank `to` in case `seed`: a drawn length (a quarter of them zero),
/// the same on both sides.
fn piece_len(seed: u64, from: usize, to: usize) -> usize {
    let mut x = seed ^ ((from as u64) << 20) ^ ((to as u64) << 40) ^ 0x9e37_79b9;
    lcg(&mut x);
    let v = lcg(&mut x) as usize;
    if v % 4 == 0 { 0 } else { v % 300 }
}

fn piece(seed: u64, from: usize, to: usize) -> Vec<u8> {
    (0..piece_len(seed, from, to)).map(|i| (from * 131 + to * 31 + i * 7 + seed as usize) as u8).collect()
}

/// The hosts of a layout given as each rank's host id (hosts ordered by their lowest rank).
fn hosts_of(ids: &[usize]) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = Vec::new();
    let mut hosts: Vec<Vec<usize>> = Vec::new();
    for (r, &id) in ids.iter().enumerate() {
        let h = order.iter().position(|&x| x == id).unwrap_or_else(|| {
            order.push(id);
            hosts.push(Vec::new());
            hosts.len() - 1
        });
        hosts[h].push(r);
    }
    hosts
}

/// Run the all_to_all of case `seed` on the layout `ids`; `in_place`: each rank's own piece is
/// one region, sent and received. Every rank's result checked byte by byte.
fn case(ids: &[usize], seed: u64, in_place: bool) {
    let n = ids.len();
    let hosts = hosts_of(ids);
    let (res, _) = sim::run(n, SimConfig::default(), &[], |t| {
        let me = t.rank();
        let mut sends: Vec<Vec<u8>> = (0..n).map(|j| piece(seed, me, j)).collect();
        let mut recvs: Vec<Vec<u8>> = (0..n).map(|j| vec![0xAB; piece_len(seed, j, me)]).collect();
        let send: Vec<Region> = sends.iter_mut().map(|v| Region { ptr: v.as_mut_ptr(), len: v.len() }).collect();
        let mut recv: Vec<Region> = recvs.iter_mut().map(|v| Region { ptr: v.as_mut_ptr(), len: v.len() }).collect();
        if in_place {
            recv[me] = send[me];
        }
        // SAFETY: every region is a Vec of its length that outlives the call, untouched by
        // anything else; receive regions are distinct Vecs, recv[me] is send[me] in place.
        unsafe { leaders_a2a::all_to_all(t, &hosts, 9, &send, &recv)? };
        if in_place {
            recvs[me] = sends[me].clone();
        }
        Ok(recvs)
    });
    for (me, r) in res.into_iter().enumerate() {
        let got = r.unwrap_or_else(|e| panic!("{ids:?} seed {seed}: rank {me}: {e}"));
        for (j, g) in got.iter().enumerate() {
            assert_eq!(*g, piece(seed, j, me), "{ids:?} seed {seed}: rank {me}'s piece from {j}");
        }
    }
}

/// The host ids of the layouts every leaders' test runs: uneven, cyclic, 5, 7 and 9 hosts, one
/// rank per host, one host, ids out of order.
fn layouts() -> Vec<Vec<usize>> {
    vec![
        vec![0, 0, 0, 1, 2, 2],                   // uneven: 3, 1, 2
        vec![0, 1, 2, 0, 2, 0],                   // uneven and cyclic
        vec![0, 1, 2, 3, 4, 0, 1, 2, 3, 4],       // cyclic, 5 hosts
        vec![0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6], // 7 hosts of 2
        vec![0, 1, 2],                            // one rank per host
        vec![0, 0, 0, 0],                         // one host
        vec![0, 1],
        vec![0, 0, 1, 1, 1, 1, 2, 3, 3, 4, 5, 5, 6, 7, 7, 7, 8], // 9 hosts, 1 to 4 ranks
        vec![3, 2, 1, 0, 3, 2, 1, 0, 1, 1],       // cyclic, uneven, ids not in order
    ]
}

#[test]
fn leaders_all_to_all_is_exact_on_every_layout() {
    let layouts = layouts();
    for ids in &layouts {
        for seed in 0..3 {
            case(ids, seed, seed == 1);
        }
    }
}

/// Rank 4 expects 3 bytes more from rank 1 than rank 1 sends: rank 4 fails with a Mismatch
/// naming ranks 1 and 4; every other rank ends, with its result or an error, never a hang.
#[test]
fn a_length_the_receiver_does_not_expect_is_a_mismatch_naming_both_ranks() {
    let ids = [0, 1, 2, 0, 1, 2, 0];
    let hosts = hosts_of(&ids);
    let n = ids.len();
    let cfg = SimConfig { timeout_us: 1e6, ..SimConfig::default() };
    let (res, _) = sim::run(n, cfg, &[], |t| {
        let me = t.rank();
        let mut sends: Vec<Vec<u8>> = (0..n).map(|j| vec![me as u8; 10 + j]).collect();
        let mut recvs: Vec<Vec<u8>> = (0..n).map(|j| vec![0; 10 + me + if me == 4 && j == 1 { 3 } else { 0 }]).collect();
        let send: Vec<Region> = sends.iter_mut().map(|v| Region { ptr: v.as_mut_ptr(), len: v.len() }).collect();
        let recv: Vec<Region> = recvs.iter_mut().map(|v| Region { ptr: v.as_mut_ptr(), len: v.len() }).collect();
        // SAFETY: every region is its own Vec, alive and untouched by anything else during the call.
        unsafe { leaders_a2a::all_to_all(t, &hosts, 9, &send, &recv) }
    });
    match &res[4] {
        Err(Error::Mismatch(m)) => assert!(m.contains("rank 1 sends 14 bytes to rank 4") && m.contains("expects 17"), "{m}"),
        other => panic!("rank 4: {other:?}"),
    }
    for (r, x) in res.iter().enumerate() {
        assert!(!matches!(x, Err(Error::Timeout { .. })), "rank {r} hung: {x:?}");
    }
}

/// Run gather then scatter from every root of the layout `ids` in case `seed` (rank j's piece
/// for the root: `piece(seed, j, root)`; the root's for rank j: `piece(seed, root, j)`), through
/// the leaders (algo/leaders_gs.rs); `in_place`: the root's own piece is one region, sent and
/// received. Every byte checked on the root (gather) and on every rank (scatter).
fn gs_case(ids: &[usize], seed: u64, in_place: bool) {
    let n = ids.len();
    let hosts = hosts_of(ids);
    let (res, _) = sim::run(n, SimConfig::default(), &[], |t| {
        let me = t.rank();
        let mut s = Vec::new();
        let mut out = Vec::new();
        for root in 0..n {
            let mut own = piece(seed, me, root);
            let mut got: Vec<Vec<u8>> = if me == root { (0..n).map(|j| vec![0xAB; piece_len(seed, j, root)]).collect() } else { Vec::new() };
            let mut recv: Vec<Region> = got.iter_mut().map(|v| Region { ptr: v.as_mut_ptr(), len: v.len() }).collect();
            let send = Region { ptr: own.as_mut_ptr(), len: own.len() };
            if in_place && me == root {
                recv[me] = send;
            }
            // SAFETY: `own` and every `got` vector outlive the call, distinct Vecs (the root's
            // own output is `send` itself in place); a failure returns, and the simulator cuts
            // us off.
            unsafe { wirespeed_core::testing::leaders_gs::gather(t, &hosts, 100 + root as u64, send, &recv, root, &mut s)? };
            if in_place && me == root {
                got[me] = own.clone();
            }
            let mut ins: Vec<Vec<u8>> = if me == root { (0..n).map(|j| piece(seed, root, j)).collect() } else { Vec::new() };
            let send: Vec<Region> = ins.iter_mut().map(|v| Region { ptr: v.as_mut_ptr(), len: v.len() }).collect();
            let mut mine = vec![0xCD; piece_len(seed, root, me)];
            let recv = if in_place && me == root { send[me] } else { Region { ptr: mine.as_mut_ptr(), len: mine.len() } };
            // SAFETY: `mine` and every `ins` vector outlive the call, distinct Vecs (the root's
            // own input is `recv` itself in place); a failure returns, and the simulator cuts us off.
            unsafe { wirespeed_core::testing::leaders_gs::scatter(t, &hosts, 200 + root as u64, &send, recv, root, &mut s)? };
            if in_place && me == root {
                mine = ins[me].clone();
            }
            out.push((got, mine));
        }
        Ok(out)
    });
    for (me, r) in res.into_iter().enumerate() {
        let per_root = r.unwrap_or_else(|e| panic!("{ids:?} seed {seed}: rank {me}: {e}"));
        for (root, (got, mine)) in per_root.iter().enumerate() {
            if me == root {
                for (j, g) in got.iter().enumerate() {
                    assert_eq!(*g, piece(seed, j, root), "{ids:?} seed {seed}: gather to root {root}: piece of {j}");
                }
            }
            assert_eq!(*mine, piece(seed, root, me), "{ids:?} seed {seed}: scatter from root {root} to {me}");
        }
    }
}

/// gather and scatter through the leaders from every root (a leader and not), over uneven,
/// cyclic, 5 and 7 hosts, one rank per host, one host; pieces of drawn lengths, zeros among them.
#[test]
fn leaders_gather_and_scatter_are_exact_from_every_root_on_every_layout() {
    let layouts = layouts();
    for ids in &layouts {
        for seed in 0..3 {
            gs_case(ids, seed, seed == 1);
        }
    }
}

/// On layout `ids`, a gather to `root` where the root expects `extra` more bytes from rank `odd`
/// than it sends, and a scatter from `root` where rank `odd` expects `extra` more bytes than the
/// root sends it: (gather's results, scatter's results), every rank's.
fn gs_mismatch(ids: &[usize], root: usize, odd: usize, extra: usize) -> (Vec<wirespeed_core::Result<()>>, Vec<wirespeed_core::Result<()>>) {
    let hosts = hosts_of(ids);
    let n = ids.len();
    let cfg = SimConfig { timeout_us: 1e6, ..SimConfig::default() };
    let (g, _) = sim::run(n, cfg, &[], |t| {
        let me = t.rank();
        let mut own = vec![me as u8; 10 + me];
        let mut got: Vec<Vec<u8>> = if me == root { (0..n).map(|j| vec![0; 10 + j + if j == odd { extra } else { 0 }]).collect() } else { Vec::new() };
        let recv: Vec<Region> = got.iter_mut().map(|v| Region { ptr: v.as_mut_ptr(), len: v.len() }).collect();
        let mut s = Vec::new();
        // SAFETY: every region is its own Vec, alive and untouched by anything else during the call.
        unsafe { wirespeed_core::testing::leaders_gs::gather(t, &hosts, 9, Region { ptr: own.as_mut_ptr(), len: own.len() }, &recv, root, &mut s) }
    });
    let (s, _) = sim::run(n, cfg, &[], |t| {
        let me = t.rank();
        let mut ins: Vec<Vec<u8>> = if me == root { (0..n).map(|j| vec![j as u8; 10 + j]).collect() } else { Vec::new() };
        let send: Vec<Region> = ins.iter_mut().map(|v| Region { ptr: v.as_mut_ptr(), len: v.len() }).collect();
        let mut mine = vec![0u8; 10 + me + if me == odd { extra } else { 0 }];
        let mut s = Vec::new();
        // SAFETY: every region is its own Vec, alive and untouched by anything else during the call.
        unsafe { wirespeed_core::testing::leaders_gs::scatter(t, &hosts, 9, &send, Region { ptr: mine.as_mut_ptr(), len: mine.len() }, root, &mut s) }
    });
    (g, s)
}

/// A length the root does not expect (gather) or a rank does not expect (scatter) is a Mismatch
/// naming both ranks, on the root or on that rank, whether the piece crossed leaders of other
/// hosts or not and whether the root or the receiver leads its host; no rank hangs.
#[test]
fn a_gather_or_scatter_length_nobody_expects_is_a_mismatch_naming_both_ranks() {
    // Hosts {0,3,6}, {1,4}, {2,5}: leaders 0, 1, 2.
    let ids = [0, 1, 2, 0, 1, 2, 0];
    // (root, rank with the other length): a non-leader root and a piece from another host's
    // non-leader; a leader root and its own host's rank; a non-leader root and a leader.
    for (root, odd) in [(3, 5), (1, 4), (6, 2), (0, 5)] {
        let (g, s) = gs_mismatch(&ids, root, odd, 3);
        match &g[root] {
            Err(Error::Mismatch(m)) => assert!(m.contains(&format!("gather: rank {odd} sends {} bytes to root {root}, which expects {}", 10 + odd, 13 + odd)), "{m}"),
            other => panic!("gather root {root}: {other:?}"),
        }
        match &s[odd] {
            Err(Error::Mismatch(m)) => assert!(m.contains(&format!("scatter: root {root} sends {} bytes to rank {odd}, which expects {}", 10 + odd, 13 + odd)), "{m}"),
            other => panic!("scatter to rank {odd} from {root}: {other:?}"),
        }
        for (r, x) in g.iter().chain(&s).enumerate() {
            assert!(!matches!(x, Err(Error::Timeout { .. })), "root {root}: rank {} hung: {x:?}", r % ids.len());
        }
        // The other ranks end with their data: only the root (gather) and `odd` (scatter) fail.
        assert!(g.iter().enumerate().all(|(r, x)| r == root || x.is_ok()), "root {root}: gather {g:?}");
        assert!(s.iter().enumerate().all(|(r, x)| r == odd || x.is_ok()), "root {root}: scatter {s:?}");
    }
}
