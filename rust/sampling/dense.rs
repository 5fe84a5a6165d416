//! Kernels over a whole logits row: exponential sums, threshold gathers and
//! the adaptive top-k gather. Each is one linear pass written so that it
//! vectorises; on x86-64 an AVX-512 or AVX2+FMA build is chosen at run time.

use super::candidates::{by_rank, reorder_ties, top_k_sparse, Cand};

const LANES: usize = 16;
/// Entries per block of the exponential kernels (at most 64 chunks of `LANES`).
const BLOCK: usize = 1024;

const LOG2E: f32 = std::f32::consts::LOG2_E;
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
/// 1.5 * 2^23: adding it rounds to an integer held in the low mantissa bits.
const MAGIC: f32 = 12_582_912.0;

/// `a * b + c`, fused when the kernel is compiled for FMA.
#[inline(always)]
fn madd<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA {
        a.mul_add(b, c)
    } else {
        a * b + c
    }
}

/// Largest `|max * scale|` for which the kernels subtract the maximum with a
/// fused multiply-add. The fused `x * scale - ms` is the exact product minus
/// `ms = fl(max * scale)`, so the maximum's own term is `exp(r)` with
/// `|r| <= ulp(ms) / 2`: at most 2^-12 here, a mass within 0.025% of 1. Above
/// it (|logit| / T beyond a few thousand) `r` grows with the scale until it
/// leaves the exponential's domain, so the kernels take their unfused build
/// instead: `fl(x * scale) - ms`, which is never positive (rounding is
/// monotonic), the same values the candidates carry. The test sits outside
/// the inner loops.
pub const FUSED_LIMIT: f32 = 4096.0;

/// Whether a kernel over `(max, scale)` must take its unfused build.
#[inline(always)]
fn unfused(max: f32, scale: f32) -> bool {
    let ms = (max * scale).abs();
    ms.is_nan() || ms > FUSED_LIMIT
}

/// `x * scale - max * scale` as the kernels compute it for `(max, scale)`
/// (in f64, before the exponential): what log-probabilities must subtract so
/// that they agree with the kernels' sums.
#[inline]
pub fn scaled_gap(x: f32, max: f32, scale: f32) -> f64 {
    let ms = max * scale;
    if unfused(max, scale) {
        (x * scale - ms) as f64
    } else {
        x as f64 * scale as f64 - ms as f64
    }
}

/// `exp(z)` for `z <= 0` with about 2e-7 relative error down to `-86.5`;
/// `z < -87` (and `-inf`) gives exactly 0 (between the two, `exp(-86.5)`).
/// Branch-free so that loops over it vectorise.
#[inline(always)]
pub fn exp_neg(z: f32) -> f32 {
    exp_neg_impl::<false>(z)
}

#[inline(always)]
fn exp_neg_impl<const FMA: bool>(z: f32) -> f32 {
    let v = exp_neg_term::<FMA>(z);
    if z < -87.0 {
        0.0
    } else {
        v
    }
}

/// `exp(max(z, -86.5))` for `z <= 0`: [`exp_neg`] without the final select,
/// for sums, where a banned entry's `exp(-86.5) = 2.7e-38` is lost against
/// the maximum's `1`.
///
/// `z = n ln 2 + r` with `|r| <= ln(2) / 2` (Cody-Waite, two FMAs), `exp(r)`
/// by a degree-5 polynomial fitted for relative error (1.1e-7; Horner, five
/// FMAs), and `2^n` added to the result's exponent bits. The clamp at -86.5
/// keeps the result a normal float, so that the exponent add is exact.
#[inline(always)]
fn exp_neg_term<const FMA: bool>(z: f32) -> f32 {
    let zc = if z < -86.5 { -86.5 } else { z };
    let t = madd::<FMA>(zc, LOG2E, MAGIC);
    let n = t - MAGIC;
    let r = madd::<FMA>(-n, LN2_HI, zc);
    let r = madd::<FMA>(-n, LN2_LO, r);
    let mut p = 8.312_564e-3f32;
    p = madd::<FMA>(p, r, 4.189_002_5e-2);
    p = madd::<FMA>(p, r, 1.666_711_4e-1);
    p = madd::<FMA>(p, r, 4.999_923_4e-1);
    p = madd::<FMA>(p, r, 1.0);
    let e = madd::<FMA>(p, r, 1.0);
    // n sits in the low mantissa bits of `t` (two's complement, the bits of
    // MAGIC above them shift out): add it to the exponent of `e`.
    f32::from_bits(e.to_bits().wrapping_add(t.to_bits().wrapping_shl(23)))
}

