//! Reduction kernels: dst = op(srcs[0], srcs[1], ...), element-wise, sources combined in the order
//! given (so every rank that reduces the same element gets the same bits).
//!
//! Work goes in blocks of BLOCK elements through an accumulator array on the stack: every source
//! of a block is read before dst is written, so dst may alias one of the sources at the same
//! offset (in-place collectives). float16 and bfloat16 accumulate in float32 per block and round
//! once at the end, as the issue asks; integers wrap like two's-complement hardware, except that
//! an avg is summed in at least 32 bits before it divides; bool is one byte of 0 or 1 where sum
//! and max are "any" and prod and min are "all", as torch computes them.
use crate::dtype::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16, DType, ReduceOp};

const BLOCK: usize = 512;

trait Elem: Copy {
    type Acc: Copy + Default;
    fn load(self) -> Self::Acc;
    fn store(a: Self::Acc) -> Self;
    fn sum(a: Self::Acc, b: Self::Acc) -> Self::Acc;
    fn prod(a: Self::Acc, b: Self::Acc) -> Self::Acc;
    fn min(a: Self::Acc, b: Self::Acc) -> Self::Acc;
    fn max(a: Self::Acc, b: Self::Acc) -> Self::Acc;
    fn div(a: Self::Acc, n: usize) -> Self::Acc;
    fn band(a: Self::Acc, b: Self::Acc) -> Self::Acc;
    fn bor(a: Self::Acc, b: Self::Acc) -> Self::Acc;
    fn bxor(a: Self::Acc, b: Self::Acc) -> Self::Acc;
}

macro_rules! float_elem {
    ($t:ty) => {
        impl Elem for $t {
            type Acc = $t;
            #[inline(always)]
            fn load(self) -> $t { self }
            #[inline(always)]
            fn store(a: $t) -> $t { a }
            #[inline(always)]
            fn sum(a: $t, b: $t) -> $t { a + b }
            #[inline(always)]
            fn prod(a: $t, b: $t) -> $t { a * b }
            // NaN propagates, as torch's min/max do.
            #[inline(always)]
            fn min(a: $t, b: $t) -> $t { if a < b || a != a { a } else { b } }
            #[inline(always)]
            fn max(a: $t, b: $t) -> $t { if a > b || a != a { a } else { b } }
            #[inline(always)]
            fn div(a: $t, n: usize) -> $t { a / (n as $t) }
            // Never reached: dtype::check refuses bitwise ops on floats before an op starts.
            // Defined on the bit patterns so the kernel stays total.
            #[inline(always)]
            fn band(a: $t, b: $t) -> $t { <$t>::from_bits(a.to_bits() & b.to_bits()) }
            #[inline(always)]
            fn bor(a: $t, b: $t) -> $t { <$t>::from_bits(a.to_bits() | b.to_bits()) }
            #[inline(always)]
            fn bxor(a: $t, b: $t) -> $t { <$t>::from_bits(a.to_bits() ^ b.to_bits()) }
        }
    };
}
float_elem!(f32);
float_elem!(f64);

// Integers accumulate in `$acc` with wrapping arithmetic and are stored back truncated: for sum,
// prod, min, max and the bitwise ops that gives exactly the bits of working in the element type
// (two's-complement arithmetic agrees on the low bits; widening keeps the order), while avg
// divides the sum before it is narrowed. 8- and 16-bit elements take a 32-bit accumulator, so the
// mean of up to 2^16 ranks' values is exact where a narrow sum would wrap first (4 ranks of int8
// 38 gave -26). A multi-stage algorithm stores partial sums in the element type between stages;
// the bindings refuse 8-bit avg where one runs (across hosts).
macro_rules! int_elem {
    ($t:ty, $acc:ty) => {
        impl Elem for $t {
            type Acc = $acc;
            #[inline(always)]
            fn load(self) -> $acc { self as $acc }
            #[inline(always)]
            fn store(a: $acc) -> $t { a as $t }
            #[inline(always)]
            fn sum(a: $acc, b: $acc) -> $acc { a.wrapping_add(b) }
            #[inline(always)]
            fn prod(a: $acc, b: $acc) -> $acc { a.wrapping_mul(b) }
            #[inline(always)]
            fn min(a: $acc, b: $acc) -> $acc { if a < b { a } else { b } }
            #[inline(always)]
            fn max(a: $acc, b: $acc) -> $acc { if a > b { a } else { b } }
            // Truncating division of the sum; in i128 so a world size wider than the type still
            // divides right.
            #[inline(always)]
            fn div(a: $acc, n: usize) -> $acc { (a as i128 / n as i128) as $acc }
            #[inline(always)]
            fn band(a: $acc, b: $acc) -> $acc { a & b }
            #[inline(always)]
            fn bor(a: $acc, b: $acc) -> $acc { a | b }
            #[inline(always)]
            fn bxor(a: $acc, b: $acc) -> $acc { a ^ b }
        }
    };
}
int_elem!(i8, i32);
int_elem!(u8, u32);
int_elem!(i16, i32);
int_elem!(u16, u32);
int_elem!(i32, i32);
int_elem!(u32, u32);
int_elem!(i64, i64);
int_elem!(u64, u64);

