//! Where a one-host collective's time goes, piece by piece, without Python: the building blocks
//! (a copy, a reduction, a process_vm_readv, a sync point between two ranks) and each collective
//! through `Comm` directly and through the engine (`Engine::run`, the blocking path the bindings
//! use). Ranks are threads of one process. docs/small-messages.md reads its output.
//!     cargo run --release --example shm_costs -- [ranks] [sizes in bytes, comma separated]
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};
use wirespeed_core::{testing::copy, testing::reduce_many, testing::sys, Collectives, testing::Comm, Config, DType, Engine, Op, ReduceOp};

/// Best per-op time of 5 loops of `iters` calls.
fn best(iters: usize, mut f: impl FnMut()) -> f64 {
    for _ in 0..iters.min(100) {
        f();
    }
    (0..5)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..iters {
                f();
            }
            t.elapsed().as_secs_f64() / iters as f64
        })
        .fold(f64::INFINITY, f64::min)
}

fn iters_for(bytes: usize) -> usize {
    (20_000_000 / (bytes + 4096)).clamp(20, 20_000)
}

fn us(s: f64) -> String {
    format!("{:8.2} us", s * 1e6)
}

fn building_blocks(sizes: &[usize]) {
    println!("# building blocks, one thread, data in cache (best of 5 loops)");
    for &b in sizes {
        let src = vec![1u8; b];
        let mut dst = vec![0u8; b];
        let other = vec![2u8; b];
        let it = iters_for(b);
        // SAFETY: `dst` and `src` are distinct vectors of `b` bytes.
        let copy = best(it, || unsafe { copy::copy(dst.as_mut_ptr(), src.as_ptr(), b) });
        // SAFETY: `dst`, `src` and `other` are distinct vectors of `b` bytes, read as b / 4 f32s
        // (Vec<u8> memory comes from malloc: 16-byte aligned in practice, not by Rust's rules).
        let red = best(it, || unsafe {
            reduce_many(dst.as_mut_ptr(), &[src.as_ptr(), other.as_ptr()], b / 4, DType::F32, ReduceOp::Sum, 2)
        });
        let pid = sys::getpid();
        // SAFETY: `dst` has `b` writable bytes that nothing else touches (the source is this
        // process's own `src`).
        let cma = best(it, || unsafe { sys::read_peer(pid, src.as_ptr() as u64, dst.as_mut_ptr(), b).unwrap() });
        println!(
            "{:>8} B: copy {} ({:5.1} GB/s)  reduce 2 srcs f32 {} ({:5.1} GB/s)  process_vm_readv {} ({:5.1} GB/s)",
            b, us(copy), b as f64 / copy / 1e9, us(red), b as f64 / red / 1e9, us(cma), b as f64 / cma / 1e9
        );
        // The destination 8 bytes past the source modulo 4096: glibc's memcpy against kernels::copy.
        let mut area = vec![0u8; 2 * b + 4 * 4096];
        let s_at = area.as_ptr().align_offset(4096);
        let d_at = s_at + b.next_multiple_of(4096) + 4096 + 8;
        let (sp, dp) = (area[s_at..].as_ptr(), area[d_at..].as_mut_ptr());
        // SAFETY: both ranges hold b bytes inside `area` and do not overlap (d_at >= s_at + b).
        let glibc = best(it, || unsafe { std::ptr::copy_nonoverlapping(sp, dp, b) });
        // SAFETY: as above.
        let ours = best(it, || unsafe { copy::copy(dp, sp, b) });
        println!("{:>8} B: copy to 8 B past the source mod 4096: memcpy {}  kernels::copy {}", b, us(glibc), us(ours));
    }
}

/// Run `f(rank, comm)` on `world` connected ranks (threads); the slowest rank's result per op.
fn on_ranks(world: usize, cfg: &Config, f: impl Fn(Comm) -> Vec<(String, f64)> + Send + Sync + 'static) -> Vec<(String, f64)> {
    let all = wirespeed_core::testing::one_host(world, Duration::from_secs(60), cfg, f);
    all[0].iter().enumerate().map(|(i, (name, _))| (name.clone(), all.iter().map(|v| v[i].1).fold(0.0, f64::max))).collect()
}

