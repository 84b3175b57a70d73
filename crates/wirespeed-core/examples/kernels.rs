//! Throughput of the reduction kernel and of the copy routines on this machine.
//!     cargo run --release --example kernels
use std::time::Instant;
use wirespeed_core::{testing::copy, testing::reduce_many, testing::sys, DType, ReduceOp};

fn main() {
    let n = 8 << 20; // floats (32 MiB)
    let a = vec![1.0f32; n];
    let mut b = vec![2.0f32; n];
    let mut c = vec![0.0f32; n];
    for dt in [DType::F32, DType::BF16] {
        let cnt = n * 4 / dt.size();
        let t = Instant::now();
        for _ in 0..5 {
            // SAFETY: `a` and `b` hold 32 MiB each, `cnt` elements of `dt` (f32 or bf16), aligned
            // for either; the destination `b` is a source at the same offset, as reduce_many
            // allows.
            unsafe { reduce_many(b.as_mut_ptr() as *mut u8, &[a.as_ptr() as *const u8, b.as_ptr() as *const u8], cnt, dt, ReduceOp::Sum, 2) };
        }
        let s = t.elapsed().as_secs_f64() / 5.0;
        println!("reduce {:?} 2 srcs over 32 MiB: {:.2} GB/s (of output)", dt, (n * 4) as f64 / s / 1e9);
    }
    // In-cache blocks, as the large-message path uses them.
    let blk = 16 << 10;
    let t = Instant::now();
    for _ in 0..5 {
        for off in (0..n).step_by(blk) {
            // SAFETY: off + blk <= n, so each pointer covers `blk` f32s inside `a` or `b`; the
            // destination is `b`'s block, a source at the same offset.
            unsafe {
                reduce_many(b.as_mut_ptr().add(off) as *mut u8, &[a.as_ptr().add(off) as *const u8, b.as_ptr().add(off) as *const u8], blk, DType::F32, ReduceOp::Sum, 2)
            };
        }
    }
    println!("reduce f32 in 64 KiB blocks: {:.2} GB/s", (n * 4) as f64 / (t.elapsed().as_secs_f64() / 5.0) / 1e9);
    let t = Instant::now();
    for _ in 0..5 {
        // SAFETY: `a` and `c` are distinct vectors of `n` f32s.
        unsafe { std::ptr::copy_nonoverlapping(a.as_ptr(), c.as_mut_ptr(), n) };
    }
    println!("memcpy 32 MiB: {:.2} GB/s", (n * 4) as f64 / (t.elapsed().as_secs_f64() / 5.0) / 1e9);
    let t = Instant::now();
    for _ in 0..5 {
        // SAFETY: `c` and `a` are distinct vectors of n * 4 bytes.
        unsafe { copy::copy(c.as_mut_ptr() as *mut u8, a.as_ptr() as *const u8, n * 4) };
    }
    println!("nt copy 32 MiB: {:.2} GB/s", (n * 4) as f64 / (t.elapsed().as_secs_f64() / 5.0) / 1e9);
    let pid = sys::getpid();
    let t = Instant::now();
    for _ in 0..5 {
        // SAFETY: `c` has n * 4 writable bytes that nothing else touches (the source is this
        // process's own `a`).
        unsafe { sys::read_peer(pid, a.as_ptr() as u64, c.as_mut_ptr() as *mut u8, n * 4) }.unwrap();
    }
    println!("process_vm_readv 32 MiB (self): {:.2} GB/s", (n * 4) as f64 / (t.elapsed().as_secs_f64() / 5.0) / 1e9);
    let t = Instant::now();
    for _ in 0..5 {
        for off in (0..n).step_by(blk) {
            // SAFETY: as above, for block `off` of `c` (off + blk <= n).
            unsafe { sys::read_peer(pid, a.as_ptr() as u64 + off as u64 * 4, c.as_mut_ptr().add(off) as *mut u8, blk * 4) }.unwrap();
        }
    }
    println!("process_vm_readv in 64 KiB calls: {:.2} GB/s", (n * 4) as f64 / (t.elapsed().as_secs_f64() / 5.0) / 1e9);
}
