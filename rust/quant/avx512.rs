//! The AVX-512 build's kernels for the 32-value-block formats (Q8_0, Q4_0,
//! Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4) and for Q3_K, Q4_K, Q5_K and IQ4_XS (their
//! 256-value blocks decoded 64 values at a time, [`Steps`]): sixteen float
//! lanes, in **this build's own order**, shared by its one-row kernel
//! ([`rows`]) and its batched tiles ([`weights_tile`], [`blocks_tile`],
//! called from `multirow`). Every other format (Q2_K, Q6_K) runs the AVX2
//! kernels (and so the AVX2 order) under this build too; the order is per
//! format and per build, the same on every path of both. (Q6_K decoded
//! here, its six-bit codes made as bytes 64 at a time, then widened and
//! converted, was 1.3x faster for eight activation rows but 1.03-1.08x
//! slower for one than the AVX2 kernel, so it stays there.)
//!
//! **Order (16 lanes).** Each block's weights `scale * code` (exact in
//! float32: an 11-bit significand times a code of at most 8 bits), values
//! 0..16 and 16..32 in two sixteen-lane accumulators, block by block in
//! column order: `lo = fma(w[0..16], x[0..16], lo)`, `hi = fma(w[16..32],
//! x[16..32], hi)`; `off += offset_g * X_g` in block order (formats with
//! offsets); finally [`hsum16`]`(lo + hi) - off`. A value is rounded at
//! most `K/32 + 1 + 4 + 1` times (its chain, the two chains' sum, four
//! levels of the lanes' sum, the offset), within the kernels' tested bound
//! of `K/8 + 5` (see `tests::bound`). The batched tiles decode a band's
//! weights once into floats and then spend two FMAs per 32 weights and
//! activation row; the order before this one (a fresh dot of the codes,
//! then one FMA with the scale) spent three, which bounded them (Zen 4:
//! one 512-bit FMA a cycle). The one-row kernel scales its code table
//! once a block (`table * d`, sixteen lanes), so it does no more work.
//!
//! **Why.** Codes become floats in one table look-up: `vpermps` with a
//! sixteen-entry float table reads only the low four bits of each index,
//! so a low nibble is one `vpermps` of the zero-extended byte, a high
//! nibble a shift and one `vpermps` (the table holds `code - bias`, or
//! IQ4_NL's or MXFP4's code book, times the block's scale); Q5's fifth bits are a
//! masked add of `16 * d`, the mask
//! read straight from the block. Against the AVX2 kernel's eight lanes
//! (mask, bias, sign extension, conversion, four-deep chains) the
//! one-row Q4_0 product is about 1.2-1.3x faster on Zen 4 (measured,
//! docs/kernels.md); keeping the AVX2 order with the same decoding gained
//! only 1.05x. Q8_0 gains nothing in registers, but one row at a time
//! (which its shorter sixteen-lane chains allow) reads its weights from
//! memory 1.6-1.8x faster than the AVX2 kernel's passes of eight.
//!
//! Requires AVX-512 F, BW, VL, with AVX2, FMA and F16C (`mod.rs` checks).

use super::format::QuantType;
use super::kernel::Job;
use super::simd::{Avx2, Lanes};
use std::arch::x86_64::*;

/// Whether this build takes `qtype` (its own order) rather than the AVX2
/// kernels.
pub(crate) fn covers(qtype: QuantType) -> bool {
    matches!(
        qtype,
        QuantType::Q8_0
            | QuantType::Q4_0
            | QuantType::Q4_1
            | QuantType::Q5_0
            | QuantType::Q5_1
            | QuantType::IQ4NL
            | QuantType::MXFP4
            | QuantType::Q3K
            | QuantType::Q4K
            | QuantType::Q5K
            | QuantType::IQ4XS
    )
}

/// The sum of the sixteen lanes: `v[i] + v[i + 8]`, then the AVX2 build's
/// eight-lane sum (`Lanes::hsum`). Every path of this build ends so.
#[inline(always)]
pub(crate) unsafe fn hsum16(v: __m512) -> f32 {
    // SAFETY: AVX-512 F present (caller).
    unsafe {
        // The upper eight lanes through AVX-512 F's 64-bit extract (the
        // same bits): `_mm512_extractf32x8_ps` needs AVX-512 DQ, which this
        // build does not enable, so it compiled to an out-of-line call that
        // spilled every accumulator of a tile around each sum.
        let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
        let h = _mm256_add_ps(_mm512_castps512_ps256(v), hi);
        Avx2::hsum(h)
    }
}

/// A 32-value block format: its codes as two sixteen-lane float chunks,
/// its scale and offset, as `unpack.rs` gives them.
trait Block {
    const BYTES: usize;
    /// Whether blocks have an offset (`weight = scale * code - offset`).
    const OFFSET: bool = false;
    /// Values 0..16 and 16..32 of the block at `b`, as floats.
    ///
    /// # Safety
    /// AVX-512 F/VL/BW present; `BYTES` readable bytes at `b`.
    unsafe fn chunks(b: *const u8) -> [__m512; 2];
    /// Values 0..16 and 16..32 of the block at `b` as weights, `scale *
    /// code` (exact in float32: an 11-bit significand times a code of at
    /// most 8 bits).
    ///
    /// # Safety
    /// As [`Block::chunks`].
    #[inline(always)]
    unsafe fn weights(b: *const u8) -> [__m512; 2] {
        // SAFETY: forwarded.
        unsafe {
            let d = splat_half(b);
            let [q0, q1] = Self::chunks(b);
            [_mm512_mul_ps(q0, d), _mm512_mul_ps(q1, d)]
        }
    }
    /// # Safety
    /// As [`Block::chunks`].
    #[inline(always)]
    unsafe fn offset(_: *const u8) -> f32 {
        0.0
    }
}

/// The float16 at `p`, exactly (F16C).
///
/// Through [`whole_xmm`](crate::quant::simd::whole_xmm): built from the
/// two bytes (or an eight-byte load LLVM narrowed to them), the value was
/// inserted (`vpinsrw`) into whatever register was free, once a row's
/// accumulator, so every block's scale waited on the block before.
#[inline(always)]
unsafe fn half(p: *const u8) -> f32 {
    // SAFETY: 2 readable bytes at p; AVX and F16C present (caller).
    unsafe {
        let h = p.cast::<u16>().read_unaligned();
        _mm_cvtss_f32(_mm_cvtph_ps(crate::quant::simd::whole_xmm(h)))
    }
}