/// torch.bool: 0 or 1 in a byte.
#[derive(Clone, Copy)]
#[repr(transparent)]
struct Flag(u8);

impl Elem for Flag {
    type Acc = u8;
    #[inline(always)]
    fn load(self) -> u8 { self.0 }
    #[inline(always)]
    fn store(a: u8) -> Flag { Flag(a) }
    #[inline(always)]
    fn sum(a: u8, b: u8) -> u8 { a | b }
    #[inline(always)]
    fn prod(a: u8, b: u8) -> u8 { a & b }
    #[inline(always)]
    fn min(a: u8, b: u8) -> u8 { a & b }
    #[inline(always)]
    fn max(a: u8, b: u8) -> u8 { a | b }
    // Never reached: dtype::check refuses avg on bool. "any" keeps the result a valid bool.
    #[inline(always)]
    fn div(a: u8, _n: usize) -> u8 { a }
    #[inline(always)]
    fn band(a: u8, b: u8) -> u8 { a & b }
    #[inline(always)]
    fn bor(a: u8, b: u8) -> u8 { a | b }
    #[inline(always)]
    fn bxor(a: u8, b: u8) -> u8 { a ^ b }
}

#[derive(Clone, Copy)]
#[repr(transparent)]
struct Half(u16);
#[derive(Clone, Copy)]
#[repr(transparent)]
struct BHalf(u16);

macro_rules! narrow_elem {
    ($t:ident, $to:ident, $from:ident) => {
        impl Elem for $t {
            type Acc = f32;
            #[inline(always)]
            fn load(self) -> f32 { $to(self.0) }
            #[inline(always)]
            fn store(a: f32) -> $t { $t($from(a)) }
            #[inline(always)]
            fn sum(a: f32, b: f32) -> f32 { a + b }
            #[inline(always)]
            fn prod(a: f32, b: f32) -> f32 { a * b }
            #[inline(always)]
            fn min(a: f32, b: f32) -> f32 { <f32 as Elem>::min(a, b) }
            #[inline(always)]
            fn max(a: f32, b: f32) -> f32 { <f32 as Elem>::max(a, b) }
            #[inline(always)]
            fn div(a: f32, n: usize) -> f32 { a / n as f32 }
            #[inline(always)]
            fn band(a: f32, b: f32) -> f32 { <f32 as Elem>::band(a, b) }
            #[inline(always)]
            fn bor(a: f32, b: f32) -> f32 { <f32 as Elem>::bor(a, b) }
            #[inline(always)]
            fn bxor(a: f32, b: f32) -> f32 { <f32 as Elem>::bxor(a, b) }
        }
    };
}
narrow_elem!(Half, f16_to_f32, f32_to_f16);
narrow_elem!(BHalf, bf16_to_f32, f32_to_bf16);

#[inline(always)]
fn combine<T: Elem>(acc: &mut [T::Acc], src: &[T], f: impl Fn(T::Acc, T::Acc) -> T::Acc) {
    for (a, s) in acc.iter_mut().zip(src) {
        *a = f(*a, s.load());
    }
}