/// Every kernel comes in three builds chosen at run time: AVX-512F (16 lanes
/// per instruction), AVX2+FMA, and portable code. No `target-cpu=native`.
/// A kernel is generic over `FMA` (fused multiply-add); one declared `wide`
/// is also generic over `WIDE` (AVX-512 instructions may be used directly).
macro_rules! dispatch {
    ($(#[$doc:meta])* pub fn $($rest:tt)*) => {
        dispatch!(@build [false] [true] [true] [true] $(#[$doc])* pub fn $($rest)*);
    };
    (wide $(#[$doc:meta])* pub fn $($rest:tt)*) => {
        dispatch!(@build [false, false] [true, false] [true, false] [true, true] $(#[$doc])* pub fn $($rest)*);
    };
    (@build [$($portable:tt)*] [$($arm:tt)*] [$($avx2c:tt)*] [$($avx512c:tt)*]
     $(#[$doc:meta])* pub fn $name:ident / $avx:ident / $generic:ident ( $($arg:ident : $ty:ty),* ) -> $ret:ty) => {
        $(#[$doc])*
        pub fn $name($($arg: $ty),*) -> $ret {
            #[cfg(target_arch = "x86_64")]
            {
                let avx2 = std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma");
                if avx2
                    && std::arch::is_x86_feature_detected!("avx512f")
                    && std::arch::is_x86_feature_detected!("popcnt")
                {
                    // SAFETY: the CPU supports AVX-512F, AVX2, FMA and POPCNT, checked just above.
                    return unsafe { $avx::avx512($($arg),*) };
                }
                if avx2 {
                    // SAFETY: the CPU supports AVX2 and FMA, checked just above.
                    return unsafe { $avx::avx2($($arg),*) };
                }
            }
            // AArch64 always has fused multiply-add: the same rounding as
            // the x86-64 builds, so the same tokens for the same seed.
            if cfg!(target_arch = "aarch64") {
                $generic::<$($arm)*>($($arg),*)
            } else {
                $generic::<$($portable)*>($($arg),*)
            }
        }

        #[cfg(target_arch = "x86_64")]
        mod $avx {
            #[allow(unused_imports)]
            use super::*;

            #[target_feature(enable = "avx2,fma")]
            pub unsafe fn avx2($($arg: $ty),*) -> $ret {
                $generic::<$($avx2c)*>($($arg),*)
            }

            #[target_feature(enable = "avx512f,avx2,fma,popcnt")]
            pub unsafe fn avx512($($arg: $ty),*) -> $ret {
                $generic::<$($avx512c)*>($($arg),*)
            }
        }
    };
}

/// The crate's argmax scan (`crate::argmax`), shared so there is one kernel.
pub use crate::argmax::argmax_nan;

dispatch! {
    /// [`argmax_nan`] of `src` while copying it into `dst` (resized), in one pass.
    pub fn copy_argmax_nan / copy_argmax_nan_avx2 / copy_argmax_nan_generic(src: &[f32], dst: &mut Vec<f32>) -> (usize, f32, bool)
}

#[inline(always)]
fn copy_argmax_nan_generic<const FMA: bool>(src: &[f32], dst: &mut Vec<f32>) -> (usize, f32, bool) {
    dst.clear();
    dst.reserve(src.len());
    const BLOCK_ARGMAX: usize = 256;
    let (mut best_v, mut best_b, mut any_nan) = (f32::NEG_INFINITY, 0usize, false);
    for (b, block) in src.chunks(BLOCK_ARGMAX).enumerate() {
        dst.extend_from_slice(block);
        let mut lane_max = [f32::NEG_INFINITY; LANES];
        let mut lane_nan = [0u32; LANES];
        let chunks = block.chunks_exact(LANES);
        let tail = chunks.remainder();
        for c in chunks {
            let c: &[f32; LANES] = c.try_into().unwrap_or(&[0.0; LANES]);
            for l in 0..LANES {
                let v = c[l];
                lane_max[l] = if v > lane_max[l] { v } else { lane_max[l] };
                lane_nan[l] |= v.is_nan() as u32;
            }
        }
        let mut m = f32::NEG_INFINITY;
        for l in 0..LANES {
            m = if lane_max[l] > m { lane_max[l] } else { m };
            any_nan |= lane_nan[l] != 0;
        }
        for &v in tail {
            m = if v > m { v } else { m };
            any_nan |= v.is_nan();
        }
        if m > best_v {
            best_v = m;
            best_b = b;
        }
    }
    let start = best_b * BLOCK_ARGMAX;
    let pos = src[start..]
        .iter()
        .position(|&v| v == best_v)
        .map_or(0, |p| start + p);
    (pos, best_v, any_nan)
}

dispatch! {
    /// `sum(exp((x - max) * scale))` over the row (`-inf` entries add 0).
    pub fn exp_sum / exp_sum_avx2 / exp_sum_generic(row: &[f32], max: f32, scale: f32) -> f64
}

#[inline(always)]
fn exp_sum_generic<const FMA: bool>(row: &[f32], max: f32, scale: f32) -> f64 {
    if FMA && unfused(max, scale) {
        return exp_sum_generic::<false>(row, max, scale);
    }
    let ms = max * scale;
    let mut total = 0.0f64;
    for block in row.chunks(BLOCK) {
        let mut acc = [0.0f32; LANES];
        let chunks = block.chunks_exact(LANES);
        let tail = chunks.remainder();
        for c in chunks {
            let c: &[f32; LANES] = c.try_into().unwrap_or(&[0.0; LANES]);
            for i in 0..LANES {
                acc[i] += exp_neg_term::<FMA>(madd::<FMA>(c[i], scale, -ms));
            }
        }
        let mut s = 0.0f32;
        for a in acc {
            s += a;
        }
        for &v in tail {
            s += exp_neg_term::<FMA>(madd::<FMA>(v, scale, -ms));
        }
        total += s as f64;
    }
    total
}

/// Append the entries of the lane-wide chunk `c` with `x * scale >= thr`:
/// a bit mask first, then one step per hit (not per lane), so chunks with
/// scattered hits cost no branch per entry. With `WIDE`, a full chunk goes
/// through AVX-512's compress instead, with no branch at all.
#[inline(always)]
fn push_hits<const WIDE: bool>(c: &[f32], base: usize, scale: f32, thr: f32, out: &mut Vec<Cand>) {
    #[cfg(target_arch = "x86_64")]
    if WIDE {
        if let Ok(c) = <&[f32; LANES]>::try_from(c) {
            // SAFETY: `WIDE` is set only in the AVX-512F build of a kernel,
            // which runs only on a CPU that has AVX-512F and POPCNT.
            unsafe { push_hits_avx512(c, base as u32, scale, thr, out) };
            return;
        }
    }
    let mut hit = 0u32;
    for (i, &v) in c.iter().enumerate() {
        hit |= ((v * scale >= thr) as u32) << i;
    }
    while hit != 0 {
        let i = hit.trailing_zeros() as usize;
        hit &= hit - 1;
        out.push(Cand {
            id: (base + i) as u32,
            logit: c[i] * scale,
        });
    }
}

/// The ids `base..base + 16` in one register.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn ids_from(base: u32) -> std::arch::x86_64::__m512i {
    use std::arch::x86_64::*;
    _mm512_add_epi32(
        _mm512_set1_epi32(base as i32),
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
    )
}

/// [`push_hits`] for one 16-lane chunk with AVX-512F: compress the hits'
/// ids and logits into registers, interleave them into `Cand` pairs and
/// store all 16 slots past the end (capacity is reserved), keeping as many
/// as there were hits.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,popcnt")]
fn push_hits_avx512(c: &[f32; LANES], base: u32, scale: f32, thr: f32, out: &mut Vec<Cand>) {
    use std::arch::x86_64::*;
    // SAFETY: `c` holds 16 floats, the 64 bytes the unaligned load reads.
    let v = _mm512_mul_ps(
        unsafe { _mm512_loadu_ps(c.as_ptr()) },
        _mm512_set1_ps(scale),
    );
    let m = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(v, _mm512_set1_ps(thr));
    let ids = _mm512_maskz_compress_epi32(m, ids_from(base));
    let logits = _mm512_castps_si512(_mm512_maskz_compress_ps(m, v));
    // Lanes 0-15 pick from `ids`, 16-31 from `logits`: (id_i, logit_i) pairs.
    let first = _mm512_permutex2var_epi32(
        ids,
        _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23),
        logits,
    );
    let second = _mm512_permutex2var_epi32(
        ids,
        _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31),
        logits,
    );
    out.reserve(LANES);
    let len = out.len();
    // SAFETY: `Cand` is `repr(C)` (u32 id, f32 logit: 8 bytes, no padding),
    // and `reserve` left room for 16 more, which the two 64-byte stores fill;
    // the first `len + hits` entries are then initialised.
    unsafe {
        let dst = out.as_mut_ptr().add(len).cast::<__m512i>();
        _mm512_storeu_si512(dst, first);
        _mm512_storeu_si512(dst.add(1), second);
        out.set_len(len + m.count_ones() as usize);
    }
}

/// A candidate list kept as two parallel arrays (ids, logits): what a gather
/// of thousands of entries writes fastest, and what vectorised passes over
/// the logits read directly.
#[derive(Debug, Default, Clone)]
pub struct Gathered {
    pub ids: Vec<u32>,
    pub logits: Vec<f32>,
}

impl Gathered {
    pub fn clear(&mut self) {
        self.ids.clear();
        self.logits.clear();
    }

    pub fn len(&self) -> usize {
        self.ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }
}

/// Append the entries with `x * scale >= thr` of the chunks of `block`
/// marked in `hit_chunks` (bit `i`: the 16 entries at `16 * i`, ids from
/// `base`) to `out`, in id order.
#[inline(always)]
fn push_chunks<const WIDE: bool>(
    block: &[f32],
    base: usize,
    scale: f32,
    thr: f32,
    hit_chunks: u64,
    out: &mut Gathered,
) {
    #[cfg(target_arch = "x86_64")]
    if WIDE {
        // SAFETY: `WIDE` is set only in the AVX-512F build of a kernel,
        // which runs only on a CPU that has AVX-512F and POPCNT.
        unsafe { push_chunks_avx512(block, base as u32, scale, thr, hit_chunks, out) };
        return;
    }
    let mut hits = hit_chunks;
    while hits != 0 {
        let ci = hits.trailing_zeros() as usize;
        hits &= hits - 1;
        for (i, &v) in block[ci * LANES..(ci + 1) * LANES].iter().enumerate() {
            let l = v * scale;
            if l >= thr {
                out.ids.push((base + ci * LANES + i) as u32);
                out.logits.push(l);
            }
        }
    }
}

/// [`push_chunks`] with AVX-512F: per marked chunk, one compare, a compress
/// of the ids and of the logits into registers, and two 64-byte stores past
/// the ends (capacity is reserved), keeping as many entries as were hits.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,popcnt")]
fn push_chunks_avx512(
    block: &[f32],
    base: u32,
    scale: f32,
    thr: f32,
    hit_chunks: u64,
    out: &mut Gathered,
) {
    use std::arch::x86_64::*;
    let room = hit_chunks.count_ones() as usize * LANES;
    out.ids.reserve(room);
    out.logits.reserve(room);
    let mut len = out.ids.len();
    debug_assert_eq!(len, out.logits.len());
    let (ids_dst, logits_dst) = (out.ids.as_mut_ptr(), out.logits.as_mut_ptr());
    let (vs, vt) = (_mm512_set1_ps(scale), _mm512_set1_ps(thr));
    let mut hits = hit_chunks;
    while hits != 0 {
        let ci = hits.trailing_zeros() as usize;
        hits &= hits - 1;
        let c = &block[ci * LANES..(ci + 1) * LANES];
        // SAFETY: `c` holds 16 floats, the 64 bytes the unaligned load reads.
        let v = _mm512_mul_ps(unsafe { _mm512_loadu_ps(c.as_ptr()) }, vs);
        let m = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(v, vt);
        let ids = _mm512_maskz_compress_epi32(m, ids_from(base + (ci * LANES) as u32));
        let logits = _mm512_maskz_compress_ps(m, v);
        // SAFETY: both vectors have room for `room` more entries past their
        // old length, and each marked chunk advances `len` by at most 16.
        unsafe {
            _mm512_storeu_si512(ids_dst.add(len).cast::<__m512i>(), ids);
            _mm512_storeu_ps(logits_dst.add(len), logits);
        }
        len += m.count_ones() as usize;
    }
    // SAFETY: the first `len` entries of both are initialised: the old ones
    // and the hits written above, contiguously.
    unsafe {
        out.ids.set_len(len);
        out.logits.set_len(len);
    }
}

dispatch! { wide
    /// [`exp_sum`] and, in the same pass, [`gather_ge`] of `x * scale >= thr`
    /// (into two parallel arrays).
    pub fn exp_sum_gather / exp_sum_gather_avx2 / exp_sum_gather_generic(row: &[f32], max: f32, scale: f32, thr: f32, out: &mut Gathered) -> f64
}

#[inline(always)]
fn exp_sum_gather_generic<const FMA: bool, const WIDE: bool>(
    row: &[f32],
    max: f32,
    scale: f32,
    thr: f32,
    out: &mut Gathered,
) -> f64 {
    if FMA && unfused(max, scale) {
        return exp_sum_gather_generic::<false, WIDE>(row, max, scale, thr, out);
    }
    let thr = if thr >= f32::MIN { thr } else { f32::MIN };
    let ms = max * scale;
    let mut total = 0.0f64;
    for (bi, block) in row.chunks(BLOCK).enumerate() {
        let mut acc = [0.0f32; LANES];
        let chunks = block.chunks_exact(LANES);
        let tail_start = block.len() - chunks.remainder().len();
        // Chunks with hits are noted in a mask and pushed after the block, so
        // that the exponential loop makes no call and keeps `acc` in registers.
        let mut hit_chunks = 0u64;
        for (ci, c) in chunks.enumerate() {
            let c: &[f32; LANES] = c.try_into().unwrap_or(&[0.0; LANES]);
            let mut hit = false;
            for i in 0..LANES {
                acc[i] += exp_neg_term::<FMA>(madd::<FMA>(c[i], scale, -ms));
                hit |= c[i] * scale >= thr;
            }
            hit_chunks |= (hit as u64) << ci;
        }
        if hit_chunks != 0 {
            push_chunks::<WIDE>(block, bi * BLOCK, scale, thr, hit_chunks, out);
        }
        let mut s = 0.0f32;
        for a in acc {
            s += a;
        }
        for (i, &v) in block[tail_start..].iter().enumerate() {
            s += exp_neg_term::<FMA>(madd::<FMA>(v, scale, -ms));
            let l = v * scale;
            if l >= thr {
                out.ids.push((bi * BLOCK + tail_start + i) as u32);
                out.logits.push(l);
            }
        }
        total += s as f64;
    }
    total
}

dispatch! {
    /// Like [`exp_sum`], also storing each term in `out` (resized to the row).
    pub fn exp_store / exp_store_avx2 / exp_store_generic(row: &[f32], max: f32, scale: f32, out: &mut Vec<f32>) -> f64
}

#[inline(always)]
fn exp_store_generic<const FMA: bool>(
    row: &[f32],
    max: f32,
    scale: f32,
    out: &mut Vec<f32>,
) -> f64 {
    if FMA && unfused(max, scale) {
        return exp_store_generic::<false>(row, max, scale, out);
    }
    let ms = max * scale;
    if out.len() != row.len() {
        out.clear();
        out.resize(row.len(), 0.0);
    }
    let mut total = 0.0f64;
    for (block, oblock) in row.chunks(BLOCK).zip(out.chunks_mut(BLOCK)) {
        let mut acc = [0.0f32; LANES];
        let chunks = block.chunks_exact(LANES);
        let tail = chunks.remainder();
        let mut ochunks = oblock.chunks_exact_mut(LANES);
        for (c, o) in chunks.zip(&mut ochunks) {
            let c: &[f32; LANES] = c.try_into().unwrap_or(&[0.0; LANES]);
            for i in 0..LANES {
                let e = exp_neg_impl::<FMA>(madd::<FMA>(c[i], scale, -ms));
                o[i] = e;
                acc[i] += e;
            }
        }
        let mut s = 0.0f32;
        for a in acc {
            s += a;
        }
        for (&v, o) in tail.iter().zip(ochunks.into_remainder()) {
            let e = exp_neg_impl::<FMA>(madd::<FMA>(v, scale, -ms));
            *o = e;
            s += e;
        }
        total += s as f64;
    }
    total
}

/// The sum of `weights` exactly as [`exp_store`] sums the values it stores
/// (16 lanes per 1024-entry block, blocks added in f64), so that masses kept
/// from an earlier [`exp_store`] give the same total bit for bit.
pub fn sum_like_exp_store(weights: &[f32]) -> f64 {
    let mut total = 0.0f64;
    for block in weights.chunks(BLOCK) {
        let mut acc = [0.0f32; LANES];
        let chunks = block.chunks_exact(LANES);
        let tail = chunks.remainder();
        for c in chunks {
            for i in 0..LANES {
                acc[i] += c[i];
            }
        }
        let mut s = 0.0f32;
        for a in acc {
            s += a;
        }
        for &e in tail {
            s += e;
        }
        total += s as f64;
    }
    total
}

dispatch! {
    /// `(sum e, sum e*z)` with `z = (x - max) * scale`, `e = exp(z)`: what the
    /// entropy of the row's softmax needs (`H = ln S - sum(e*z)/S`).
    pub fn entropy_sums / entropy_sums_avx2 / entropy_sums_generic(row: &[f32], max: f32, scale: f32) -> (f64, f64)
}

#[inline(always)]
fn entropy_sums_generic<const FMA: bool>(row: &[f32], max: f32, scale: f32) -> (f64, f64) {
    if FMA && unfused(max, scale) {
        return entropy_sums_generic::<false>(row, max, scale);
    }
    // Accumulated in f64: with a peaked row S is 1 + tiny, and the entropy
    // ln S - sum(e*z)/S would lose its digits to float32 rounding.
    let ms = max * scale;
    let mut acc = [0.0f64; LANES];
    let mut acz = [0.0f64; LANES];
    let chunks = row.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        let c: &[f32; LANES] = c.try_into().unwrap_or(&[0.0; LANES]);
        for i in 0..LANES {
            let z = madd::<FMA>(c[i], scale, -ms);
            let e = exp_neg_impl::<FMA>(z);
            acc[i] += e as f64;
            // e == 0 for banned entries; guard -inf * 0.
            acz[i] += if e > 0.0 { (e * z) as f64 } else { 0.0 };
        }
    }
    let (mut s, mut sz) = (0.0f64, 0.0f64);
    for i in 0..LANES {
        s += acc[i];
        sz += acz[i];
    }
    for &v in tail {
        let z = madd::<FMA>(v, scale, -ms);
        let e = exp_neg_impl::<FMA>(z);
        s += e as f64;
        sz += if e > 0.0 { (e * z) as f64 } else { 0.0 };
    }
    (s, sz)
}

dispatch! {
    /// Count, mean and population standard deviation of the finite entries.
    pub fn moments / moments_avx2 / moments_generic(row: &[f32]) -> (usize, f64, f64)
}

#[inline(always)]
fn moments_generic<const FMA: bool>(row: &[f32]) -> (usize, f64, f64) {
    // Both passes accumulate in f64, lane by lane: in float32 a square leaves
    // the range above |x| of about 1.8e19 and vanishes below about 1e-23, and a
    // sum overflows near 3e38, which moved top-n-sigma's cut at those scales.
    // Every float32 and every difference of two fits f64 with room to square.
    const W: usize = 8;
    let chunks = row.chunks_exact(W);
    let tail = chunks.remainder();
    let mut n = 0usize;
    let mut s = [0.0f64; W];
    for c in chunks.clone() {
        for j in 0..W {
            let f = c[j].is_finite();
            s[j] += if f { c[j] as f64 } else { 0.0 };
            n += f as usize;
        }
    }
    for (j, &v) in tail.iter().enumerate() {
        let f = v.is_finite();
        s[j] += if f { v as f64 } else { 0.0 };
        n += f as usize;
    }
    if n == 0 {
        return (0, 0.0, 0.0);
    }
    let mean = s.iter().sum::<f64>() / n as f64;
    let sq = |acc: f64, v: f32| -> f64 {
        if !v.is_finite() {
            return acc;
        }
        let d = v as f64 - mean;
        if FMA {
            d.mul_add(d, acc)
        } else {
            acc + d * d
        }
    };
    let mut ss = [0.0f64; W];
    for c in chunks {
        for j in 0..W {
            ss[j] = sq(ss[j], c[j]);
        }
    }
    for (j, &v) in tail.iter().enumerate() {
        ss[j] = sq(ss[j], v);
    }
    (n, mean, (ss.iter().sum::<f64>() / n as f64).sqrt())
}

dispatch! { wide
    /// Append every entry with `x * scale >= thr` (finite, id order) as a
    /// candidate with logit `x * scale`. `thr` below `f32::MIN` gathers every
    /// finite entry.
    pub fn gather_ge / gather_ge_avx2 / gather_ge_generic(row: &[f32], scale: f32, thr: f32, out: &mut Vec<Cand>) -> ()
}

#[inline(always)]
fn gather_ge_generic<const FMA: bool, const WIDE: bool>(
    row: &[f32],
    scale: f32,
    thr: f32,
    out: &mut Vec<Cand>,
) {
    // -inf * scale is -inf, which never reaches a threshold >= f32::MIN.
    let thr = if thr >= f32::MIN { thr } else { f32::MIN };
    let chunks = row.chunks_exact(LANES);
    let tail_start = row.len() - chunks.remainder().len();
    for (ci, c) in chunks.enumerate() {
        let mut hit = 0u32;
        for &v in c {
            hit |= (v * scale >= thr) as u32;
        }
        if hit != 0 {
            push_hits::<WIDE>(c, ci * LANES, scale, thr, out);
        }
    }
    for (i, &v) in row[tail_start..].iter().enumerate() {
        let l = v * scale;
        if l >= thr {
            out.push(Cand {
                id: (tail_start + i) as u32,
                logit: l,
            });
        }
    }
}

dispatch! { wide
    /// Append the candidates `(ids[i], logits[i])` with `logits[i] >= tau` to
    /// `out` in order, and their `weights[i]` to `masses` when it is given;
    /// returns how many logits equal `tau`.
    pub fn keep_ge / keep_ge_avx2 / keep_ge_generic(ids: &[u32], logits: &[f32], weights: &[f32], tau: f32, out: &mut Vec<Cand>, masses: Option<&mut Vec<f32>>) -> usize
}

#[inline(always)]
fn keep_ge_generic<const FMA: bool, const WIDE: bool>(
    ids: &[u32],
    logits: &[f32],
    weights: &[f32],
    tau: f32,
    out: &mut Vec<Cand>,
    mut masses: Option<&mut Vec<f32>>,
) -> usize {
    let n = ids.len().min(logits.len()).min(weights.len());
    let at_tau = logits[..n].iter().filter(|&&l| l == tau).count();
    #[cfg(target_arch = "x86_64")]
    let start = if WIDE {
        // SAFETY: `WIDE` is set only in the AVX-512F build of a kernel,
        // which runs only on a CPU that has AVX-512F and POPCNT.
        unsafe {
            keep_ge_avx512(
                &ids[..n],
                &logits[..n],
                &weights[..n],
                tau,
                out,
                masses.as_deref_mut(),
            )
        }
    } else {
        0
    };
    #[cfg(not(target_arch = "x86_64"))]
    let start = 0;
    for i in start..n {
        if logits[i] >= tau {
            out.push(Cand {
                id: ids[i],
                logit: logits[i],
            });
            if let Some(m) = masses.as_deref_mut() {
                m.push(weights[i]);
            }
        }
    }
    at_tau
}

/// [`keep_ge`] over whole 16-entry chunks with AVX-512F: a compare, the
/// compress of ids, logits (interleaved into `Cand` pairs) and weights, and
/// stores past the ends (capacity is reserved). Returns how many entries it
/// covered (the tail is left to the caller).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,popcnt")]
fn keep_ge_avx512(
    ids: &[u32],
    logits: &[f32],
    weights: &[f32],
    tau: f32,
    out: &mut Vec<Cand>,
    mut masses: Option<&mut Vec<f32>>,
) -> usize {
    use std::arch::x86_64::*;
    let full = ids.len() / LANES * LANES;
    out.reserve(full + LANES);
    if let Some(m) = masses.as_deref_mut() {
        m.reserve(full + LANES);
    }
    let vt = _mm512_set1_ps(tau);
    let pairs_lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    let pairs_hi = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
    let mut len = out.len();
    let mut mlen = masses.as_deref().map_or(0, |m| m.len());
    for c in (0..full).step_by(LANES) {
        // SAFETY: `c + 16 <= full <= len` of each slice: the loads stay inside.
        let (l, id) = unsafe {
            (
                _mm512_loadu_ps(logits.as_ptr().add(c)),
                _mm512_loadu_si512(ids.as_ptr().add(c).cast::<__m512i>()),
            )
        };
        let m = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(l, vt);
        let ids_c = _mm512_maskz_compress_epi32(m, id);
        let logits_c = _mm512_castps_si512(_mm512_maskz_compress_ps(m, l));
        let first = _mm512_permutex2var_epi32(ids_c, pairs_lo, logits_c);
        let second = _mm512_permutex2var_epi32(ids_c, pairs_hi, logits_c);
        // SAFETY: `Cand` is `repr(C)` (u32, f32); capacity holds `full + 16`
        // entries and at most `c` were kept before this chunk.
        unsafe {
            let dst = out.as_mut_ptr().add(len).cast::<__m512i>();
            _mm512_storeu_si512(dst, first);
            _mm512_storeu_si512(dst.add(1), second);
        }
        if let Some(ms) = masses.as_deref_mut() {
            // SAFETY: as above, for the masses' buffer.
            unsafe {
                let w = _mm512_loadu_ps(weights.as_ptr().add(c));
                _mm512_storeu_ps(ms.as_mut_ptr().add(mlen), _mm512_maskz_compress_ps(m, w));
            }
            mlen += m.count_ones() as usize;
        }
        len += m.count_ones() as usize;
    }
    // SAFETY: the first `len` (`mlen`) entries are initialised: the old ones
    // and the kept ones written above, contiguously.
    unsafe {
        out.set_len(len);
        if let Some(ms) = masses {
            ms.set_len(mlen);
        }
    }
    full
}

dispatch! { wide
    /// The entries of `row` at or above a running threshold that starts at
    /// `thr`, for a top-`k`: `edit` rewrites each batch of new entries'
    /// logits (it may only lower them), and whenever more than `cap` are
    /// gathered they are cut to the `k` best (and any tied with the k-th) and
    /// the threshold rises to the k-th. Every entry left out is below the
    /// final threshold; returns that threshold.
    pub fn gather_top / gather_top_avx2 / gather_top_generic(row: &[f32], thr: f32, k: usize, cap: usize, edit: &dyn Fn(&mut [Cand]), out: &mut Vec<Cand>) -> f32
}

#[inline(always)]
fn gather_top_generic<const FMA: bool, const WIDE: bool>(
    row: &[f32],
    thr: f32,
    k: usize,
    cap: usize,
    edit: &dyn Fn(&mut [Cand]),
    out: &mut Vec<Cand>,
) -> f32 {
    const SEGMENT: usize = 1024;
    let mut thr = if thr >= f32::MIN { thr } else { f32::MIN };
    for (si, seg) in row.chunks(SEGMENT).enumerate() {
        let base = si * SEGMENT;
        let start = out.len();
        let chunks = seg.chunks_exact(LANES);
        let tail_start = seg.len() - chunks.remainder().len();
        // Two chunks per test: one branch per 32 entries.
        let pairs = seg[..tail_start].chunks_exact(2 * LANES);
        let odd = pairs.remainder().len();
        for (pi, pair) in pairs.enumerate() {
            let pair: &[f32; 2 * LANES] = pair.try_into().unwrap_or(&[0.0; 2 * LANES]);
            let mut hit = 0u32;
            for &v in pair {
                hit |= (v >= thr) as u32;
            }
            if hit != 0 {
                let at = pi * 2 * LANES;
                push_hits::<WIDE>(&pair[..LANES], base + at, 1.0, thr, out);
                push_hits::<WIDE>(&pair[LANES..], base + at + LANES, 1.0, thr, out);
            }
        }
        if odd > 0 {
            let at = tail_start - odd;
            push_hits::<WIDE>(&seg[at..tail_start], base + at, 1.0, thr, out);
        }
        for (i, &v) in seg[tail_start..].iter().enumerate() {
            if v >= thr {
                out.push(Cand {
                    id: (base + tail_start + i) as u32,
                    logit: v,
                });
            }
        }
        edit(&mut out[start..]);
        if out.len() > cap.max(k) {
            out.select_nth_unstable_by(k - 1, by_rank);
            // Edits only lower logits: nothing left out can pass the k-th.
            thr = thr.max(out[k - 1].logit);
            out.retain(|c| c.logit >= thr);
        }
    }
    thr
}

dispatch! { wide
    /// [`gather_ge`] into two parallel arrays.
    pub fn gather_ge_into / gather_ge_into_avx2 / gather_ge_into_generic(row: &[f32], scale: f32, thr: f32, out: &mut Gathered) -> ()
}

#[inline(always)]
fn gather_ge_into_generic<const FMA: bool, const WIDE: bool>(
    row: &[f32],
    scale: f32,
    thr: f32,
    out: &mut Gathered,
) {
    let thr = if thr >= f32::MIN { thr } else { f32::MIN };
    for (bi, block) in row.chunks(BLOCK).enumerate() {
        let chunks = block.chunks_exact(LANES);
        let tail_start = block.len() - chunks.remainder().len();
        let mut hit_chunks = 0u64;
        for (ci, c) in chunks.enumerate() {
            let mut hit = 0u32;
            for &v in c {
                hit |= (v * scale >= thr) as u32;
            }
            hit_chunks |= ((hit != 0) as u64) << ci;
        }
        if hit_chunks != 0 {
            push_chunks::<WIDE>(block, bi * BLOCK, scale, thr, hit_chunks, out);
        }
        for (i, &v) in block[tail_start..].iter().enumerate() {
            let l = v * scale;
            if l >= thr {
                out.ids.push((bi * BLOCK + tail_start + i) as u32);
                out.logits.push(l);
            }
        }
    }
}

/// The `k` best-ranked entries of the row (or more, tied with the k-th, with
/// `keep_ties`), sorted by rank, with logits scaled.
///
/// One pass, block by block: entries at or above a running threshold are
/// gathered, and whenever the gathered set grows past a few times `k` it is
/// cut to its k best and the threshold rises to the k-th. The threshold starts
/// `delta` below the maximum; `delta` persists between calls as a hint (the
/// last row's width, with room to spare) and only affects speed, never the
/// result: a threshold too low costs a few cuts, one too high a second pass.
pub fn top_k(
    row: &[f32],
    scale: f32,
    max: f32,
    k: usize,
    keep_ties: bool,
    delta: &mut f32,
    out: &mut Vec<Cand>,
) {
    if !(delta.is_finite() && *delta > 0.0) {
        *delta = 8.0;
    }
    out.clear();
    if k.saturating_mul(4) >= row.len() {
        // Most of the row survives anyway: take every finite entry.
        gather_ge(row, 1.0, f32::MIN, out);
    } else {
        let cap = k.saturating_mul(4).max(256);
        gather_top(row, max - *delta, k, cap, &|_| {}, out);
        if out.len() < k {
            // The threshold started too high: again from the bottom.
            out.clear();
            gather_top(row, f32::MIN, k, cap, &|_| {}, out);
        }
    }
    top_k_sparse(out, k, keep_ties);
    // Next time start a little below this row's k-th (room for the next
    // row to be flatter; a lower start costs only cuts).
    if let Some(kth) = out.get(k - 1).or(out.last()) {
        let want = (max - kth.logit) + 2.0;
        *delta = if want.is_finite() { want.max(1.0) } else { 8.0 };
    }
    if scale != 1.0 {
        for c in out.iter_mut() {
            c.logit *= scale;
        }
        // Far below the maximum a scaled logit can round to -inf: mass 0.
        out.retain(|c| c.logit > f32::NEG_INFINITY);
        // Scaling can tie logits that ranked apart; a tie ranks by id.
        reorder_ties(out);
    }
    debug_assert!(out.windows(2).all(|w| by_rank(&w[0], &w[1]).is_le()));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Found by cargo-fuzz `sampler_chain`: the scaled top-k came back out of
    /// rank order when scaling tied two logits that ranked apart.
    #[test]
    fn top_k_ranks_ties_made_by_scaling_by_id() {
        let mut row = vec![0.0f32; 64];
        row[3] = 1.0;
        row[7] = f32::from_bits(1.0f32.to_bits() + 1); // the next float up
        let scale = 1e-39; // both round to one subnormal
        assert_eq!(row[3] * scale, row[7] * scale);
        assert!(row[7] > row[3]);
        for keep_ties in [false, true] {
            let (mut out, mut delta) = (Vec::new(), 8.0);
            top_k(&row, scale, row[7], 2, keep_ties, &mut delta, &mut out);
            let ids: Vec<u32> = out.iter().map(|c| c.id).collect();
            assert_eq!(ids, [3, 7], "keep_ties {keep_ties}");
        }
    }

    #[test]
    fn reorder_ties_sorts_only_runs_of_equal_logits() {
        let c = |id, logit| Cand { id, logit };
        let mut v = vec![
            c(9, 3.0),
            c(5, 2.0),
            c(1, 2.0),
            c(4, -0.0),
            c(2, 0.0),
            c(0, -1.0),
        ];
        reorder_ties(&mut v);
        let ids: Vec<u32> = v.iter().map(|c| c.id).collect();
        assert_eq!(ids, [9, 1, 5, 2, 4, 0]);
        assert!(v.windows(2).all(|w| by_rank(&w[0], &w[1]).is_le()));
    }

    #[test]
    fn exp_neg_is_accurate_and_zero_for_banned() {
        let mut z = 0.0f32;
        while z > -86.5 {
            let want = (z as f64).exp();
            let got = exp_neg(z) as f64;
            let fused = exp_neg_impl::<true>(z) as f64;
            assert!(
                ((fused - want) / want).abs() < 4e-7,
                "z={z} fused={fused} want={want}"
            );
            assert!(
                ((got - want) / want).abs() < 4e-7,
                "z={z} got={got} want={want}"
            );
            z -= 0.0137;
        }
        assert_eq!(exp_neg(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_neg(-100.0), 0.0);
        assert_eq!(exp_neg(0.0), 1.0);
        // Between -87 and -86.5: the clamp's value, still a normal float.
        let edge = exp_neg(-86.9);
        assert!(edge.is_normal() && (edge as f64 - (-86.5f64).exp()).abs() < 1e-44);
        assert_eq!(exp_neg_term::<true>(f32::NEG_INFINITY), exp_neg(-86.5));
    }

    #[test]
    fn sum_like_exp_store_reproduces_its_total() {
        for n in [1usize, 15, 16, 1023, 1024, 1025, 5000] {
            let row: Vec<f32> = (0..n).map(|i| ((i * 7919) % 1000) as f32 / -37.0).collect();
            let mut out = Vec::new();
            let total = exp_store(&row, 0.0, 1.0, &mut out);
            assert_eq!(sum_like_exp_store(&out).to_bits(), total.to_bits(), "n {n}");
        }
    }

    #[test]
    fn sums_match_a_plain_loop() {
        let row: Vec<f32> = (0..5000)
            .map(|i| ((i * 7919) % 1000) as f32 / 37.0 - 20.0)
            .collect();
        let max = row.iter().cloned().fold(f32::MIN, f32::max);
        let want: f64 = row.iter().map(|&v| ((v - max) as f64 * 0.5).exp()).sum();
        let got = exp_sum(&row, max, 0.5);
        assert!(((got - want) / want).abs() < 1e-6);
        let mut buf = Vec::new();
        let got2 = exp_store(&row, max, 0.5, &mut buf);
        assert_eq!(got, got2);
        assert_eq!(buf.len(), row.len());
    }

    #[test]
    fn argmax_nan_finds_the_first_maximum() {
        for len in [1usize, 5, 16, 17, 33, 100, 1000] {
            for pos in [0, len / 3, len - 1] {
                let mut row: Vec<f32> = (0..len).map(|i| (i % 7) as f32).collect();
                row[pos] = 50.0;
                if pos + 1 < len {
                    row[len - 1] = 50.0;
                }
                assert_eq!(argmax_nan(&row), (pos, 50.0, false), "len {len} pos {pos}");
            }
        }
        let mut row = vec![f32::NEG_INFINITY; 40];
        assert_eq!(argmax_nan(&row).1, f32::NEG_INFINITY);
        row[39] = f32::NAN;
        assert!(argmax_nan(&row).2);
        row[3] = f32::INFINITY;
        assert_eq!(argmax_nan(&row), (3, f32::INFINITY, true));
    }

    #[test]
    fn copy_argmax_nan_copies_and_scans() {
        let mut state = 7u64;
        for len in [1usize, 63, 64, 65, 500, 5000] {
            let row: Vec<f32> = (0..len)
                .map(|_| {
                    state = state
                        .wrapping_mul(6_364_136_223_846_793_005)
                        .wrapping_add(1);
                    ((state >> 40) % 1000) as f32 / 50.0
                })
                .collect();
            let mut dst = Vec::new();
            assert_eq!(copy_argmax_nan(&row, &mut dst), argmax_nan(&row));
            assert_eq!(dst, row);
        }
    }

    /// The plain filter every gather must reproduce.
    fn plain_gather(row: &[f32], scale: f32, thr: f32) -> (Vec<u32>, Vec<f32>) {
        let thr = thr.max(f32::MIN);
        row.iter()
            .enumerate()
            .filter(|&(_, &v)| v * scale >= thr)
            .map(|(i, &v)| (i as u32, v * scale))
            .unzip()
    }

    #[test]
    fn every_build_of_keep_ge_matches_a_plain_filter() {
        for n in [0usize, 5, 16, 17, 100, 1000] {
            let ids: Vec<u32> = (0..n as u32).map(|i| i * 3 + 1).collect();
            let logits: Vec<f32> = (0..n).map(|i| ((i * 7919) % 13) as f32 - 6.0).collect();
            let weights: Vec<f32> = (0..n).map(|i| i as f32 / 7.0).collect();
            for tau in [-100.0f32, -2.0, 0.0, 6.0, 100.0] {
                let keep: Vec<usize> = (0..n).filter(|&i| logits[i] >= tau).collect();
                let want: Vec<Cand> = keep
                    .iter()
                    .map(|&i| Cand {
                        id: ids[i],
                        logit: logits[i],
                    })
                    .collect();
                let want_m: Vec<f32> = keep.iter().map(|&i| weights[i]).collect();
                let want_tau = logits.iter().filter(|&&l| l == tau).count();
                type Keep =
                    fn(&[u32], &[f32], &[f32], f32, &mut Vec<Cand>, Option<&mut Vec<f32>>) -> usize;
                #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
                let mut builds: Vec<(&str, Keep)> =
                    vec![("portable", keep_ge_generic::<false, false>)];
                #[cfg(target_arch = "x86_64")]
                if std::arch::is_x86_feature_detected!("avx512f")
                    && std::arch::is_x86_feature_detected!("popcnt")
                    && std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma")
                {
                    // SAFETY: the CPU has every feature the build enables, checked above.
                    builds.push(("avx512", |a, b, c, d, e, f| unsafe {
                        keep_ge_avx2::avx512(a, b, c, d, e, f)
                    }));
                }
                for (name, keep_fn) in builds {
                    // Entries already in the buffers stay in front.
                    let (mut out, mut m) = (vec![Cand { id: 99, logit: 9.0 }], vec![9.0f32]);
                    let at = keep_fn(&ids, &logits, &weights, tau, &mut out, Some(&mut m));
                    assert_eq!(at, want_tau, "{name} n {n} tau {tau}");
                    assert_eq!(&out[1..], &want[..], "{name} n {n} tau {tau}");
                    assert_eq!(&m[1..], &want_m[..], "{name} n {n} tau {tau}");
                    let mut plain = Vec::new();
                    keep_fn(&ids, &logits, &weights, tau, &mut plain, None);
                    assert_eq!(plain, want, "{name} without masses");
                }
            }
        }
    }

    #[test]
    fn every_build_of_every_gather_matches_a_plain_filter() {
        let mut state = 11u64;
        for len in [1usize, 15, 16, 17, 1023, 1024, 1025, 3000, 20_000] {
            let row: Vec<f32> = (0..len)
                .map(|_| {
                    state = state
                        .wrapping_mul(6_364_136_223_846_793_005)
                        .wrapping_add(1);
                    match (state >> 33) % 97 {
                        0 => f32::NEG_INFINITY,
                        r => r as f32 / 8.0,
                    }
                })
                .collect();
            let (_, max, _) = argmax_nan(&row);
            // From no hits to every finite entry.
            for thr in [
                max * 0.5 + 1.0,
                max * 0.5 - 0.5,
                max * 0.5 - 3.0,
                0.0,
                f32::NEG_INFINITY,
            ] {
                let (ids, logits) = plain_gather(&row, 0.5, thr);
                let want_sum = exp_sum_generic::<false>(&row, max, 0.5);
                type Results = (f64, Gathered, Gathered, Vec<Cand>);
                let mut builds: Vec<(&str, Results)> = Vec::new();
                let run = |esg: &dyn Fn(&mut Gathered) -> f64,
                           gi: &dyn Fn(&mut Gathered),
                           gg: &dyn Fn(&mut Vec<Cand>)| {
                    let (mut a, mut b, mut c) =
                        (Gathered::default(), Gathered::default(), Vec::new());
                    // Something already in the buffers is kept in front.
                    a.ids.push(7);
                    a.logits.push(1.0);
                    let s = esg(&mut a);
                    gi(&mut b);
                    gg(&mut c);
                    assert_eq!((a.ids.remove(0), a.logits.remove(0)), (7, 1.0));
                    (s, a, b, c)
                };
                builds.push((
                    "portable",
                    run(
                        &|g| exp_sum_gather_generic::<false, false>(&row, max, 0.5, thr, g),
                        &|g| gather_ge_into_generic::<false, false>(&row, 0.5, thr, g),
                        &|g| gather_ge_generic::<false, false>(&row, 0.5, thr, g),
                    ),
                ));
                #[cfg(target_arch = "x86_64")]
                if std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma")
                {
                    // SAFETY: the CPU has AVX2 and FMA, checked just above.
                    builds.push((
                        "avx2",
                        run(
                            &|g| unsafe { exp_sum_gather_avx2::avx2(&row, max, 0.5, thr, g) },
                            &|g| unsafe { gather_ge_into_avx2::avx2(&row, 0.5, thr, g) },
                            &|g| unsafe { gather_ge_avx2::avx2(&row, 0.5, thr, g) },
                        ),
                    ));
                    if std::arch::is_x86_feature_detected!("avx512f")
                        && std::arch::is_x86_feature_detected!("popcnt")
                    {
                        // SAFETY: the CPU has AVX-512F, AVX2, FMA and POPCNT.
                        builds.push((
                            "avx512",
                            run(
                                &|g| unsafe { exp_sum_gather_avx2::avx512(&row, max, 0.5, thr, g) },
                                &|g| unsafe { gather_ge_into_avx2::avx512(&row, 0.5, thr, g) },
                                &|g| unsafe { gather_ge_avx2::avx512(&row, 0.5, thr, g) },
                            ),
                        ));
                    }
                }
                for (name, (sum, fused, into, aos)) in &builds {
                    let what = format!("{name}: len {len} thr {thr}");
                    assert_eq!(
                        (&fused.ids, &fused.logits),
                        (&ids, &logits),
                        "exp_sum_gather {what}"
                    );
                    assert_eq!(
                        (&into.ids, &into.logits),
                        (&ids, &logits),
                        "gather_ge_into {what}"
                    );
                    let aos_ids: Vec<u32> = aos.iter().map(|c| c.id).collect();
                    let aos_logits: Vec<f32> = aos.iter().map(|c| c.logit).collect();
                    assert_eq!((&aos_ids, &aos_logits), (&ids, &logits), "gather_ge {what}");
                    assert!(((sum - want_sum) / want_sum).abs() < 1e-6, "sum {what}");
                }
            }
        }
    }

    #[test]
    fn top_k_matches_a_sort_whatever_the_starting_width() {
        let mut state = 17u64;
        for case in 0..60 {
            let n = 200 + case * 613;
            let row: Vec<f32> = (0..n)
                .map(|_| {
                    state = state
                        .wrapping_mul(6_364_136_223_846_793_005)
                        .wrapping_add(1);
                    match (state >> 33) % 50 {
                        0 => f32::NEG_INFINITY,
                        r => ((state >> 40) % 2048) as f32 / (8.0 + r as f32),
                    }
                })
                .collect();
            let (_, max, _) = argmax_nan(&row);
            for k in [1usize, 7, 40, 333] {
                for keep_ties in [false, true] {
                    let mut sorted: Vec<Cand> = row
                        .iter()
                        .enumerate()
                        .filter(|(_, v)| v.is_finite())
                        .map(|(i, &v)| Cand {
                            id: i as u32,
                            logit: v,
                        })
                        .collect();
                    sorted.sort_unstable_by(by_rank);
                    let mut want: Vec<Cand> = sorted.iter().take(k).copied().collect();
                    if keep_ties && sorted.len() > k {
                        let kth = sorted[k - 1].logit;
                        want.extend(sorted[k..].iter().take_while(|c| c.logit == kth));
                    }
                    for start in [0.01f32, 1.0, 8.0, 1e9] {
                        let (mut delta, mut out) = (start, Vec::new());
                        top_k(&row, 1.0, max, k, keep_ties, &mut delta, &mut out);
                        assert_eq!(
                            out, want,
                            "case {case} k {k} ties {keep_ties} start {start}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn top_k_widens_until_it_has_k() {
        let row: Vec<f32> = (0..3000).map(|i| -(i as f32) * 3.0).collect();
        let mut delta = 0.5;
        let mut out = Vec::new();
        top_k(&row, 1.0, 0.0, 10, false, &mut delta, &mut out);
        let ids: Vec<u32> = out.iter().map(|c| c.id).collect();
        assert_eq!(ids, (0..10).collect::<Vec<u32>>());
    }
}