/// The float16 at `p` in all sixteen lanes, exactly: broadcast from
/// `unpack.rs`'s table of every float16 (the same float as F16C gives).
/// Converting it in registers (`vpbroadcastw` + `vcvtph2ps`, a whole
/// register written so no block waits on the one before) cost the one-row
/// kernels about a quarter of their time against MXFP4's table lookup.
#[inline(always)]
unsafe fn splat_half(p: *const u8) -> __m512 {
    // SAFETY: 2 readable bytes at p; AVX-512 F present (caller).
    unsafe {
        let h = p.cast::<u16>().read_unaligned();
        _mm512_set1_ps(*super::unpack::F16_TABLE.get_unchecked(usize::from(h)))
    }
}

/// MXFP4's scale `2^(e - 128)` of the E8M0 byte at `p` in all sixteen
/// lanes: broadcast from `unpack.rs`'s table (the same float).
#[inline(always)]
unsafe fn splat_e8m0(p: *const u8) -> __m512 {
    // SAFETY: 1 readable byte at p; AVX-512 F present (caller).
    unsafe { _mm512_set1_ps(super::unpack::E8M0_HALF[usize::from(*p)]) }
}

/// `code - bias` for the sixteen nibble values.
const fn biased(bias: i32) -> [f32; 16] {
    let mut t = [0.0f32; 16];
    let mut i = 0;
    while i < 16 {
        t[i] = (i as i32 - bias) as f32;
        i += 1;
    }
    t
}

/// A code book (IQ4_NL's, MXFP4's) as floats.
const fn book(values: &[i8; 16]) -> [f32; 16] {
    let mut t = [0.0f32; 16];
    let mut i = 0;
    while i < 16 {
        t[i] = values[i] as f32;
        i += 1;
    }
    t
}

static MINUS_8: [f32; 16] = biased(8);
static MINUS_16: [f32; 16] = biased(16);
static PLAIN: [f32; 16] = biased(0);
static IQ4: [f32; 16] = book(&super::unpack::IQ4_VALUES);
static MXFP4: [f32; 16] = book(&super::unpack::MXFP4_VALUES);
/// `code - 4` for the eight Q3_K codes, twice (an index's bit 3 is not read).
static MINUS_4_TWICE: [f32; 16] = {
    let mut t = [0.0f32; 16];
    let mut i = 0;
    while i < 16 {
        t[i] = ((i % 8) as i32 - 4) as f32;
        i += 1;
    }
    t
};

/// The 16 bytes of nibbles at `qs` through the table `t`: values 0..16
/// (the low nibbles), then 16..32 (the high ones).
#[inline(always)]
unsafe fn nibbles(qs: *const u8, t: &[f32; 16]) -> [__m512; 2] {
    // SAFETY: 16 readable bytes at qs (caller); AVX-512 F present (caller).
    unsafe {
        let t = _mm512_loadu_ps(t.as_ptr());
        let i = _mm512_cvtepu8_epi32(_mm_loadu_si128(qs.cast()));
        // `vpermps` reads the low four bits of each index only.
        [
            _mm512_permutexvar_ps(i, t),
            _mm512_permutexvar_ps(_mm512_srli_epi32::<4>(i), t),
        ]
    }
}

/// [`nibbles`] through the table times `d` (exact, see [`Block::weights`]).
#[inline(always)]
unsafe fn nibbles_times(qs: *const u8, t: &[f32; 16], d: __m512) -> [__m512; 2] {
    // SAFETY: 16 readable bytes at qs (caller); AVX-512 F present (caller).
    unsafe {
        let t = _mm512_mul_ps(_mm512_loadu_ps(t.as_ptr()), d);
        let i = _mm512_cvtepu8_epi32(_mm_loadu_si128(qs.cast()));
        [
            _mm512_permutexvar_ps(i, t),
            _mm512_permutexvar_ps(_mm512_srli_epi32::<4>(i), t),
        ]
    }
}

/// [`fifth`] times `d`: the scaled nibbles plus `16 * d` where the fifth
/// bit is set (exact: `(code - 16) * d + 16 * d` is `code * d`, a float).
#[inline(always)]
unsafe fn fifth_times(qh: *const u8, qs: *const u8, t: &[f32; 16], d: __m512) -> [__m512; 2] {
    // SAFETY: 4 readable bytes at qh and 16 at qs (caller).
    unsafe {
        let [l, h] = nibbles_times(qs, t, d);
        let bits = qh.cast::<u32>().read_unaligned();
        let sixteen = _mm512_mul_ps(_mm512_set1_ps(16.0), d);
        [
            _mm512_mask_add_ps(l, bits as u16, l, sixteen),
            _mm512_mask_add_ps(h, (bits >> 16) as u16, h, sixteen),
        ]
    }
}

/// [`nibbles`] plus 16 where the fifth bit (bit `j` of the u32 at `qh`
/// for value `j`) is set.
#[inline(always)]
unsafe fn fifth(qh: *const u8, qs: *const u8, t: &[f32; 16]) -> [__m512; 2] {
    // SAFETY: 4 readable bytes at qh and 16 at qs (caller).
    unsafe {
        let [l, h] = nibbles(qs, t);
        let bits = qh.cast::<u32>().read_unaligned();
        let sixteen = _mm512_set1_ps(16.0);
        [
            _mm512_mask_add_ps(l, bits as u16, l, sixteen),
            _mm512_mask_add_ps(h, (bits >> 16) as u16, h, sixteen),
        ]
    }
}

struct Q4_0;
impl Block for Q4_0 {
    const BYTES: usize = 18;
    #[inline(always)]
    unsafe fn chunks(b: *const u8) -> [__m512; 2] {
        // SAFETY: forwarded; nibbles after `d`.
        unsafe { nibbles(b.add(2), &MINUS_8) }
    }
    #[inline(always)]
    unsafe fn weights(b: *const u8) -> [__m512; 2] {
        // SAFETY: forwarded.
        unsafe { nibbles_times(b.add(2), &MINUS_8, splat_half(b)) }
    }
}