fn collectives(world: usize, sizes: Vec<usize>, cfg: &Config) {
    println!("# {world} rank(s) as threads: time per op, back-to-back loop, slowest rank");
    let gate = Arc::new(Barrier::new(world));
    let wake_worker = cfg.wake_worker;
    let rows = on_ranks(world, cfg, move |mut c| {
        let mut out = vec![];
        let w = c.world;
        out.push(("barrier".to_string(), best(5000, || c.barrier().unwrap())));
        for &b in &sizes {
            let n = b / 4;
            let mut v = vec![0f32; n];
            let mut g = vec![0f32; n];
            let per = n / w * 4;
            let it = iters_for(b);
            let p = v.as_mut_ptr() as usize;
            let q = g.as_mut_ptr() as usize;
            gate.wait();
            // SAFETY: `p` is `v`'s n f32s, alive for this closure and touched only by these calls.
            out.push((format!("all_reduce {b}"), best(it, || unsafe { c.all_reduce(p, n, DType::F32, ReduceOp::Sum).unwrap() })));
            let recv: Vec<(usize, usize)> = (0..w).map(|r| (q + r * per, per)).collect();
            // SAFETY: `v` (the first `per` bytes, read) and `g` (w disjoint runs of `per`, written)
            // outlive the calls.
            out.push((format!("all_gather {b}"), best(it, || unsafe { c.all_gather((p, per), &recv).unwrap() })));
            let send: Vec<(usize, usize)> = (0..w).map(|r| (p + r * per, per)).collect();
            // SAFETY: `send` cuts `v` into w runs of `per` bytes; the output `q` is `g`, disjoint
            // from `v`; both outlive the calls.
            out.push((format!("reduce_scatter {b}"), best(it, || unsafe { c.reduce_scatter(&send, q, per / 4, DType::F32, ReduceOp::Sum).unwrap() })));
            // SAFETY: `p` is `v`'s n * 4 bytes, alive for this closure.
            out.push((format!("broadcast {b}"), best(it, || unsafe { c.broadcast((p, n * 4), 0).unwrap() })));
        }
        // The same all_reduce through the engine's blocking path (what the bindings call).
        let e = Engine::with(Box::new(c), wake_worker).unwrap();
        for &b in &sizes {
            let n = b / 4;
            let mut v = vec![0f32; n];
            let p = v.as_mut_ptr() as usize;
            gate.wait();
            out.push((
                format!("engine all_reduce {b}"),
                best(iters_for(b), || {
                    // SAFETY: `run` returns Ok only once the op is complete, so `v` (dropped at the
                    // end of this loop's turn) outlives every op on it and the empty owner is
                    // enough (`run`'s owner contract). A failure panics in the unwrap; no peer
                    // writes into a one-host all_reduce's buffer, so nothing late touches `v`.
                    unsafe { e.run(Op::AllReduce { buf: p, count: n, dtype: DType::F32, op: ReduceOp::Sum }, Box::new(())).unwrap() };
                }),
            ));
        }
        out
    });
    for (name, t) in rows {
        println!("{name:>28}: {}", us(t));
    }
}

fn main() {
    let a: Vec<String> = std::env::args().skip(1).collect();
    let world: usize = a.first().map(|s| s.parse().expect("ranks: an integer")).unwrap_or(2);
    let sizes: Vec<usize> = a
        .get(1)
        .map(|s| s.split(',').map(|x| x.parse().expect("sizes: integers")).collect())
        .unwrap_or_else(|| vec![4096, 65536, 262144, 1 << 20]);
    // The WIRESPEED_* knobs (WIRESPEED_ALGO, WIRESPEED_SPIN_US, ...) apply as in a real run.
    let cfg = Config::from_env().unwrap();
    building_blocks(&sizes);
    collectives(1, sizes.clone(), &cfg);
    if world > 1 {
        collectives(world, sizes, &cfg);
    }
}
