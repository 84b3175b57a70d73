//! Every algorithm of algo/ on the in-memory simulated network: 1 to 64 ranks in one process,
//! deterministic, over dtypes, ops, zero elements and odd sizes, checked exactly against a
//! reference computed independently in i64/f64; faults (a rank that dies, stalls or sends
//! garbage) end every rank with a typed error; the network model's bandwidth and flow caps show
//! in virtual time.
use wirespeed_core::testing::direct::{self, Region};
use wirespeed_core::testing::{doubling, leaders, ring, tree};
use wirespeed_core::testing::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};
use wirespeed_core::testing::sim::{self, Fault, SimConfig, SimRank};
use wirespeed_core::testing::Transport;
use wirespeed_core::{DType, Error, ReduceOp};

const DTYPES: [DType; 13] = [
    DType::F32, DType::F16, DType::BF16, DType::F64, DType::I8, DType::U8, DType::I16, DType::U16, DType::I32, DType::U32,
    DType::I64, DType::U64, DType::Bool,
];
const OPS: [ReduceOp; 8] = [
    ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max, ReduceOp::Avg, ReduceOp::BAnd, ReduceOp::BOr, ReduceOp::BXor,
];

fn enc(d: DType, v: f64, out: &mut Vec<u8>) {
    match d {
        DType::F32 => out.extend((v as f32).to_le_bytes()),
        DType::F64 => out.extend(v.to_le_bytes()),
        DType::F16 => out.extend(f32_to_f16(v as f32).to_le_bytes()),
        DType::BF16 => out.extend(f32_to_bf16(v as f32).to_le_bytes()),
        DType::I8 => out.extend((v as i8).to_le_bytes()),
        DType::U8 => out.extend((v as u8).to_le_bytes()),
        DType::I32 => out.extend((v as i32).to_le_bytes()),
        DType::I64 => out.extend((v as i64).to_le_bytes()),
        DType::I16 => out.extend((v as i16).to_le_bytes()),
        DType::U16 => out.extend((v as u16).to_le_bytes()),
        DType::U32 => out.extend((v as u32).to_le_bytes()),
        DType::U64 => out.extend((v as u64).to_le_bytes()),
        DType::Bool => out.push((v != 0.0) as u8),
    }
}

fn dec(d: DType, b: &[u8]) -> f64 {
    match d {
        DType::F32 => f32::from_le_bytes(b.try_into().unwrap()) as f64,
        DType::F64 => f64::from_le_bytes(b.try_into().unwrap()),
        DType::F16 => f16_to_f32(u16::from_le_bytes(b.try_into().unwrap())) as f64,
        DType::BF16 => bf16_to_f32(u16::from_le_bytes(b.try_into().unwrap())) as f64,
        DType::I8 => i8::from_le_bytes(b.try_into().unwrap()) as f64,
        DType::U8 => b[0] as f64,
        DType::I32 => i32::from_le_bytes(b.try_into().unwrap()) as f64,
        DType::I64 => i64::from_le_bytes(b.try_into().unwrap()) as f64,
        DType::I16 => i16::from_le_bytes(b.try_into().unwrap()) as f64,
        DType::U16 => u16::from_le_bytes(b.try_into().unwrap()) as f64,
        DType::U32 => u32::from_le_bytes(b.try_into().unwrap()) as f64,
        DType::U64 => u64::from_le_bytes(b.try_into().unwrap()) as f64,
        DType::Bool => b[0] as f64,
    }
}

fn unsigned(d: DType) -> bool {
    matches!(d, DType::U8 | DType::U16 | DType::U32 | DType::U64 | DType::Bool)
}