struct Q4_1;
impl Block for Q4_1 {
    const BYTES: usize = 20;
    const OFFSET: bool = true;
    #[inline(always)]
    unsafe fn chunks(b: *const u8) -> [__m512; 2] {
        // SAFETY: forwarded; nibbles after `d`, `m`.
        unsafe { nibbles(b.add(4), &PLAIN) }
    }
    #[inline(always)]
    unsafe fn weights(b: *const u8) -> [__m512; 2] {
        // SAFETY: forwarded.
        unsafe { nibbles_times(b.add(4), &PLAIN, splat_half(b)) }
    }
    #[inline(always)]
    unsafe fn offset(b: *const u8) -> f32 {
        // SAFETY: forwarded; gguf adds `m`, we subtract `-m`.
        -unsafe { half(b.add(2)) }
    }
}

struct Q5_0;
impl Block for Q5_0 {
    const BYTES: usize = 22;
    #[inline(always)]
    unsafe fn chunks(b: *const u8) -> [__m512; 2] {
        // SAFETY: forwarded; `d`, qh, nibbles.
        unsafe { fifth(b.add(2), b.add(6), &MINUS_16) }
    }
    #[inline(always)]
    unsafe fn weights(b: *const u8) -> [__m512; 2] {
        // SAFETY: forwarded.
        unsafe { fifth_times(b.add(2), b.add(6), &MINUS_16, splat_half(b)) }
    }
}

struct Q5_1;
impl Block for Q5_1 {
    const BYTES: usize = 24;
    const OFFSET: bool = true;
    #[inline(always)]
    unsafe fn chunks(b: *const u8) -> [__m512; 2] {
        // SAFETY: forwarded; `d`, `m`, qh, nibbles.
        unsafe { fifth(b.add(4), b.add(8), &PLAIN) }
    }
    #[inline(always)]
    unsafe fn weights(b: *const u8) -> [__m512; 2] {
        // SAFETY: forwarded.
        unsafe { fifth_times(b.add(4), b.add(8), &PLAIN, splat_half(b)) }
    }
    #[inline(always)]
    unsafe fn offset(b: *const u8) -> f32 {
        // SAFETY: forwarded.
        -unsafe { half(b.add(2)) }
    }
}

struct Q8_0;
impl Block for Q8_0 {
    const BYTES: usize = 34;
    #[inline(always)]
    unsafe fn chunks(b: *const u8) -> [__m512; 2] {
        // SAFETY: forwarded; 32 int8 codes after `d`.
        unsafe {
            [
                _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(b.add(2).cast()))),
                _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(b.add(18).cast()))),
            ]
        }
    }
}

struct Iq4Nl;
impl Block for Iq4Nl {
    const BYTES: usize = 18;
    #[inline(always)]
    unsafe fn chunks(b: *const u8) -> [__m512; 2] {
        // SAFETY: forwarded; nibbles after `d` index the code book.
        unsafe { nibbles(b.add(2), &IQ4) }
    }
    #[inline(always)]
    unsafe fn weights(b: *const u8) -> [__m512; 2] {
        // SAFETY: forwarded.
        unsafe { nibbles_times(b.add(2), &IQ4, splat_half(b)) }
    }
}

/// IQ4_NL's layout with MXFP4's book, the scale an E8M0 byte first
/// (weights `2^(e-128) * code`: exact in float32 unless beyond its range).
struct Mxfp4;
impl Block for Mxfp4 {
    const BYTES: usize = 17;
    #[inline(always)]
    unsafe fn chunks(b: *const u8) -> [__m512; 2] {
        // SAFETY: forwarded; nibbles after `e` index the code book.
        unsafe { nibbles(b.add(1), &MXFP4) }
    }
    #[inline(always)]
    unsafe fn weights(b: *const u8) -> [__m512; 2] {
        // SAFETY: forwarded.
        unsafe { nibbles_times(b.add(1), &MXFP4, splat_e8m0(b)) }
    }
}

/// Rows `lo..hi` of `job` (one activation row, a format [`covers`] takes)
/// into `out[lo..hi]`: each block's codes decoded into registers where
/// they lie, passes of four rows (four accumulator chains in flight; Q8_0
/// one row, see below).
///
/// # Safety
/// AVX-512 F/BW/VL, AVX2, FMA and F16C present; `job.n == 1`; `out` holds
/// `job.rows` floats and nobody else writes `out[lo..hi]` meanwhile.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
pub(crate) unsafe fn rows(job: &Job<'_>, lo: usize, hi: usize, out: *mut f32) {
    // SAFETY: forwarded.
    unsafe {
        match job.qtype {
            // Q8_0 one row at a time: its weights come from memory at about
            // 1.8x the rate of passes of 2-8 rows (hot 0.86-0.9x; measured).
            QuantType::Q8_0 => go::<Q8_0, 1, 8>(job, lo, hi, out),
            QuantType::Q4_0 => go::<Q4_0, 4, 8>(job, lo, hi, out),
            QuantType::Q4_1 => go::<Q4_1, 4, 8>(job, lo, hi, out),
            QuantType::Q5_0 => go::<Q5_0, 4, 8>(job, lo, hi, out),
            QuantType::Q5_1 => go::<Q5_1, 4, 8>(job, lo, hi, out),
            QuantType::IQ4NL => go::<Iq4Nl, 4, 8>(job, lo, hi, out),
            QuantType::MXFP4 => go::<Mxfp4, 4, 8>(job, lo, hi, out),
            QuantType::Q4K => steps::<Q4k, 4, 4>(job, lo, hi, out),
            QuantType::IQ4XS => steps::<Iq4Xs, 4, 4>(job, lo, hi, out),
            QuantType::Q3K => steps::<Q3k, 4, 4>(job, lo, hi, out),
            QuantType::Q5K => steps::<Q5k, 4, 4>(job, lo, hi, out),
            other => unreachable!("{} has no AVX-512 kernel", other.name()),
        }
    }
}

