//! Copy kernels: `copy`, the memcpy the shared-memory collectives use (non-temporal stores for
//! big copies, a vector loop where glibc's `rep movsb` is slow).

/// memcpy that bypasses the cache for big copies: glibc keeps cached stores up to a huge threshold
/// here, which halves throughput once two cores stream at once (measured: 24 vs 13 GB/s).
///
/// # Safety
/// `dst` and `src` must be valid for `len` bytes and must not overlap.
pub unsafe fn copy(dst: *mut u8, src: *const u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        if len >= NT_THRESHOLD {
            // SAFETY: nt_copy's contract is this function's (valid, non-overlapping ranges of len bytes).
            unsafe { nt_copy(dst, src, len) };
            return;
        }
        if len >= TRAP_MIN_LEN && in_rep_movsb_trap(dst, src) && std::is_x86_feature_detected!("avx2") {
            // SAFETY: avx2 is present (checked above); vec_copy's contract is this function's.
            unsafe { vec_copy(dst, src, len) };
            return;
        }
    }
    // SAFETY: this fn's contract: both ranges are valid for `len` bytes and do not overlap.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, len) };
}

/// Below this, the destination is probably read again soon (and fits in cache): keep it cached.
pub const NT_THRESHOLD: usize = 1 << 20;

/// glibc's memcpy copies with `rep movsb` from a few KiB up. On AMD EPYC with FSRM that
/// instruction runs about 10x slower when the destination lies just past the source modulo 4096
/// (measured on the development VM: 1-15 bytes past on the current host, 1-31 on an earlier
/// one; 64 KiB in 19-20 us instead of 1.6-2.1 us). A buffer a few elements into a tensor meets
/// it against a page-aligned staging slot. Such copies take a plain vector loop instead.
const TRAP_MIN_LEN: usize = 2048;

/// Whether `dst` lies 1 to 31 bytes past `src` modulo 4096 (the slow window, widest seen).
fn in_rep_movsb_trap(dst: *mut u8, src: *const u8) -> bool {
    let d = (dst as usize).wrapping_sub(src as usize) & 4095;
    (1..32).contains(&d)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
/// Cached copy with 32-byte vector loads and stores, 128 bytes a turn; the tail (< 32 bytes) by
/// memcpy, which copies so few bytes with plain moves.
/// # Safety
/// As `copy`; the CPU must have AVX2.
unsafe fn vec_copy(dst: *mut u8, src: *const u8, len: usize) {
    use std::arch::x86_64::{__m256i, _mm256_loadu_si256, _mm256_storeu_si256};
    let mut i = 0;
    // SAFETY: this fn's contract (ranges valid for `len` bytes, disjoint); every load and store
    // below stays inside the first `len` bytes of src and dst, unaligned ones allowed.
    unsafe {
        while i + 128 <= len {
            let a = _mm256_loadu_si256(src.add(i) as *const __m256i);
            let b = _mm256_loadu_si256(src.add(i + 32) as *const __m256i);
            let c = _mm256_loadu_si256(src.add(i + 64) as *const __m256i);
            let d = _mm256_loadu_si256(src.add(i + 96) as *const __m256i);
            _mm256_storeu_si256(dst.add(i) as *mut __m256i, a);
            _mm256_storeu_si256(dst.add(i + 32) as *mut __m256i, b);
            _mm256_storeu_si256(dst.add(i + 64) as *mut __m256i, c);
            _mm256_storeu_si256(dst.add(i + 96) as *mut __m256i, d);
            i += 128;
        }
        while i + 32 <= len {
            _mm256_storeu_si256(dst.add(i) as *mut __m256i, _mm256_loadu_si256(src.add(i) as *const __m256i));
            i += 32;
        }
        std::ptr::copy_nonoverlapping(src.add(i), dst.add(i), len - i);
    }
}

#[cfg(target_arch = "x86_64")]
/// `copy` with non-temporal (streaming) stores for the body, bypassing the cache.
///
/// # Safety
/// As `copy`: `dst` and `src` valid for `len` bytes, not overlapping. (SSE2 only, which every
/// x86-64 CPU has.)
unsafe fn nt_copy(dst: *mut u8, src: *const u8, len: usize) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
    // Align the destination to 16 bytes with a plain copy, stream the body, copy the tail.
    let head = (16 - (dst as usize & 15)) & 15;
    let head = head.min(len);
    // SAFETY: this fn's contract: both ranges hold `len` bytes and do not overlap. head + the
    // 64-byte steps + the tail add up to `len`, so every access stays inside them, and after
    // `head` bytes `d` is 16-aligned, as _mm_stream_si128 requires.
    unsafe {
        std::ptr::copy_nonoverlapping(src, dst, head);
        let mut d = dst.add(head);
        let mut s = src.add(head);
        let mut left = len - head;
        while left >= 64 {
            let a = _mm_loadu_si128(s as *const __m128i);
            let b = _mm_loadu_si128(s.add(16) as *const __m128i);
            let c = _mm_loadu_si128(s.add(32) as *const __m128i);
            let e = _mm_loadu_si128(s.add(48) as *const __m128i);
            _mm_stream_si128(d as *mut __m128i, a);
            _mm_stream_si128(d.add(16) as *mut __m128i, b);
            _mm_stream_si128(d.add(32) as *mut __m128i, c);
            _mm_stream_si128(d.add(48) as *mut __m128i, e);
            d = d.add(64);
            s = s.add(64);
            left -= 64;
        }
        _mm_sfence();
        std::ptr::copy_nonoverlapping(s, d, left);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `copy` is exact whichever route it takes: the vector loop for destinations 1-31 bytes past
    /// the source modulo 4096 (lengths around its 128- and 32-byte steps and the route's lower
    /// bound), memcpy for other offsets, the streaming copy from 1 MiB.
    #[test]
    fn copy_is_exact_at_every_route_and_offset() {
        let lens = [0usize, 1, 31, 32, 33, 127, 128, 129, TRAP_MIN_LEN - 1, TRAP_MIN_LEN, TRAP_MIN_LEN + 31, 5000, 65_537, NT_THRESHOLD + 77];
        let max = *lens.iter().max().unwrap();
        let src_area: Vec<u8> = (0..max + 8192).map(|i| (i * 131 % 251) as u8).collect();
        let mut dst_area = vec![0u8; max + 3 * 8192];
        for &len in &lens {
            for gap in [1usize, 8, 15, 16, 31, 32, 64] {
                let s_at = src_area.as_ptr().align_offset(4096);
                // dst - src = gap modulo 4096
                let d_base = dst_area.as_ptr().align_offset(4096);
                let d_at = d_base + gap;
                let src = &src_area[s_at..s_at + len];
                assert_eq!((dst_area[d_at..].as_ptr() as usize).wrapping_sub(src.as_ptr() as usize) & 4095, gap);
                dst_area.iter_mut().for_each(|b| *b = 0xEE);
                // SAFETY: src holds len bytes, dst_area from d_at holds at least len bytes, and they are separate allocations.
                unsafe { copy(dst_area[d_at..].as_mut_ptr(), src.as_ptr(), len) };
                assert!(dst_area[d_at..d_at + len] == *src, "len {len} gap {gap}: wrong bytes");
                assert!(dst_area[..d_at].iter().chain(&dst_area[d_at + len..]).all(|&b| b == 0xEE), "len {len} gap {gap}: wrote outside");
            }
        }
    }
}