/// Input element i of rank r: unique enough per (rank, index) that a misrouted or misplaced
/// element changes the result, small enough that every dtype represents every sum exactly.
fn value(d: DType, op: ReduceOp, r: usize, i: usize) -> f64 {
    let h = (r * 31 + i * 17 + (i >> 7) * 5) % 7;
    if d == DType::Bool {
        // Mostly true, so and/min/prod and or/max/sum all see both values.
        return if h == 0 { 0.0 } else { 1.0 };
    }
    if op.is_bitwise() {
        return (r * 13 + i * 7) as f64 % 64.0;
    }
    match op {
        // Products stay exact: factors of +-1, and a 2 at one rank per index for small worlds.
        ReduceOp::Prod => {
            let sign = if unsigned(d) || h % 2 == 0 { 1.0 } else { -1.0 };
            if r == i % 5 { 2.0 * sign } else { sign }
        }
        _ if unsigned(d) => h as f64,
        _ => h as f64 - 3.0,
    }
}

fn input(d: DType, op: ReduceOp, r: usize, n: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(n * d.size());
    for i in 0..n {
        enc(d, value(d, op, r, i), &mut v);
    }
    v
}

fn is_float(d: DType) -> bool {
    matches!(d, DType::F32 | DType::F64 | DType::F16 | DType::BF16)
}

/// The reduction of element i over ranks 0..w, computed in f64 (exact for these inputs).
fn expected(d: DType, op: ReduceOp, w: usize, i: usize) -> f64 {
    let vals: Vec<f64> = (0..w).map(|r| value(d, op, r, i)).collect();
    let ints: Vec<i64> = vals.iter().map(|&v| v as i64).collect();
    if d == DType::Bool {
        let any = ints.iter().any(|&v| v != 0) as i64 as f64;
        let all = ints.iter().all(|&v| v != 0) as i64 as f64;
        return match op {
            ReduceOp::Sum | ReduceOp::Max | ReduceOp::BOr => any,
            ReduceOp::Prod | ReduceOp::Min | ReduceOp::BAnd => all,
            ReduceOp::BXor => (ints.iter().filter(|&&v| v != 0).count() % 2) as f64,
            ReduceOp::Avg => unreachable!("refused by dtype::check"),
        };
    }
    match op {
        ReduceOp::BAnd => return ints.iter().fold(-1i64, |a, &b| a & b) as f64,
        ReduceOp::BOr => return ints.iter().fold(0i64, |a, &b| a | b) as f64,
        ReduceOp::BXor => return ints.iter().fold(0i64, |a, &b| a ^ b) as f64,
        _ => {}
    }
    match op {
        ReduceOp::Sum => vals.iter().sum(),
        ReduceOp::Prod => vals.iter().product(),
        ReduceOp::Min => vals.iter().cloned().fold(f64::INFINITY, f64::min),
        ReduceOp::Max => vals.iter().cloned().fold(f64::NEG_INFINITY, f64::max),
        ReduceOp::Avg => {
            let s: f64 = vals.iter().sum();
            if is_float(d) { s / w as f64 } else { (s / w as f64).trunc() }
        }
        _ => unreachable!("bitwise ops handled above"),
    }
}

fn check(d: DType, op: ReduceOp, w: usize, out: &[u8], what: &str) {
    let es = d.size();
    for (i, b) in out.chunks(es).enumerate() {
        let got = dec(d, b);
        let want = expected(d, op, w, i);
        // avg's division rounds in the dtype: allow its rounding, nothing more.
        let tol = if op == ReduceOp::Avg && is_float(d) {
            want.abs() * match d { DType::F16 => 1e-3, DType::BF16 => 8e-3, DType::F32 => 1e-6, _ => 1e-12 }
        } else {
            0.0
        };
        assert!((got - want).abs() <= tol, "{what}: element {i} is {got}, expected {want} ({} {} on {w} ranks)", d.name(), op.name());
    }
}

fn members(w: usize) -> Vec<usize> {
    (0..w).collect()
}

type AllReduce = fn(&mut SimRank, &[usize], u64, &mut [u8], DType, ReduceOp, usize, &mut Vec<u8>) -> wirespeed_core::Result<()>;