/// Rows `lo..hi` in passes of `WIDE` rows (8, 4, 2 or 1; then narrower
/// passes for the rest), each block prefetched `AHEAD` rows ahead. A pass
/// keeps `WIDE` accumulator chains in flight; a row's bits do not depend on
/// the pass it falls in.
#[inline(always)]
unsafe fn go<L: Block, const WIDE: usize, const AHEAD: usize>(
    job: &Job<'_>,
    lo: usize,
    hi: usize,
    out: *mut f32,
) {
    let blocks = job.cols / 32;
    let rb = job.row_bytes;
    let (x, xsum) = (job.x.as_ptr(), job.xsum.as_ptr());
    let mut r = lo;
    // SAFETY (whole body): rows lo..hi of `raw` hold `blocks` blocks of
    // L::BYTES; `x` one row of `cols` floats and `xsum` (offsets only) one
    // sum per block; `out[lo..hi]` is ours (caller).
    unsafe {
        macro_rules! tile {
            ($rt:literal) => {{
                let base = job.raw.as_ptr().add(r * rb);
                // Values 0..16 and 16..32 of every block: two chains.
                let mut acc = [_mm512_setzero_ps(); $rt];
                let mut acc2 = [_mm512_setzero_ps(); $rt];
                let mut off = [0.0f32; $rt];
                for c in 0..blocks {
                    let (x0, x1) = (
                        _mm512_loadu_ps(x.add(c * 32)),
                        _mm512_loadu_ps(x.add(c * 32 + 16)),
                    );
                    for i in 0..$rt {
                        let b = base.add(i * rb + c * L::BYTES);
                        // A decode step's weights come from memory.
                        _mm_prefetch::<_MM_HINT_T0>(b.wrapping_add(AHEAD * rb).cast());
                        let [w0, w1] = L::weights(b);
                        acc[i] = _mm512_fmadd_ps(w0, x0, acc[i]);
                        acc2[i] = _mm512_fmadd_ps(w1, x1, acc2[i]);
                        if L::OFFSET {
                            off[i] += L::offset(b) * *xsum.add(c);
                        }
                    }
                }
                for i in 0..$rt {
                    *out.add(r + i) = hsum16(_mm512_add_ps(acc[i], acc2[i])) - off[i];
                }
                r += $rt;
            }};
        }
        while WIDE == 8 && hi - r >= 8 {
            tile!(8);
        }
        while WIDE >= 4 && hi - r >= 4 {
            tile!(4);
        }
        while WIDE >= 2 && hi - r >= 2 {
            tile!(2);
        }
        while r < hi {
            tile!(1);
        }
    }
}

/// A 256-value super-block format of this build (Q3_K, Q4_K, IQ4_XS): its
/// scales first ([`Steps::prep`]: the eight or sixteen group scales, the
/// eight group offsets), then its weights `scale_g * code` 64 values at a
/// time, sixteen a register, values in order ([`Steps::step`]), with the
/// scales `unpack.rs` gives them (the same floats, so the tiles' weights
/// match). The one-row kernel ([`steps`]) runs every row of a pass through
/// the same step, so the step's four activation registers are loaded once
/// a pass and a row's decoding never waits on registers: against decoding
/// a row's whole super-block into sixteen registers (spilled, with the
/// sixteen activation registers of the block, in passes of four rows) Q4_K
/// one row 1.3-1.5x faster.
trait Steps {
    const BYTES: usize;
    const OFFSET: bool;
    /// What a super-block's steps share: its group scales, and whatever
    /// else is decoded once a super-block.
    type Prep: Copy;
    /// The super-block's [`Steps::Prep`], and its offsets.
    ///
    /// # Safety
    /// AVX-512 F/BW/VL and F16C present; `BYTES` readable bytes at `b`.
    unsafe fn prep(b: *const u8, off: &mut [f32; 8]) -> Self::Prep;
    /// Values `64 s .. 64 s + 64` as weights, sixteen a register.
    ///
    /// # Safety
    /// As [`Steps::prep`]; `s < 4`; `prep` what [`Steps::prep`] gave for `b`.
    unsafe fn step(b: *const u8, prep: &Self::Prep, s: usize) -> [__m512; 4];
}

/// Q4_K's and Q5_K's eight scales (`d * sc_j`) and offsets (`dmin * m_j`),
/// as `unpack.rs` computes them, of a `BB`-byte block.
///
/// # Safety
/// `BB` readable bytes at `b`.
#[inline(always)]
unsafe fn k_prep<const BB: usize>(b: *const u8, off: &mut [f32; 8]) -> [f32; 8] {
    let mut scale = [0.0f32; 8];
    // SAFETY: forwarded; a whole block at b.
    super::unpack::k4_scales::<Avx2, BB>(unsafe { &*b.cast::<[u8; BB]>() }, &mut scale, off);
    scale
}

/// Step `s` of Q4_K's nibbles at `qs` (Q5_K's too): values `64s .. 64s +
/// 32` are the low nibbles of `qs[32s ..]`, the next 32 the high ones,
/// through the code table times `d0` and `d1`; `vpermps` reads the low four
/// bits of each index, so the low nibbles need no mask.
///
/// # Safety
/// AVX-512 F present; 32 readable bytes at `qs + 32 s`.
#[inline(always)]
unsafe fn k_nibbles(qs: *const u8, s: usize, d0: __m512, d1: __m512) -> [__m512; 4] {
    // SAFETY: forwarded.
    unsafe {
        let t = _mm512_loadu_ps(PLAIN.as_ptr());
        let qs = qs.add(32 * s);
        let (t0, t1) = (_mm512_mul_ps(t, d0), _mm512_mul_ps(t, d1));
        let ia = _mm512_cvtepu8_epi32(_mm_loadu_si128(qs.cast()));
        let ib = _mm512_cvtepu8_epi32(_mm_loadu_si128(qs.add(16).cast()));
        [
            _mm512_permutexvar_ps(ia, t0),
            _mm512_permutexvar_ps(ib, t0),
            _mm512_permutexvar_ps(_mm512_srli_epi32::<4>(ia), t1),
            _mm512_permutexvar_ps(_mm512_srli_epi32::<4>(ib), t1),
        ]
    }
}

