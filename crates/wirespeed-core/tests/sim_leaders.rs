//! The leaders' all_to_all (algo/leaders_a2a.rs) on the simulated network: every byte checked
//! over layouts that are uneven (hosts of 3, 1 and 2 ranks), cyclic (rank order interleaving
//! hosts), of a number of hosts that is not a power of two, one host, one rank per host; piece
//! lengths drawn per pair (zeros among them), in place and not; and a length a receiver does not
//! expect is a Mismatch naming both ranks on that receiver, every other rank ending (no hang).
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

#[test]
fn leaders_all_to_all_is_exact_on_every_layout() {
    let layouts: Vec<Vec<usize>> = vec![
        vec![0, 0, 0, 1, 2, 2],                   // uneven: 3, 1, 2
        vec![0, 1, 2, 0, 2, 0],                   // uneven and cyclic
        vec![0, 1, 2, 3, 4, 0, 1, 2, 3, 4],       // cyclic, 5 hosts
        vec![0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6], // 7 hosts of 2
        vec![0, 1, 2],                            // one rank per host
        vec![0, 0, 0, 0],                         // one host
        vec![0, 1],
        vec![0, 0, 1, 1, 1, 1, 2, 3, 3, 4, 5, 5, 6, 7, 7, 7, 8], // 9 hosts, 1 to 4 ranks
        vec![3, 2, 1, 0, 3, 2, 1, 0, 1, 1],       // cyclic, uneven, ids not in order
    ];
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