#[inline(always)]
/// `reduce_many` for one element type, BLOCK elements at a time through `acc`.
///
/// # Safety
/// `reduce_many`'s, with `T` the type `dtype` names (Half, BHalf and Flag are repr(transparent)
/// over the bytes torch stores).
unsafe fn reduce_typed<T: Elem>(dst: *mut u8, srcs: &[*const u8], count: usize, op: ReduceOp, avg_n: usize) {
    let mut acc = [T::Acc::default(); BLOCK];
    let mut start = 0;
    while start < count {
        let n = BLOCK.min(count - start);
        let acc = &mut acc[..n];
        // SAFETY: the pointers cover count elements of T (reduce_many's contract) and start + n <= count.
        let first = unsafe { std::slice::from_raw_parts((srcs[0] as *const T).add(start), n) };
        for (a, s) in acc.iter_mut().zip(first) {
            *a = s.load();
        }
        for &p in &srcs[1..] {
            // SAFETY: the pointers cover count elements of T (reduce_many's contract) and start + n <= count.
            let src = unsafe { std::slice::from_raw_parts((p as *const T).add(start), n) };
            match op {
                ReduceOp::Sum | ReduceOp::Avg => combine::<T>(acc, src, T::sum),
                ReduceOp::Prod => combine::<T>(acc, src, T::prod),
                ReduceOp::Min => combine::<T>(acc, src, T::min),
                ReduceOp::Max => combine::<T>(acc, src, T::max),
                ReduceOp::BAnd => combine::<T>(acc, src, T::band),
                ReduceOp::BOr => combine::<T>(acc, src, T::bor),
                ReduceOp::BXor => combine::<T>(acc, src, T::bxor),
            }
        }
        if op == ReduceOp::Avg {
            for a in acc.iter_mut() {
                *a = T::div(*a, avg_n);
            }
        }
        // SAFETY: dst covers count aligned elements of T (this fn's contract) and start + n <=
        // count. dst may alias a source only at the same offset, and this block's source slices
        // are no longer used: the block was read into `acc` before this write.
        let out = unsafe { std::slice::from_raw_parts_mut((dst as *mut T).add(start), n) };
        for (o, a) in out.iter_mut().zip(acc.iter()) {
            *o = T::store(*a);
        }
        start += n;
    }
}

/// dst[i] = op over s in srcs of s[i], for i < count; avg divides the sum by `avg_n` (the world
/// size, which may exceed srcs.len() when a caller reduces in stages).
///
/// # Safety
/// Every pointer must be valid for `count` elements of `dtype` and suitably aligned; dst may alias
/// a source only at the same offset; nothing else writes them during the call.
pub unsafe fn reduce_many(dst: *mut u8, srcs: &[*const u8], count: usize, dtype: DType, op: ReduceOp, avg_n: usize) {
    if count == 0 || srcs.is_empty() {
        return;
    }
    // The crate is built for baseline x86-64 (SSE2) so it runs anywhere; the same kernels compiled
    // for AVX2 run twice as fast, so pick them at run time where the CPU has it.
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            // SAFETY: AVX2 and FMA are present (checked above); reduce_avx2's other conditions
            // are this fn's contract.
            unsafe { reduce_avx2(dst, srcs, count, dtype, op, avg_n) };
            return;
        }
    }
    // SAFETY: reduce_dispatch's contract is this fn's.
    unsafe { reduce_dispatch(dst, srcs, count, dtype, op, avg_n) }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
/// `reduce_dispatch` compiled with AVX2 and FMA (the kernels inline into it).
///
/// # Safety
/// `reduce_many`'s, and the CPU has AVX2 and FMA.
unsafe fn reduce_avx2(dst: *mut u8, srcs: &[*const u8], count: usize, dtype: DType, op: ReduceOp, avg_n: usize) {
    // SAFETY: reduce_dispatch's contract is this fn's (less the CPU features).
    unsafe { reduce_dispatch(dst, srcs, count, dtype, op, avg_n) }
}