/// Q4_K: [`k_nibbles`] at 16.
struct Q4k;
impl Steps for Q4k {
    const BYTES: usize = 144;
    const OFFSET: bool = true;
    type Prep = [f32; 8];
    #[inline(always)]
    unsafe fn prep(b: *const u8, off: &mut [f32; 8]) -> [f32; 8] {
        // SAFETY: forwarded.
        unsafe { k_prep::<144>(b, off) }
    }
    #[inline(always)]
    unsafe fn step(b: *const u8, scale: &[f32; 8], s: usize) -> [__m512; 4] {
        // SAFETY: forwarded; nibbles at 16.
        unsafe {
            let d = (scale[2 * s], scale[2 * s + 1]);
            k_nibbles(b.add(16), s, _mm512_set1_ps(d.0), _mm512_set1_ps(d.1))
        }
    }
}

/// Q5_K: [`k_nibbles`] at 48 plus sixteen where the fifth bit is set: bit
/// `2s` of `qh[l]` for value `64s + l`, bit `2s + 1` for `64s + 32 + l`
/// (exact: `scale * nibble + 16 * scale` is `scale * code`, a float).
struct Q5k;
impl Steps for Q5k {
    const BYTES: usize = 176;
    const OFFSET: bool = true;
    type Prep = [f32; 8];
    #[inline(always)]
    unsafe fn prep(b: *const u8, off: &mut [f32; 8]) -> [f32; 8] {
        // SAFETY: forwarded.
        unsafe { k_prep::<176>(b, off) }
    }
    #[inline(always)]
    unsafe fn step(b: *const u8, scale: &[f32; 8], s: usize) -> [__m512; 4] {
        // SAFETY: qh at 16, nibbles at 48; AVX-512 present (caller).
        unsafe {
            let (d0, d1) = (
                _mm512_set1_ps(scale[2 * s]),
                _mm512_set1_ps(scale[2 * s + 1]),
            );
            let w = k_nibbles(b.add(48), s, d0, d1);
            let qh = _mm256_loadu_si256(b.add(16).cast());
            let lo = _mm256_test_epi8_mask(qh, _mm256_set1_epi8(1 << (2 * s)));
            let hi = _mm256_test_epi8_mask(qh, _mm256_set1_epi8((1u8 << (2 * s + 1)) as i8));
            let sixteen = _mm512_set1_ps(16.0);
            let (s0, s1) = (_mm512_mul_ps(sixteen, d0), _mm512_mul_ps(sixteen, d1));
            [
                _mm512_mask_add_ps(w[0], lo as u16, w[0], s0),
                _mm512_mask_add_ps(w[1], (lo >> 16) as u16, w[1], s0),
                _mm512_mask_add_ps(w[2], hi as u16, w[2], s1),
                _mm512_mask_add_ps(w[3], (hi >> 16) as u16, w[3], s1),
            ]
        }
    }
}

/// Q3_K: value `v = 128h + 32i + l` is bits `2i..2i + 2` of `qs[32h + l]`
/// plus four times bit `4h + i` of `hmask[l]`, minus 4; groups of 16, scale
/// `d * (sc_g - 32)` as `unpack.rs` computes it (exact in float32: 11 + 6 +
/// 3 bits). Each register is one group: the bit pair and the high bit
/// merged by one bit select into an index whose bit 3 is left over, so the
/// table holds the eight weights twice.
struct Q3k;

/// A Q3_K super-block's scales, and its high bits and bit pairs widened
/// once (a step of 64 values needs both halves of `hmask` and a half of
/// `qs`: widened per step, Q3_K's one row was 1.05x slower than decoding
/// the super-block whole).
#[derive(Clone, Copy)]
struct Q3Prep {
    scales: [f32; 16],
    hm: [__m512i; 2],
    qs: [__m512i; 4],
}

impl Steps for Q3k {
    const BYTES: usize = 110;
    const OFFSET: bool = false;
    type Prep = Q3Prep;
    #[inline(always)]
    unsafe fn prep(b: *const u8, _: &mut [f32; 8]) -> Q3Prep {
        // SAFETY: forwarded; scales at 96, `d` at 108.
        unsafe {
            // The sixteen scales in sixteen lanes: bytes 94-109 (the block's
            // last sixteen) widened, lane g's low nibble from scale byte g % 8
            // (its high nibble for g >= 8), its top bits from byte 8 + g % 4.
            let e = _mm512_cvtepu8_epi32(_mm_loadu_si128(b.add(94).cast()));
            macro_rules! pick {
                ($($i:expr),*) => {
                    _mm512_permutexvar_epi32(_mm512_setr_epi32($($i),*), e)
                };
            }
            let low = _mm512_and_si512(
                _mm512_srlv_epi32(
                    pick!(2, 3, 4, 5, 6, 7, 8, 9, 2, 3, 4, 5, 6, 7, 8, 9),
                    _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 4, 4, 4, 4, 4, 4, 4, 4),
                ),
                _mm512_set1_epi32(15),
            );
            let high = _mm512_and_si512(
                _mm512_srlv_epi32(
                    pick!(10, 11, 12, 13, 10, 11, 12, 13, 10, 11, 12, 13, 10, 11, 12, 13),
                    _mm512_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2, 4, 4, 4, 4, 6, 6, 6, 6),
                ),
                _mm512_set1_epi32(3),
            );
            let sc = _mm512_sub_epi32(
                _mm512_or_si512(low, _mm512_slli_epi32::<4>(high)),
                _mm512_set1_epi32(32),
            );
            let mut scales = [0.0f32; 16];
            _mm512_storeu_ps(
                scales.as_mut_ptr(),
                _mm512_mul_ps(_mm512_set1_ps(half(b.add(108))), _mm512_cvtepi32_ps(sc)),
            );
            let wide = |at: usize| _mm512_cvtepu8_epi32(_mm_loadu_si128(b.add(at).cast()));
            Q3Prep {
                scales,
                hm: [wide(0), wide(16)],
                qs: [wide(32), wide(48), wide(64), wide(80)],
            }
        }
    }
    #[inline(always)]
    unsafe fn step(_: *const u8, prep: &Q3Prep, s: usize) -> [__m512; 4] {
        // SAFETY: AVX-512 present (caller).
        unsafe {
            let t = _mm512_loadu_ps(MINUS_4_TWICE.as_ptr());
            let h = s / 2;
            let (scales, hm) = (&prep.scales, &prep.hm);
            let qs = [prep.qs[2 * h], prep.qs[2 * h + 1]];
            let mut w = [_mm512_setzero_ps(); 4];
            for k in 0..2 {
                let i = 2 * (s % 2) + k;
                let bit = 4 * h + i;
                for half in 0..2 {
                    let g = 8 * h + 2 * i + half;
                    let q = _mm512_srl_epi32(qs[half], _mm_cvtsi32_si128(2 * i as i32));
                    let top = if bit <= 2 {
                        _mm512_sll_epi32(hm[half], _mm_cvtsi32_si128(2 - bit as i32))
                    } else {
                        _mm512_srl_epi32(hm[half], _mm_cvtsi32_si128(bit as i32 - 2))
                    };
                    // Bits 0-1 from the pair, the rest from `top`.
                    let idx = _mm512_ternarylogic_epi32::<0xe2>(q, _mm512_set1_epi32(3), top);
                    let tw = _mm512_mul_ps(t, _mm512_set1_ps(scales[g]));
                    w[2 * k + half] = _mm512_permutexvar_ps(idx, tw);
                }
            }
            w
        }
    }
}