fn run_all_reduce(algo: AllReduce, name: &str, w: usize, d: DType, op: ReduceOp, n: usize) {
    let (res, _) = sim::run(w, SimConfig::default(), &[], |t| {
        let mut buf = input(d, op, t.rank(), n);
        let mut scratch = Vec::new();
        algo(t, &members(w), 7, &mut buf, d, op, w, &mut scratch)?;
        Ok(buf)
    });
    let first = res[0].as_ref().map_err(|e| e.to_string()).unwrap().clone();
    for (r, out) in res.into_iter().enumerate() {
        let out = out.unwrap_or_else(|e| panic!("{name} rank {r} of {w}: {e}"));
        check(d, op, w, &out, &format!("{name} rank {r}"));
        assert_eq!(out, first, "{name}: rank {r}'s bits differ from rank 0's");
    }
}

#[test]
fn ring_and_doubling_all_reduce_every_dtype_and_op() {
    for w in [1, 2, 3, 4, 5, 8] {
        for d in DTYPES {
            for op in OPS {
                if wirespeed_core::check_reduction(d, op).is_err() {
                    continue;
                }
                for n in [0, 1, 37] {
                    run_all_reduce(ring::all_reduce::<SimRank>, "ring", w, d, op, n);
                    run_all_reduce(doubling::all_reduce::<SimRank>, "doubling", w, d, op, n);
                }
            }
        }
    }
}

#[test]
fn all_reduce_at_odd_and_large_worlds_and_multi_slice_sizes() {
    for w in [6, 7, 12, 13, 16, 31, 33, 64] {
        run_all_reduce(ring::all_reduce::<SimRank>, "ring", w, DType::I32, ReduceOp::Sum, 1001);
        run_all_reduce(doubling::all_reduce::<SimRank>, "doubling", w, DType::F32, ReduceOp::Max, 1001);
    }
    // More than one pipelined slice (1 MiB pieces), the last one short.
    run_all_reduce(ring::all_reduce::<SimRank>, "ring", 3, DType::F32, ReduceOp::Sum, 700_001);
    run_all_reduce(ring::all_reduce::<SimRank>, "ring", 5, DType::BF16, ReduceOp::Avg, 1_300_007);
}

#[test]
fn tree_broadcast_and_reduce_from_every_root() {
    for w in [1, 2, 3, 5, 8, 11] {
        for root in 0..w {
            let (res, _) = sim::run(w, SimConfig::default(), &[], |t| {
                let me = t.rank();
                let mut b: Vec<u8> = if me == root { (0..1000).map(|i| (i * 7 + root) as u8).collect() } else { vec![0xEE; 1000] };
                tree::broadcast(t, &members(w), 3, &mut b, root)?;
                let mut x = input(DType::I64, ReduceOp::Sum, me, 333);
                let orig = x.clone();
                let mut s = Vec::new();
                tree::reduce(t, &members(w), 4, &mut x, DType::I64, ReduceOp::Sum, root, w, &mut s)?;
                Ok((b, x, orig))
            });
            for (r, x) in res.into_iter().enumerate() {
                let (b, x, orig) = x.unwrap();
                assert!(b.iter().enumerate().all(|(i, &v)| v == (i * 7 + root) as u8), "broadcast w {w} root {root} rank {r}");
                if r == root {
                    check(DType::I64, ReduceOp::Sum, w, &x, &format!("reduce w {w} root {root}"));
                } else {
                    assert_eq!(x, orig, "reduce must leave non-root inputs untouched");
                }
            }
        }
    }
    // Members in another order than ranks, e.g. host leaders.
    let (res, _) = sim::run(6, SimConfig::default(), &[], |t| {
        let mem = [4, 1, 5, 0];
        if !mem.contains(&t.rank()) {
            return Ok(vec![]);
        }
        let mut b = if t.rank() == 5 { vec![9u8; 10] } else { vec![0u8; 10] };
        tree::broadcast(t, &mem, 1, &mut b, 5)?;
        Ok(b)
    });
    for r in [4, 1, 5, 0] {
        assert_eq!(res[r].as_ref().unwrap(), &vec![9u8; 10]);
    }
}

