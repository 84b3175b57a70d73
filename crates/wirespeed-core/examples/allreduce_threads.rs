//! Quick look at the core's all_reduce speed without Python: ranks are threads of one process.
//!     cargo run --release --example allreduce_threads -- <ranks> <bytes> <iters>
use std::time::{Duration, Instant};
use wirespeed_core::{Collectives, testing::Comm, Config, DType, ReduceOp};

fn main() {
    let a: Vec<usize> = std::env::args().skip(1).map(|s| s.parse().expect("integer arguments")).collect();
    let (world, bytes, iters) = (a.first().copied().unwrap_or(2), a.get(1).copied().unwrap_or(64 << 20), a.get(2).copied().unwrap_or(10));
    let token = wirespeed_core::random_token().unwrap();
    // The WIRESPEED_* knobs (WIRESPEED_ALGO, ...) apply as in a real run.
    let cfg = Config::from_env().unwrap();
    let comms: Vec<Comm> = (0..world).map(|r| Comm::new(r, world, token, Duration::from_secs(60), &cfg).unwrap()).collect();
    let infos: Vec<_> = comms.iter().map(|c| c.info()).collect();
    let hs: Vec<_> = comms
        .into_iter()
        .map(|mut c| {
            let infos = infos.clone();
            std::thread::spawn(move || {
                c.connect(&infos).unwrap();
                let n = bytes / 4;
                let mut v = vec![1.0f32; n];
                // SAFETY: `v` holds `n` f32s, this thread's own, and outlives the call.
                unsafe { c.all_reduce(v.as_mut_ptr() as usize, n, DType::F32, ReduceOp::Sum) }.unwrap();
                let mut times = vec![];
                for _ in 0..iters {
                    c.barrier().unwrap();
                    let t = Instant::now();
                    // SAFETY: as above.
                    unsafe { c.all_reduce(v.as_mut_ptr() as usize, n, DType::F32, ReduceOp::Sum) }.unwrap();
                    times.push(t.elapsed().as_secs_f64());
                }
                times.sort_by(|a, b| a.partial_cmp(b).unwrap());
                times[times.len() / 2]
            })
        })
        .collect();
    let t = hs.into_iter().map(|h| h.join().unwrap()).fold(0.0, f64::max);
    let busbw = bytes as f64 / t * 2.0 * (world as f64 - 1.0) / world as f64 / 1e9;
    println!("{world} ranks {bytes} B: {:.1} us, busbw {busbw:.2} GB/s", t * 1e6);
}