/// IQ4_XS: eight blocks of 32, block `j`'s 16 bytes of nibbles at
/// `8 + 16 j` (low nibbles values 0-15, high ones 16-31) indexing IQ4_NL's
/// code book, times `d * (ls_j - 32)` as `unpack.rs` computes it.
struct Iq4Xs;
impl Steps for Iq4Xs {
    const BYTES: usize = 136;
    const OFFSET: bool = false;
    type Prep = [f32; 8];
    #[inline(always)]
    unsafe fn prep(b: *const u8, _: &mut [f32; 8]) -> [f32; 8] {
        // SAFETY: forwarded; `d`, `scales_h`, `scales_l` at 0, 2, 4.
        unsafe {
            let d = half(b);
            let scales_h = b.add(2).cast::<u16>().read_unaligned();
            let mut scale = [0.0f32; 8];
            for (j, s) in scale.iter_mut().enumerate() {
                let lo = (*b.add(4 + j / 2) >> (4 * (j % 2))) & 0x0f;
                let hi = ((scales_h >> (2 * j)) & 3) as u8;
                *s = d * ((lo | hi << 4) as i8 - 32) as f32;
            }
            scale
        }
    }
    #[inline(always)]
    unsafe fn step(b: *const u8, scale: &[f32; 8], s: usize) -> [__m512; 4] {
        // SAFETY: forwarded; blocks 2s and 2s + 1's nibbles at 8 + 32 s.
        unsafe {
            let book = _mm512_loadu_ps(IQ4.as_ptr());
            let mut w = [_mm512_setzero_ps(); 4];
            for k in 0..2 {
                let j = 2 * s + k;
                let t = _mm512_mul_ps(book, _mm512_set1_ps(scale[j]));
                let i = _mm512_cvtepu8_epi32(_mm_loadu_si128(b.add(8 + 16 * j).cast()));
                w[2 * k] = _mm512_permutexvar_ps(i, t);
                w[2 * k + 1] = _mm512_permutexvar_ps(_mm512_srli_epi32::<4>(i), t);
            }
            w
        }
    }
}

/// The one-row kernel of a [`Steps`] format in this build's order (as
/// [`go`]'s: two chains, values 0..16 and 16..32 of every block of 32, in
/// column order), passes of `WIDE` rows each taking one step of 64 values
/// of every row of the pass before the next; the offsets `off += offset_g *
/// X_g` group by group.
///
/// # Safety
/// As [`rows`].
#[inline(always)]
unsafe fn steps<S: Steps, const WIDE: usize, const AHEAD: usize>(
    job: &Job<'_>,
    lo: usize,
    hi: usize,
    out: *mut f32,
) {
    let supers = job.cols / 256;
    let rb = job.row_bytes;
    let (x, xsum) = (job.x.as_ptr(), job.xsum.as_ptr());
    let mut r = lo;
    // SAFETY (whole body): rows lo..hi of `raw` hold `supers` blocks of
    // S::BYTES; `x` one row of `cols` floats and `xsum` (offsets) one sum
    // per 32 values; `out[lo..hi]` is ours (caller).
    unsafe {
        macro_rules! tile {
            ($rt:literal) => {{
                let base = job.raw.as_ptr().add(r * rb);
                let mut acc = [_mm512_setzero_ps(); $rt];
                let mut acc2 = [_mm512_setzero_ps(); $rt];
                let mut off = [0.0f32; $rt];
                for c in 0..supers {
                    let xs = x.add(256 * c);
                    let mut o = [[0.0f32; 8]; $rt];
                    let prep: [S::Prep; $rt] = std::array::from_fn(|i| {
                        let p = base.add(i * rb + c * S::BYTES);
                        for l in 0..S::BYTES.div_ceil(64) {
                            _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(AHEAD * rb + 64 * l).cast());
                        }
                        S::prep(p, &mut o[i])
                    });
                    for s in 0..4 {
                        let xv: [__m512; 4] =
                            std::array::from_fn(|k| _mm512_loadu_ps(xs.add(64 * s + 16 * k)));
                        for i in 0..$rt {
                            let w = S::step(base.add(i * rb + c * S::BYTES), &prep[i], s);
                            acc[i] = _mm512_fmadd_ps(w[0], xv[0], acc[i]);
                            acc2[i] = _mm512_fmadd_ps(w[1], xv[1], acc2[i]);
                            acc[i] = _mm512_fmadd_ps(w[2], xv[2], acc[i]);
                            acc2[i] = _mm512_fmadd_ps(w[3], xv[3], acc2[i]);
                        }
                    }
                    if S::OFFSET {
                        for i in 0..$rt {
                            for g in 0..8 {
                                off[i] += o[i][g] * *xsum.add(8 * c + g);
                            }
                        }
                    }
                }
                for i in 0..$rt {
                    *out.add(r + i) = hsum16(_mm512_add_ps(acc[i], acc2[i])) - off[i];
                }
                r += $rt;
            }};
        }
        while WIDE >= 4 && hi - r >= 4 {
            tile!(4);
        }
        while WIDE >= 2 && hi - r >= 2 {
            tile!(2);
        }
        while r < hi {
            tile!(1);
        }
    }
}