#[test]
fn direct_exchanges_reduce_scatter_and_barrier() {
    for w in [1, 2, 3, 4, 7, 16] {
        let (res, _) = sim::run(w, SimConfig::default(), &[], |t| {
            let me = t.rank();
            let m = members(w);
            // all_to_all with a different size for every pair, including empty ones.
            let sz = |from: usize, to: usize| (from * 3 + to * 5) % 11;
            let mut send: Vec<Vec<u8>> = (0..w).map(|j| (0..sz(me, j)).map(|i| (me * 16 + j + i) as u8).collect()).collect();
            let mut recv: Vec<Vec<u8>> = (0..w).map(|j| vec![0u8; sz(j, me)]).collect();
            let sr: Vec<Option<Region>> = send.iter_mut().map(|v| Some(Region { ptr: v.as_mut_ptr(), len: v.len() })).collect();
            let rr: Vec<Option<Region>> = recv.iter_mut().map(|v| Some(Region { ptr: v.as_mut_ptr(), len: v.len() })).collect();
            // SAFETY: `send` and `recv` outlive the call, one vector per rank, none overlapping;
            // a failure returns the error, and the simulator then cuts this rank off.
            unsafe { direct::exchange(t, &m, 5, &sr, &rr)? };
            // reduce_scatter of 100 elements per rank, avg over i32.
            let mut chunks: Vec<Vec<u8>> = (0..w).map(|j| input(DType::I32, ReduceOp::Avg, me, 100 * (j + 1))[100 * j * 4..].to_vec()).collect();
            let regions: Vec<Region> = chunks.iter_mut().map(|c| Region { ptr: c.as_mut_ptr(), len: c.len() }).collect();
            let mut out = vec![0u8; 400];
            let mut s = Vec::new();
            // SAFETY: every chunk (100 i32s) and `out` (400 bytes) outlive the call and do not
            // overlap; a failure returns the error, and the simulator then cuts this rank off.
            unsafe { direct::reduce_scatter(t, &m, 6, &regions, out.as_mut_ptr(), 100, DType::I32, ReduceOp::Avg, w, &mut s)? };
            direct::barrier(t, &m, 8)?;
            Ok((recv, out))
        });
        for (r, x) in res.into_iter().enumerate() {
            let (recv, out) = x.unwrap_or_else(|e| panic!("world {w} rank {r}: {e}"));
            for (j, v) in recv.iter().enumerate() {
                let want: Vec<u8> = (0..(j * 3 + r * 5) % 11).map(|i| (j * 16 + r + i) as u8).collect();
                assert_eq!(v, &want, "all_to_all {j} -> {r} of {w}");
            }
            for (i, b) in out.chunks(4).enumerate() {
                let gi = 100 * r + i;
                let want = expected(DType::I32, ReduceOp::Avg, w, gi);
                assert_eq!(dec(DType::I32, b), want, "reduce_scatter rank {r} element {i} of {w}");
            }
        }
    }
}

#[test]
fn the_simulation_is_deterministic() {
    let go = || {
        sim::run(13, SimConfig::default(), &[], |t| {
            let mut b = input(DType::F32, ReduceOp::Sum, t.rank(), 50_000);
            ring::all_reduce(t, &members(13), 1, &mut b, DType::F32, ReduceOp::Sum, 13, &mut Vec::new())?;
            Ok((b, t.now_us()))
        })
    };
    let (a, ra) = go();
    let (b, rb) = go();
    assert_eq!(ra.elapsed_us, rb.elapsed_us);
    assert_eq!(ra.messages, rb.messages);
    for (x, y) in a.into_iter().zip(b) {
        assert_eq!(x.unwrap(), y.unwrap());
    }
}