#[inline(always)]
/// The kernel for `dtype`'s element type.
///
/// # Safety
/// `reduce_many`'s.
unsafe fn reduce_dispatch(dst: *mut u8, srcs: &[*const u8], count: usize, dtype: DType, op: ReduceOp, avg_n: usize) {
    // SAFETY: this fn's contract; each arm passes the element type its `dtype` names, as
    // reduce_typed requires.
    unsafe {
        match dtype {
            DType::F32 => reduce_typed::<f32>(dst, srcs, count, op, avg_n),
            DType::F64 => reduce_typed::<f64>(dst, srcs, count, op, avg_n),
            DType::F16 => reduce_typed::<Half>(dst, srcs, count, op, avg_n),
            DType::BF16 => reduce_typed::<BHalf>(dst, srcs, count, op, avg_n),
            DType::I8 => reduce_typed::<i8>(dst, srcs, count, op, avg_n),
            DType::U8 => reduce_typed::<u8>(dst, srcs, count, op, avg_n),
            DType::I32 => reduce_typed::<i32>(dst, srcs, count, op, avg_n),
            DType::I64 => reduce_typed::<i64>(dst, srcs, count, op, avg_n),
            DType::I16 => reduce_typed::<i16>(dst, srcs, count, op, avg_n),
            DType::U16 => reduce_typed::<u16>(dst, srcs, count, op, avg_n),
            DType::U32 => reduce_typed::<u32>(dst, srcs, count, op, avg_n),
            DType::U64 => reduce_typed::<u64>(dst, srcs, count, op, avg_n),
            DType::Bool => reduce_typed::<Flag>(dst, srcs, count, op, avg_n),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run<T: Copy>(srcs: &[Vec<T>], dtype: DType, op: ReduceOp) -> Vec<T> {
        let mut out = srcs[0].clone();
        let ptrs: Vec<*const u8> = srcs.iter().map(|s| s.as_ptr() as *const u8).collect();
        // SAFETY: `out` and every source are vectors of out.len() elements of T, the type the
        // callers' `dtype` names (aligned for it); `out` is a copy, aliased by no source.
        unsafe { reduce_many(out.as_mut_ptr() as *mut u8, &ptrs, out.len(), dtype, op, srcs.len()) };
        out
    }

    #[test]
    fn every_op_on_ints_and_floats() {
        let a: Vec<i32> = (0..1500).map(|i| i - 700).collect();
        let b: Vec<i32> = (0..1500).map(|i| 3 * i % 11 - 5).collect();
        let s = run(&[a.clone(), b.clone()], DType::I32, ReduceOp::Sum);
        let p = run(&[a.clone(), b.clone()], DType::I32, ReduceOp::Prod);
        let mn = run(&[a.clone(), b.clone()], DType::I32, ReduceOp::Min);
        let mx = run(&[a.clone(), b.clone()], DType::I32, ReduceOp::Max);
        let av = run(&[a.clone(), b.clone()], DType::I32, ReduceOp::Avg);
        for i in 0..a.len() {
            assert_eq!(s[i], a[i] + b[i]);
            assert_eq!(p[i], a[i] * b[i]);
            assert_eq!(mn[i], a[i].min(b[i]));
            assert_eq!(mx[i], a[i].max(b[i]));
            assert_eq!(av[i], (a[i] + b[i]) / 2);
        }
        let f: Vec<f64> = (0..700).map(|i| i as f64 * 0.5).collect();
        let g: Vec<f64> = (0..700).map(|i| 1.0 - i as f64).collect();
        let s = run(&[f.clone(), g.clone(), f.clone()], DType::F64, ReduceOp::Sum);
        for i in 0..f.len() {
            assert_eq!(s[i], f[i] + g[i] + f[i]);
        }
    }

    #[test]
    fn int8_wraps_and_half_accumulates_in_f32() {
        let a = vec![100i8; 3];
        assert_eq!(run(&[a.clone(), a.clone()], DType::I8, ReduceOp::Sum), vec![-56i8; 3]);
        // 2048 + 1 + 1 in half: pairwise in half gives 2048 (each +1 rounds away); in f32, 2050.
        let big = vec![f32_to_f16(2048.0); 4];
        let one = vec![f32_to_f16(1.0); 4];
        let out = run(&[big, one.clone(), one], DType::F16, ReduceOp::Sum);
        assert_eq!(f16_to_f32(out[0]), 2050.0);
        let bb = vec![f32_to_bf16(3.0); 2];
        let out = run(&[bb.clone(), bb], DType::BF16, ReduceOp::Avg);
        assert_eq!(bf16_to_f32(out[1]), 3.0);
    }

    #[test]
    fn bitwise_ops_and_new_integer_widths() {
        let a: Vec<i16> = (0..1100).map(|i| (i * 37 - 9000) as i16).collect();
        let b: Vec<i16> = (0..1100).map(|i| (i * 101 + 5) as i16).collect();
        let and = run(&[a.clone(), b.clone()], DType::I16, ReduceOp::BAnd);
        let or = run(&[a.clone(), b.clone()], DType::I16, ReduceOp::BOr);
        let xor = run(&[a.clone(), b.clone()], DType::I16, ReduceOp::BXor);
        let sum = run(&[a.clone(), b.clone()], DType::I16, ReduceOp::Sum);
        for i in 0..a.len() {
            assert_eq!(and[i], a[i] & b[i]);
            assert_eq!(or[i], a[i] | b[i]);
            assert_eq!(xor[i], a[i] ^ b[i]);
            assert_eq!(sum[i], a[i].wrapping_add(b[i]));
        }
        let u = vec![u64::MAX - 1; 3];
        assert_eq!(run(&[u.clone(), vec![3u64; 3]], DType::U64, ReduceOp::Sum), vec![1u64; 3]);
        assert_eq!(run(&[u.clone(), vec![3u64; 3]], DType::U64, ReduceOp::Max), u);
        let w = vec![40_000u16; 2];
        // 16-bit avg sums in 32 bits: the exact mean, where a 16-bit sum would wrap to 14464.
        assert_eq!(run(&[w.clone(), w.clone()], DType::U16, ReduceOp::Avg), vec![40_000u16; 2]);
        let v = vec![3_000_000_000u32; 2];
        assert_eq!(run(&[v.clone(), vec![1u32; 2]], DType::U32, ReduceOp::Min), vec![1u32; 2]);
    }

    #[test]
    fn bool_is_any_and_all() {
        let a: Vec<u8> = vec![0, 0, 1, 1];
        let b: Vec<u8> = vec![0, 1, 0, 1];
        assert_eq!(run(&[a.clone(), b.clone()], DType::Bool, ReduceOp::Sum), vec![0, 1, 1, 1]);
        assert_eq!(run(&[a.clone(), b.clone()], DType::Bool, ReduceOp::Max), vec![0, 1, 1, 1]);
        assert_eq!(run(&[a.clone(), b.clone()], DType::Bool, ReduceOp::Prod), vec![0, 0, 0, 1]);
        assert_eq!(run(&[a.clone(), b.clone()], DType::Bool, ReduceOp::Min), vec![0, 0, 0, 1]);
        assert_eq!(run(&[a.clone(), b.clone()], DType::Bool, ReduceOp::BXor), vec![0, 1, 1, 0]);
        assert_eq!(run(&[a.clone(), b.clone(), b.clone()], DType::Bool, ReduceOp::Sum), vec![0, 1, 1, 1]);
    }

    #[test]
    fn int8_average_over_more_ranks_than_the_type_holds() {
        let srcs: Vec<Vec<i8>> = (0..300).map(|_| vec![1i8]).collect();
        // summed in 32 bits: 300 / 300 = 1 (an 8-bit sum would wrap to 44 and give 0)
        assert_eq!(run(&srcs, DType::I8, ReduceOp::Avg), vec![1i8]);
    }
    #[test]
    fn eight_bit_avg_sums_wide_before_dividing_and_other_ops_still_wrap() {
        // 4 ranks of 38: an 8-bit sum wraps to -104 and "averages" to -26; the mean is 38.
        let v = vec![38i8; 1100];
        assert_eq!(run(&[v.clone(), v.clone(), v.clone(), v.clone()], DType::I8, ReduceOp::Avg), vec![38i8; 1100]);
        let lo = vec![-128i8, -127, 127, 5];
        let hi = vec![-128i8, 126, 127, -6];
        assert_eq!(run(&[lo.clone(), hi.clone()], DType::I8, ReduceOp::Avg), vec![-128i8, 0, 127, 0]);
        let u = vec![200u8; 600];
        assert_eq!(run(&[u.clone(), u.clone(), u.clone()], DType::U8, ReduceOp::Avg), vec![200u8; 600]);
        // sum and prod keep their two's-complement wrap bit for bit; min and max are unchanged.
        for (a, b) in [(100i8, 100i8), (-128, -1), (127, 2), (-77, 93)] {
            let (x, y) = (vec![a; 3], vec![b; 3]);
            assert_eq!(run(&[x.clone(), y.clone()], DType::I8, ReduceOp::Sum)[0], a.wrapping_add(b));
            assert_eq!(run(&[x.clone(), y.clone()], DType::I8, ReduceOp::Prod)[0], a.wrapping_mul(b));
            assert_eq!(run(&[x.clone(), y.clone()], DType::I8, ReduceOp::Min)[0], a.min(b));
            assert_eq!(run(&[x, y], DType::I8, ReduceOp::Max)[0], a.max(b));
        }
        let (x, y) = (vec![250u8; 2], vec![9u8; 2]);
        assert_eq!(run(&[x.clone(), y.clone()], DType::U8, ReduceOp::Sum)[0], 250u8.wrapping_add(9));
        assert_eq!(run(&[x, y], DType::U8, ReduceOp::Prod)[0], 250u8.wrapping_mul(9));
    }
}