/// One weight row of Q4_0, Q5_0 or IQ4_NL as its codes in float32, `cols` floats at `w`:
/// the same exact values the int8 unpacking gives, decoded as [`rows`]
/// decodes them, without the int8 scratch row in between.
///
/// # Safety
/// AVX-512 F/BW/VL, AVX2, FMA and F16C present; `raw` whole blocks of
/// `qtype`, `w` room for their values.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
pub(crate) unsafe fn weights_as_floats(qtype: QuantType, raw: &[u8], w: *mut f32) {
    #[inline(always)]
    unsafe fn each<L: Block>(raw: &[u8], w: *mut f32) {
        // SAFETY: whole blocks in `raw`, 32 floats of `w` a block (caller).
        unsafe {
            for c in 0..raw.len() / L::BYTES {
                let [q0, q1] = L::weights(raw.as_ptr().add(c * L::BYTES));
                _mm512_storeu_ps(w.add(32 * c), q0);
                _mm512_storeu_ps(w.add(32 * c + 16), q1);
            }
        }
    }
    #[inline(always)]
    unsafe fn each_super<S: Steps>(raw: &[u8], w: *mut f32) {
        // SAFETY: whole super-blocks in `raw`, 256 floats of `w` each (caller).
        unsafe {
            for c in 0..raw.len() / S::BYTES {
                let b = raw.as_ptr().add(c * S::BYTES);
                let prep = S::prep(b, &mut [0.0; 8]);
                for s in 0..4 {
                    for (j, v) in S::step(b, &prep, s).iter().enumerate() {
                        _mm512_storeu_ps(w.add(256 * c + 64 * s + 16 * j), *v);
                    }
                }
            }
        }
    }
    // SAFETY: forwarded.
    unsafe {
        match qtype {
            QuantType::Q8_0 => each::<Q8_0>(raw, w),
            QuantType::Q4_0 => each::<Q4_0>(raw, w),
            QuantType::Q4_1 => each::<Q4_1>(raw, w),
            QuantType::Q5_0 => each::<Q5_0>(raw, w),
            QuantType::Q5_1 => each::<Q5_1>(raw, w),
            QuantType::IQ4NL => each::<Iq4Nl>(raw, w),
            QuantType::MXFP4 => each::<Mxfp4>(raw, w),
            QuantType::Q4K => each_super::<Q4k>(raw, w),
            QuantType::IQ4XS => each_super::<Iq4Xs>(raw, w),
            QuantType::Q3K => each_super::<Q3k>(raw, w),
            QuantType::Q5K => each_super::<Q5k>(raw, w),
            other => unreachable!("{} is not unpacked here", other.name()),
        }
    }
}

/// Weight rows of a batched tile ([`weights_tile`]): with 32 registers,
/// 4 x 3 pairs of accumulators, three activation chunks and a weight chunk.
pub(crate) const CR: usize = 4;
/// Activation rows of a batched tile.
pub(crate) const CN: usize = 3;

/// `multirow`'s tile in this build's order, for the formats [`covers`]
/// takes: `rt` rows of weights (`scale * code`, [`weights_as_floats`];
/// `k` apart at `w`) times `nt`
/// activation rows (`k` apart at `x`), less the offset terms `sub` (row
/// `i`, activation `t` at `i * stride + t`), into `out` (`out_stride`
/// apart). `rt` is [`CR`] or 1, `nt` at most [`CN`].
///
/// # Safety
/// AVX-512 F/BW/VL, AVX2, FMA and F16C present; the rows, activations,
/// offset terms and outputs in bounds.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn weights_tile(
    (rt, nt): (usize, usize),
    w: *const f32,
    (x, k): (*const f32, usize),
    sub: Option<(*const f32, usize)>,
    out: *mut f32,
    out_stride: usize,
) {
    macro_rules! go {
        ($r:literal, $n:literal) => {{
            // SAFETY: forwarded from the caller.
            let res = unsafe { weights_dot::<$r, $n>(w, x, k) };
            // SAFETY: forwarded from the caller.
            unsafe { super::multirow::store_tile(&res, sub, out, out_stride) };
        }};
    }
    match (rt, nt) {
        (CR, CN) => go!(4, 3),
        (CR, 2) => go!(4, 2),
        (CR, _) => go!(4, 1),
        (_, CN) => go!(1, 3),
        (_, 2) => go!(1, 2),
        _ => go!(1, 1),
    }
}

/// `R` rows of weights times `N` activation rows, in this build's order
/// (see the module): per block `lo = fma(w0, x0, lo)`, `hi = fma(w1, x1,
/// hi)`, then [`hsum16`]`(lo + hi)`. Each chunk of weights and of
/// activations is loaded once a tile.
#[inline(always)]
unsafe fn weights_dot<const R: usize, const N: usize>(
    w: *const f32,
    x: *const f32,
    k: usize,
) -> [[f32; N]; R] {
    // SAFETY (whole body): R rows of k floats at w (`k` apart), N rows of
    // k at x (caller); k is a whole number of blocks.
    unsafe {
        // Values 0..16 and 16..32 of every block, as the one-row kernel.
        let mut acc = [[[_mm512_setzero_ps(); N]; R]; 2];
        for c in (0..k).step_by(32) {
            for (j, acc) in acc.iter_mut().enumerate() {
                let mut xv = [_mm512_setzero_ps(); N];
                for (t, xv) in xv.iter_mut().enumerate() {
                    *xv = _mm512_loadu_ps(x.add(t * k + c + 16 * j));
                }
                for (i, acc) in acc.iter_mut().enumerate() {
                    let w = _mm512_loadu_ps(w.add(i * k + c + 16 * j));
                    for (acc, &xv) in acc.iter_mut().zip(&xv) {
                        *acc = _mm512_fmadd_ps(w, xv, *acc);
                    }
                }
            }
        }
        let [mut acc, acc2] = acc;
        for (a, b) in acc.iter_mut().zip(&acc2) {
            for (a, &b) in a.iter_mut().zip(b) {
                *a = _mm512_add_ps(*a, b);
            }
        }
        // Loops, not `acc.map(..)`: `map` is a generic function of its own,
        // compiled without this kernel's target features, so the SIMD sums
        // inside its closure became out-of-line calls that spilled the tile.
        let mut sums = [[0.0f32; N]; R];
        for (o, a) in sums.iter_mut().zip(&acc) {
            for (o, &v) in o.iter_mut().zip(a) {
                *o = hsum16(v);
            }
        }
        sums
    }
}