#[test]
fn virtual_time_follows_bandwidth_latency_and_flow_caps() {
    let s = 8 << 20; // bytes per rank
    let time = |cfg: SimConfig| {
        let (res, rep) = sim::run(4, cfg, &[], |t| {
            let mut b = vec![1u8; s];
            ring::all_reduce(t, &members(4), 1, &mut b, DType::U8, ReduceOp::Max, 4, &mut Vec::new())
        });
        res.into_iter().for_each(|r| r.unwrap());
        rep
    };
    let base = time(SimConfig { latency_us: 1.0, bandwidth: 1000.0, flow_cap: None, timeout_us: 1e9, connect_us: 0.0 });
    // The ring moves 2(k-1)/k of the buffer over every link: 12 MiB at 1000 B/us ~ 12.6 ms.
    let ideal = 2.0 * 3.0 / 4.0 * s as f64 / 1000.0;
    assert!(base.elapsed_us >= ideal && base.elapsed_us < ideal * 1.3, "{} us vs ideal {ideal}", base.elapsed_us);
    assert_eq!(base.bytes as f64, 2.0 * 3.0 / 4.0 * s as f64 * 4.0);
    let capped = time(SimConfig { latency_us: 1.0, bandwidth: 1000.0, flow_cap: Some(250.0), timeout_us: 1e9, connect_us: 0.0 });
    assert!(capped.elapsed_us > 3.5 * base.elapsed_us, "a 1/4 flow cap: {} vs {}", capped.elapsed_us, base.elapsed_us);
}

fn typed_peer_error(e: &Error) -> bool {
    matches!(e, Error::PeerDied { .. } | Error::PeerAborted { .. } | Error::Timeout { .. } | Error::Mismatch(_))
}

#[test]
fn a_rank_that_dies_mid_collective_fails_every_rank_promptly() {
    for (w, at) in [(2, 3), (5, 7), (8, 20), (16, 2)] {
        let cfg = SimConfig { timeout_us: 5e6, ..SimConfig::default() };
        let victim = w / 2;
        let (res, rep) = sim::run(w, cfg, &[Fault::Die { rank: victim, at_post: at }], |t| {
            let mut b = input(DType::F32, ReduceOp::Sum, t.rank(), 200_000);
            ring::all_reduce(t, &members(w), 1, &mut b, DType::F32, ReduceOp::Sum, w, &mut Vec::new())?;
            doubling::all_reduce(t, &members(w), 2, &mut b, DType::F32, ReduceOp::Sum, w, &mut Vec::new())
        });
        for (r, x) in res.iter().enumerate() {
            let e = x.as_ref().expect_err("no rank may complete once a peer died");
            if r != victim {
                assert!(typed_peer_error(e), "world {w} rank {r}: {e:?}");
            }
        }
        // Death is noticed at once, not after the timeout.
        assert!(rep.elapsed_us < cfg.timeout_us, "world {w}: {} us", rep.elapsed_us);
    }
}

#[test]
fn a_stalled_rank_makes_every_other_rank_time_out_within_the_timeout() {
    let cfg = SimConfig { timeout_us: 2e6, ..SimConfig::default() };
    let (res, rep) = sim::run(6, cfg, &[Fault::Stall { rank: 4, at_post: 5 }], |t| {
        let mut b = input(DType::I64, ReduceOp::Sum, t.rank(), 10_000);
        ring::all_reduce(t, &members(6), 1, &mut b, DType::I64, ReduceOp::Sum, 6, &mut Vec::new())
    });
    for (r, x) in res.iter().enumerate() {
        let e = x.as_ref().expect_err("nobody completes");
        if r != 4 {
            assert!(matches!(e, Error::Timeout { .. } | Error::PeerAborted { .. }), "rank {r}: {e:?}");
        }
    }
    assert!(rep.elapsed_us <= 2.0 * cfg.timeout_us, "{} us", rep.elapsed_us);
}