/// Weight rows of a fused tile ([`blocks_tile`]): 2 x 4 pairs of
/// accumulators, four weight chunks, two activation chunks. Measured on
/// Sapphire Rapids (`perf_probe`, best of three alternated runs): 1 x 8
/// was 0.7-1.0x of 2 x 4 (twice the activation loads per FMA, and eight
/// activation rows of 1536 floats are L1d's 48 KiB).
pub(crate) const FR: usize = 2;
/// Activation rows of a fused tile (the arms of [`blocks_tile`] are 1..=4).
pub(crate) const FN: usize = 4;

/// `multirow`'s tile for short batches, the formats [`covers`] takes but
/// Q4_K: `rt` weight rows of `qtype` (`rb` bytes apart at `raw`) decoded
/// block by block in registers, as the one-row kernel does, times `nt`
/// activation rows (`k` apart at `x`), less the offset terms `sub`, into
/// `out` (`out_stride` apart). The same weights and FMAs in the same order
/// as [`weights_tile`] over [`weights_as_floats`], so the same bits; the
/// band's decoding into floats (two stores a block, read back by every
/// tile) is not done, and each tile decodes its rows again instead. `rt`
/// is [`FR`] or 1, `nt` at most [`FN`].
///
/// # Safety
/// AVX-512 F/BW/VL, AVX2, FMA and F16C present; the rows (whole blocks),
/// activations, offset terms and outputs in bounds.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn blocks_tile(
    qtype: QuantType,
    (rt, nt): (usize, usize),
    (raw, rb): (*const u8, usize),
    (x, k): (*const f32, usize),
    sub: Option<(*const f32, usize)>,
    out: *mut f32,
    out_stride: usize,
) {
    #[inline(always)]
    unsafe fn each<L: Block>(
        (rt, nt): (usize, usize),
        (raw, rb): (*const u8, usize),
        (x, k): (*const f32, usize),
        sub: Option<(*const f32, usize)>,
        out: *mut f32,
        out_stride: usize,
    ) {
        macro_rules! go {
            ($r:expr, $n:expr) => {{
                // SAFETY: forwarded from the caller.
                let res = unsafe { blocks_dot::<L, { $r }, { $n }>(raw, rb, x, k) };
                // SAFETY: forwarded from the caller.
                unsafe { super::multirow::store_tile(&res, sub, out, out_stride) };
            }};
        }
        macro_rules! by_n {
            ($r:expr) => {
                match nt {
                    1 => go!($r, 1),
                    2 => go!($r, 2),
                    3 => go!($r, 3),
                    _ => go!($r, FN),
                }
            };
        }
        if rt == FR {
            by_n!(FR)
        } else {
            by_n!(1)
        }
    }
    let a = ((rt, nt), (raw, rb), (x, k), sub, out, out_stride);
    // SAFETY: forwarded.
    unsafe {
        match qtype {
            QuantType::Q8_0 => each::<Q8_0>(a.0, a.1, a.2, a.3, a.4, a.5),
            QuantType::Q4_0 => each::<Q4_0>(a.0, a.1, a.2, a.3, a.4, a.5),
            QuantType::Q4_1 => each::<Q4_1>(a.0, a.1, a.2, a.3, a.4, a.5),
            QuantType::Q5_0 => each::<Q5_0>(a.0, a.1, a.2, a.3, a.4, a.5),
            QuantType::Q5_1 => each::<Q5_1>(a.0, a.1, a.2, a.3, a.4, a.5),
            QuantType::IQ4NL => each::<Iq4Nl>(a.0, a.1, a.2, a.3, a.4, a.5),
            QuantType::MXFP4 => each::<Mxfp4>(a.0, a.1, a.2, a.3, a.4, a.5),
            other => unreachable!("{} has no fused tile", other.name()),
        }
    }
}

/// `R` weight rows of `L` (`rb` bytes apart) times `N` activation rows,
/// each block's weights decoded in registers ([`Block::weights`]) and
/// used by every activation row: the order of [`weights_dot`].
#[inline(always)]
unsafe fn blocks_dot<L: Block, const R: usize, const N: usize>(
    raw: *const u8,
    rb: usize,
    x: *const f32,
    k: usize,
) -> [[f32; N]; R] {
    // SAFETY (whole body): R rows of k / 32 blocks at raw (`rb` apart), N
    // rows of k floats at x (caller).
    unsafe {
        let mut lo = [[_mm512_setzero_ps(); N]; R];
        let mut hi = [[_mm512_setzero_ps(); N]; R];
        for c in 0..k / 32 {
            let mut w = [[_mm512_setzero_ps(); 2]; R];
            for (i, w) in w.iter_mut().enumerate() {
                *w = L::weights(raw.add(i * rb + c * L::BYTES));
            }
            for t in 0..N {
                let x0 = _mm512_loadu_ps(x.add(t * k + 32 * c));
                let x1 = _mm512_loadu_ps(x.add(t * k + 32 * c + 16));
                for i in 0..R {
                    lo[i][t] = _mm512_fmadd_ps(w[i][0], x0, lo[i][t]);
                    hi[i][t] = _mm512_fmadd_ps(w[i][1], x1, hi[i][t]);
                }
            }
        }
        let mut sums = [[0.0f32; N]; R];
        for i in 0..R {
            for t in 0..N {
                sums[i][t] = hsum16(_mm512_add_ps(lo[i][t], hi[i][t]));
            }
        }
        sums
    }
}