#[test]
fn garbage_from_a_peer_is_refused_and_never_mixed_into_a_result() {
    let (res, _) = sim::run(4, SimConfig::default(), &[Fault::Garbage { rank: 1, at_send: 0 }], |t| {
        let mut b = input(DType::I32, ReduceOp::Sum, t.rank(), 64);
        let before = b.clone();
        let r = doubling::all_reduce(t, &members(4), 1, &mut b, DType::I32, ReduceOp::Sum, 4, &mut Vec::new());
        Ok((r, b, before))
    });
    let mut refused = 0;
    assert!(res.iter().any(|x| x.as_ref().unwrap().0.is_err()), "the garbage cannot go unnoticed");
    for x in res {
        let (r, b, before) = x.unwrap();
        match r {
            Err(Error::Mismatch(_)) => {
                refused += 1;
                assert_eq!(b, before, "a refused message must not touch the buffer");
            }
            Err(e) => assert!(typed_peer_error(&e), "{e:?}"),
            // A rank whose part of the exchange never met the garbage may finish: exactly right.
            Ok(()) => check(DType::I32, ReduceOp::Sum, 4, &b, "a rank that completed"),
        }
    }
    assert!(refused >= 1, "the garbage is refused");
}

/// Ring all_gather and reduce_scatter over `order` (members listed as a ring, not by rank):
/// `count` elements per chunk, out of place or in place (own piece in the output / `out` on the
/// own contribution), checked exactly per element against the reference.
fn run_ring_gathers(order: &[usize], d: DType, op: ReduceOp, count: usize, in_place: bool) {
    let w = order.len();
    let es = d.size();
    let (res, _) = sim::run(w, SimConfig::default(), &[], |t| {
        let me = t.rank();
        let p = order.iter().position(|&r| r == me).unwrap();
        // all_gather: rank r's piece is elements [r·count, (r+1)·count) of rank 0's reference input.
        let piece = |r: usize| input(d, op, 0, w * count)[r * count * es..(r + 1) * count * es].to_vec();
        let mut own = piece(me);
        let mut gathered: Vec<Vec<u8>> = (0..w).map(|_| vec![0u8; count * es]).collect();
        let mut recv: Vec<Region> = order.iter().map(|&r| Region { ptr: gathered[r].as_mut_ptr(), len: count * es }).collect();
        let send = if in_place {
            gathered[me].copy_from_slice(&own);
            recv[p]
        } else {
            Region { ptr: own.as_mut_ptr(), len: own.len() }
        };
        // SAFETY: `own` and every `gathered` vector outlive the call and are distinct (the own
        // output is `send` itself in place); a failure returns, and the simulator cuts us off.
        unsafe { ring::all_gather(t, order, 3, send, &recv)? };
        recv.clear();
        // reduce_scatter: this rank's contribution to rank q is its input's chunk q.
        let full = input(d, op, me, w * count);
        let mut chunks: Vec<Vec<u8>> = (0..w).map(|q| full[q * count * es..(q + 1) * count * es].to_vec()).collect();
        let mut out = vec![0u8; count * es];
        let regions: Vec<Region> = order.iter().map(|&r| Region { ptr: chunks[r].as_mut_ptr(), len: count * es }).collect();
        let dst = if in_place { chunks[me].as_mut_ptr() } else { out.as_mut_ptr() };
        let mut s = Vec::new();
        // SAFETY: every chunk and `out` outlive the call, distinct, `dst` being our own chunk
        // (the contribution at p) in place; a failure returns, and the simulator cuts us off.
        unsafe { ring::reduce_scatter(t, order, 4, &regions, dst, count, d, op, w, &mut s)? };
        if in_place {
            out = chunks[me].clone();
        }
        Ok((gathered, out))
    });
    for (r, x) in res.into_iter().enumerate() {
        let (gathered, out) = x.unwrap_or_else(|e| panic!("ring order {order:?} rank {r}: {e}"));
        let all = input(d, op, 0, w * count);
        for (q, g) in gathered.iter().enumerate() {
            assert!(g[..] == all[q * count * es..(q + 1) * count * es], "ring all_gather order {order:?} rank {r}: piece {q} wrong");
        }
        for (i, b) in out.chunks(es).enumerate() {
            let want = expected(d, op, w, r * count + i);
            let got = dec(d, b);
            let tol = if op == ReduceOp::Avg && is_float(d) { want.abs() * 8e-3 } else { 0.0 };
            assert!((got - want).abs() <= tol, "ring reduce_scatter order {order:?} rank {r} element {i}: {got}, expected {want} ({} {})", d.name(), op.name());
        }
    }
}

#[test]
fn ring_all_gather_and_reduce_scatter() {
    // Members in rank order and in the order hosts/ builds (hosts of two ranks, every other
    // host backwards); every dtype and op on a few worlds; empty and one-element chunks.
    for order in [vec![0], vec![0, 1], vec![0, 1, 2], vec![0, 3, 1, 2], vec![0, 4, 5, 1, 2, 6, 7, 3], (0..7).collect::<Vec<_>>()] {
        for &d in &[DType::F32, DType::BF16, DType::I32, DType::U8] {
            for &op in &OPS {
                if wirespeed_core::check_reduction(d, op).is_err() {
                    continue;
                }
                run_ring_gathers(&order, d, op, 37, false);
            }
        }
        for count in [0, 1, 1000] {
            run_ring_gathers(&order, DType::I64, ReduceOp::Sum, count, true);
        }
    }
    // Chunks of several pieces (PIECE is 1 MiB): the pipeline, in place and out of place.
    run_ring_gathers(&[0, 2, 1], DType::F32, ReduceOp::Sum, 700_001, false);
    run_ring_gathers(&[0, 3, 1, 2], DType::I32, ReduceOp::Avg, 600_003, true);
    run_ring_gathers(&[0, 1, 2, 3, 4], DType::BF16, ReduceOp::Max, 1_300_007, false);
}

/// Ranks dealt over `n` hosts: `cyclic` round robin (rank order interleaves hosts), else in
/// blocks; `sizes[g]` ranks on host g.
fn layout(sizes: &[usize], cyclic: bool) -> Vec<Vec<usize>> {
    let mut hosts: Vec<Vec<usize>> = vec![Vec::new(); sizes.len()];
    let mut r = 0;
    if cyclic {
        let most = sizes.iter().copied().max().unwrap_or(0);
        for l in 0..most {
            for (g, &s) in sizes.iter().enumerate() {
                if l < s {
                    hosts[g].push(r);
                    r += 1;
                }
            }
        }
    } else {
        for (g, &s) in sizes.iter().enumerate() {
            hosts[g].extend(r..r + s);
            r += s;
        }
    }
    hosts
}

/// The leaders' all_gather (pieces of different lengths, some empty), reduce_scatter, barrier
/// and reduce (from every root) over `hosts`, out of place or in place, each checked exactly per
/// element against the reference.
fn run_leaders(hosts: &[Vec<usize>], d: DType, op: ReduceOp, count: usize, in_place: bool) {
    let w: usize = hosts.iter().map(Vec::len).sum();
    let es = d.size();
    let hs = hosts.to_vec();
    // all_gather piece of rank r: (r·5 + count) mod 7 bytes per... element, so some are empty.
    let glen = move |r: usize| ((r * 5 + count) % 7) * es;
    let gpiece = |r: usize| -> Vec<u8> { (0..glen(r)).map(|i| (r * 37 + i * 11 + 1) as u8).collect() };
    let (res, _) = sim::run(w, SimConfig::default(), &[], |t| {
        let me = t.rank();
        let mut own = gpiece(me);
        let mut gathered: Vec<Vec<u8>> = (0..w).map(|r| vec![0xEEu8; glen(r)]).collect();
        let recv: Vec<Region> = gathered.iter_mut().map(|g| Region { ptr: g.as_mut_ptr(), len: g.len() }).collect();
        let send = if in_place {
            gathered[me].copy_from_slice(&own);
            recv[me]
        } else {
            Region { ptr: own.as_mut_ptr(), len: own.len() }
        };
        let mut s = Vec::new();
        // SAFETY: `own` and every `gathered` vector outlive the call and are distinct (the own
        // output is `send` itself in place); a failure returns, and the simulator cuts us off.
        unsafe { leaders::all_gather(t, &hs, 3, send, &recv, &mut s)? };
        let full = input(d, op, me, w * count);
        let mut chunks: Vec<Vec<u8>> = (0..w).map(|q| full[q * count * es..(q + 1) * count * es].to_vec()).collect();
        let regions: Vec<Region> = chunks.iter_mut().map(|c| Region { ptr: c.as_mut_ptr(), len: c.len() }).collect();
        let mut out = vec![0u8; count * es];
        let dst = if in_place { regions[me].ptr } else { out.as_mut_ptr() };
        // SAFETY: every chunk and `out` outlive the call, distinct, `dst` being our own chunk in
        // place; a failure returns, and the simulator cuts us off.
        unsafe { leaders::reduce_scatter(t, &hs, 4, &regions, dst, count, d, op, w, &mut s)? };
        if in_place {
            out = chunks[me].clone();
        }
        leaders::barrier(t, &hs, 5)?;
        let mut reduced = Vec::new();
        for root in 0..w {
            let mut b = input(d, op, me, count + root);
            leaders::reduce(t, &hs, 6 + root as u64, &mut b, d, op, root, w, &mut s)?;
            if me != root {
                assert!(b == input(d, op, me, count + root), "reduce changed rank {me}'s input (root {root})");
            }
            reduced.push(b);
        }
        Ok((gathered, out, reduced))
    });
    let what = format!("{hosts:?} {} {} count {count} in_place {in_place}", d.name(), op.name());
    for (r, x) in res.into_iter().enumerate() {
        let (gathered, out, reduced) = x.unwrap_or_else(|e| panic!("{what}: rank {r}: {e}"));
        for (q, g) in gathered.iter().enumerate() {
            assert!(*g == gpiece(q), "{what}: all_gather on rank {r}: piece {q} wrong");
        }
        for (i, b) in out.chunks(es).enumerate() {
            let want = expected(d, op, w, r * count + i);
            let got = dec(d, b);
            let tol = if op == ReduceOp::Avg && is_float(d) { want.abs() * 8e-3 } else { 0.0 };
            assert!((got - want).abs() <= tol, "{what}: reduce_scatter rank {r} element {i}: {got}, expected {want}");
        }
        check(d, op, w, &reduced[r], &format!("{what}: reduce to root {r}"));
    }
}

#[test]
fn leaders_collectives_over_even_uneven_and_cyclic_layouts() {
    // One host (the degenerate case), one rank per host at 2..9 hosts (every Bruck round shape:
    // powers of two and not), uneven hosts in blocks and dealt round robin.
    let mut layouts: Vec<Vec<Vec<usize>>> = vec![layout(&[3], false)];
    for n in 2..=9 {
        layouts.push(layout(&vec![1; n], false));
    }
    for sizes in [&[3, 1, 2][..], &[2, 2, 2], &[1, 3], &[2, 1, 1, 3, 2], &[4, 4, 4, 4, 4, 4, 4]] {
        layouts.push(layout(sizes, false));
        layouts.push(layout(sizes, true));
    }
    for hosts in &layouts {
        for count in [0, 1, 37] {
            run_leaders(hosts, DType::I64, ReduceOp::Sum, count, false);
            run_leaders(hosts, DType::I32, ReduceOp::Avg, count, true);
        }
    }
    // Every dtype and op on an uneven and a cyclic layout.
    for hosts in [layout(&[3, 1, 2], false), layout(&[2, 1, 3, 1, 2], true)] {
        for d in DTYPES {
            for op in OPS {
                if wirespeed_core::check_reduction(d, op).is_err() {
                    continue;
                }
                run_leaders(&hosts, d, op, 13, false);
            }
        }
    }
}
