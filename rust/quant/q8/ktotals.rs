//! Super-block totals on AVX2 (CPUs without AVX-512 VNNI): the fast mode's
//! K-quants (Q2_K to Q6_K) and IQ4_XS total each 256-value super-block's products
//! with their group scales in integers, exactly, and spend float operations
//! once a super-block, as llama.cpp's `ggml_vec_dot_q4_K_q8_K` does:
//!
//! ```text
//! lanes = sum_c vpmaddwd(vpmaddubsw(u_c, x_c), scale16_c)     (8 int32 lanes)
//!         [Q6_K: - 32 * vpmaddwd(scales16, gsum16)]           (the stored bias)
//! acc   = fma(d_w * d_x, float(lanes), acc)                    (8 float lanes)
//! off   = fma(dmin_w * d_x, float(vpmaddwd(mins16, gsum16)), off)   (Q4_K, Q5_K)
//! result = hsum(acc) - hsum(off)
//! ```
//!
//! `u_c` are chunk `c`'s 32 stored (unsigned) codes (IQ4_XS's signed table
//! codes: `|code|` against `x_c` carrying the code's sign), `x_c` the activation
//! row's 32 int8 codes, `scale16_c` the chunk's group scales as int16 (one
//! for Q4_K/Q5_K's groups of 32; two, one a 128-bit half, for Q6_K's groups
//! of 16), `gsum16` the activation block's sixteen sums of 16 codes. Every
//! int16 pair and every int32 lane fits (Q6_K's pairs at most 2 * 63 * 127;
//! a lane at most 8 * 4 * 128 * 63 * 127), so the integers are exact; Q4_K's
//! and Q5_K's lanes stay below 2^24 and convert exactly.
//!
//! The eight-lane kernels this replaced (the AVX2 build's, since removed, and the
//! one-row `row1k_avx2` before it) converted and scaled every chunk: sign,
//! `vpmaddubsw`, `vpmaddwd`, conversion, scale broadcast and multiply-add a
//! weight row, activation row and chunk, the group offsets in scalar float.
//! Here a product of a chunk costs `vpmaddubsw`, `vpmaddwd`, `vpaddd`, and a
//! weight row's codes and scales are decoded once for a tile of up to eight
//! activation rows.
//!
//! Every output takes the same operations whatever the tile it lies in, so
//! a row's bits do not depend on its batch, its place in it or the threads.
//! They are this build's own bits (the portable build converts every group's
//! sum), both within float32 rounding of the exact product of the quantised
//! activations with the dequantised weights, closer than the eight lanes were.

use std::arch::x86_64::*;

use super::{Job, Scratch};
use crate::quant::format::QuantType;
use crate::quant::simd::{Avx2, Lanes};

/// Rows ahead to prefetch while streaming one activation tile's weights
/// (two tiles of four rows: one more than the hardware streams keep up with).
const AHEAD: usize = 8;

/// Whether [`rows`] takes `qtype`.
pub(super) fn covers(qtype: QuantType) -> bool {
    // Every format of 256-value blocks (the K-quants and IQ4_XS).
    super::act_block(qtype) == Some(256)
}

/// Rows `lo..hi` of `job` (a format [`covers`] takes) times every
/// activation row, into `out` (`n` x `rows`).
///
/// # Safety
/// AVX2, FMA and F16C present; `out` holds `n * rows` floats and nobody
/// else writes columns `lo..hi` of it meanwhile.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn rows(job: &Job<'_>, lo: usize, hi: usize, out: *mut f32, s: &mut Scratch) {
    // SAFETY: forwarded.
    unsafe {
        match job.qtype {
            QuantType::Q4K => rows_of::<Q4K>(job, lo, hi, out, s),
            QuantType::Q5K => rows_of::<Q5K>(job, lo, hi, out, s),
            QuantType::Q6K => rows_of::<Q6K>(job, lo, hi, out, s),
            QuantType::Q3K => rows_of::<Q3K>(job, lo, hi, out, s),
            QuantType::Q2K => rows_of::<Q2K>(job, lo, hi, out, s),
            QuantType::IQ4XS => rows_of::<Iq4Xs>(job, lo, hi, out, s),
            other => unreachable!("{} has no AVX2 super-block totals", other.name()),
        }
    }
}

/// A K-quant read a chunk (32 values) at a time, its scales as int16.
trait Super {
    const BYTES: usize;
    /// Whether groups have an offset (`weight = d * scale * code - dmin * min`).
    const OFFSET: bool;
    /// Whether [`Super::chunk`] gives signed codes (multiplied as `|code|`
    /// against the activation carrying the code's sign); else unsigned.
    const SIGNED: bool = false;
    /// Where the block's float16 `d` lies (`dmin` right after it).
    const D_AT: usize;
    /// A stored bias `1 << BIAS_SHIFT` (code = stored - bias; 0: none),
    /// taken off with the scales in group order ([`ScaleSet::all`]).
    const BIAS_SHIFT: i32 = 0;
    /// A block's decoded scales (and offsets), in registers.
    type Scales: ScaleSet;
    /// # Safety
    /// AVX2 present; `BYTES` readable bytes at `b`.
    unsafe fn scales(b: *const u8) -> Self::Scales;
    /// Stored codes of chunk `C` of the block at `b` (see [`Super::SIGNED`]).
    ///
    /// # Safety
    /// As [`Super::scales`].
    unsafe fn chunk<const C: usize>(b: *const u8) -> __m256i;
}

/// A block's scales in registers.
trait ScaleSet: Copy {
    /// Chunk `C`'s scales, one int16 for each of its 16 pairs of codes.
    ///
    /// # Safety
    /// AVX2 present.
    unsafe fn chunk<const C: usize>(&self) -> __m256i;
    /// The sixteen scales of groups of 16 in order (formats with a stored bias).
    ///
    /// # Safety
    /// AVX2 present.
    #[inline(always)]
    unsafe fn all(&self) -> __m256i {
        // SAFETY: AVX2 present (caller).
        unsafe { _mm256_setzero_si256() }
    }
    /// Lanes whose total is `sum_g min_g * (sum of group g's activation codes)`.
    ///
    /// # Safety
    /// AVX2 present.
    #[inline(always)]
    unsafe fn offsets(&self, _: __m256i) -> __m256i {
        // SAFETY: AVX2 present (caller).
        unsafe { _mm256_setzero_si256() }
    }
}

impl ScaleSet for K4Scales {
    #[inline(always)]
    unsafe fn chunk<const C: usize>(&self) -> __m256i {
        // Byte C zero-extended into every int16.
        // SAFETY: AVX2 present (caller).
        unsafe { _mm256_shuffle_epi8(self.s, _mm256_set1_epi16((0x8000 | C) as u16 as i16)) }
    }
    #[inline(always)]
    unsafe fn offsets(&self, gsum: __m256i) -> __m256i {
        // SAFETY: AVX2 present (caller).
        unsafe { _mm256_madd_epi16(self.m, gsum) }
    }
}

impl ScaleSet for G16Scales {
    #[inline(always)]
    unsafe fn chunk<const C: usize>(&self) -> __m256i {
        // Low half (codes 0..16): group 2C, high half: group 2C + 1, each an
        // int16 (two bytes) of `lo` (groups 0..8) or `hi` (8..16).
        let (g0, g1) = ((2 * C % 8) as i16, ((2 * C + 1) % 8) as i16);
        let pick = |g: i16| (2 * g) | ((2 * g + 1) << 8);
        // SAFETY: AVX2 present (caller).
        unsafe {
            let ctrl = _mm256_set_m128i(_mm_set1_epi16(pick(g1)), _mm_set1_epi16(pick(g0)));
            _mm256_shuffle_epi8(if C < 4 { self.lo } else { self.hi }, ctrl)
        }
    }
    #[inline(always)]
    unsafe fn all(&self) -> __m256i {
        self.all
    }
}

impl ScaleSet for K2Scales {
    #[inline(always)]
    unsafe fn chunk<const C: usize>(&self) -> __m256i {
        // SAFETY: forwarded.
        unsafe { self.s.chunk::<C>() }
    }
    #[inline(always)]
    unsafe fn offsets(&self, gsum: __m256i) -> __m256i {
        // SAFETY: AVX2 present (caller).
        unsafe { _mm256_madd_epi16(self.m, gsum) }
    }
}

impl ScaleSet for X4Scales {
    #[inline(always)]
    unsafe fn chunk<const C: usize>(&self) -> __m256i {
        // Int16 C (bytes 2C, 2C + 1) into every int16.
        // SAFETY: AVX2 present (caller).
        unsafe {
            _mm256_shuffle_epi8(
                self.0,
                _mm256_set1_epi16(((2 * C) | ((2 * C + 1) << 8)) as i16),
            )
        }
    }
}

/// The float16 at `p` (F16C).
#[inline(always)]
unsafe fn half(p: *const u8) -> f32 {
    // SAFETY: 2 readable bytes at p; F16C present (caller).
    unsafe {
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(
            p.cast::<u16>().read_unaligned(),
        ))))
    }
}

/// Q4_K's and Q5_K's eight 6-bit scales and mins from the 12 bytes at `q`
/// (`k4_scales`' layout): scales' bytes, mins' bytes.
#[inline(always)]
unsafe fn k4_bytes(q: *const u8) -> (u64, u64) {
    // SAFETY: 12 readable bytes at q (caller).
    let w = |i: usize| unsafe { q.add(4 * i).cast::<u32>().read_unaligned() };
    let (w0, w1, w2) = (w(0), w(1), w(2));
    const LOW6: u32 = 0x3f3f_3f3f;
    const LOW4: u32 = 0x0f0f_0f0f;
    const LOW2: u32 = 0x0303_0303;
    // j < 4: scale q[j] & 63, min q[j + 4] & 63; j >= 4: scale
    // q[j + 4] & 15 | (q[j - 4] >> 6) << 4, min q[j + 4] >> 4 | (q[j] >> 6) << 4.
    let s = (w0 & LOW6, (w2 & LOW4) | (((w0 >> 6) & LOW2) << 4));
    let m = (w1 & LOW6, ((w2 >> 4) & LOW4) | (((w1 >> 6) & LOW2) << 4));
    (
        u64::from(s.0) | u64::from(s.1) << 32,
        u64::from(m.0) | u64::from(m.1) << 32,
    )
}

/// Q4_K's and Q5_K's scales: the eight scale bytes in both halves, and the
/// mins as int16, each twice (min `g` against the sums of 16 `2g` and `2g + 1`).
#[derive(Clone, Copy)]
struct K4Scales {
    s: __m256i,
    m: __m256i,
}

#[inline(always)]
unsafe fn k4_scales(b: *const u8) -> K4Scales {
    // SAFETY: 16 readable bytes at b (caller); AVX2 present.
    unsafe {
        let (s, m) = k4_bytes(b.add(4));
        let m = _mm_cvtsi64_si128(m as i64);
        K4Scales {
            s: _mm256_set1_epi64x(s as i64),
            m: _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m, m)),
        }
    }
}

/// Chunk `C` of Q4_K's (and Q5_K's) nibbles at `qs`: chunks 2j and 2j + 1
/// are the low and high nibbles of `qs[32j..32j + 32]`.
#[inline(always)]
unsafe fn nibble_chunk<const C: usize>(qs: *const u8) -> __m256i {
    // SAFETY: 128 readable bytes at qs (caller); AVX2 present.
    unsafe {
        let v = _mm256_loadu_si256(qs.add(32 * (C / 2)).cast());
        let v = if C.is_multiple_of(2) {
            v
        } else {
            _mm256_srli_epi16::<4>(v)
        };
        _mm256_and_si256(v, _mm256_set1_epi8(15))
    }
}

/// Bit `FROM` of each byte of `v` moved to bit `TO`, the rest cleared
/// (16-bit shifts: the mask keeps each byte's own bit).
#[inline(always)]
unsafe fn bit_to<const FROM: usize, const TO: usize>(v: __m256i) -> __m256i {
    // SAFETY: AVX2 present (caller).
    unsafe {
        let v = if FROM <= TO {
            _mm256_sll_epi16(v, _mm_cvtsi32_si128((TO - FROM) as i32))
        } else {
            _mm256_srl_epi16(v, _mm_cvtsi32_si128((FROM - TO) as i32))
        };
        _mm256_and_si256(v, _mm256_set1_epi8(1 << TO))
    }
}

struct Q4K;
impl Super for Q4K {
    const D_AT: usize = 0;
    const BYTES: usize = 144;
    const OFFSET: bool = true;
    type Scales = K4Scales;
    #[inline(always)]
    unsafe fn scales(b: *const u8) -> K4Scales {
        // SAFETY: forwarded.
        unsafe { k4_scales(b) }
    }
    #[inline(always)]
    unsafe fn chunk<const C: usize>(b: *const u8) -> __m256i {
        // SAFETY: forwarded; d, dmin, scales[12], qs[128]: chunks 2j and
        // 2j + 1 are the low and high nibbles of qs[32j..32j + 32].
        unsafe { nibble_chunk::<C>(b.add(16)) }
    }
}

struct Q5K;
impl Super for Q5K {
    const D_AT: usize = 0;
    const BYTES: usize = 176;
    const OFFSET: bool = true;
    type Scales = K4Scales;
    #[inline(always)]
    unsafe fn scales(b: *const u8) -> K4Scales {
        // SAFETY: forwarded.
        unsafe { k4_scales(b) }
    }
    #[inline(always)]
    unsafe fn chunk<const C: usize>(b: *const u8) -> __m256i {
        // SAFETY: forwarded; d, dmin, scales[12], qh[32], qs[128]: chunks 2j
        // and 2j + 1 are the low and high nibbles of qs[32j..32j + 32], bit
        // c of each qh byte their fifth bit (`unpack.rs::q5_k`).
        unsafe {
            let qh = _mm256_loadu_si256(b.add(16).cast());
            _mm256_or_si256(nibble_chunk::<C>(b.add(48)), bit_to::<C, 4>(qh))
        }
    }
}

/// Sixteen scales of groups of 16 (Q6_K, Q3_K, Q2_K) as int16: groups 0..8
/// in both halves, groups 8..16 in both halves, and all sixteen in order.
#[derive(Clone, Copy)]
struct G16Scales {
    lo: __m256i,
    hi: __m256i,
    all: __m256i,
}

struct Q6K;
impl Super for Q6K {
    const D_AT: usize = 208;
    const BIAS_SHIFT: i32 = 5;
    const BYTES: usize = 210;
    const OFFSET: bool = false;
    type Scales = G16Scales;
    #[inline(always)]
    unsafe fn scales(b: *const u8) -> G16Scales {
        // SAFETY: forwarded; ql[128], qh[64], scales[16] at 192, d at 208.
        unsafe { g16_scales(_mm256_cvtepi8_epi16(_mm_loadu_si128(b.add(192).cast()))) }
    }
    #[inline(always)]
    unsafe fn chunk<const C: usize>(b: *const u8) -> __m256i {
        // SAFETY: forwarded. Chunk 4h + s: low (s < 2) or high nibbles of
        // ql[64h + 32(s & 1)..], bits 2s..2s + 2 of qh[32h..] above them.
        unsafe {
            let (h, s) = (C / 4, C % 4);
            let l = _mm256_loadu_si256(b.add(64 * h + 32 * (s & 1)).cast());
            let l = if s < 2 { l } else { _mm256_srli_epi16::<4>(l) };
            let qh = _mm256_loadu_si256(b.add(128 + 32 * h).cast());
            let qh = match s {
                0 => _mm256_slli_epi16::<4>(qh),
                1 => _mm256_slli_epi16::<2>(qh),
                2 => qh,
                _ => _mm256_srli_epi16::<2>(qh),
            };
            _mm256_or_si256(
                _mm256_and_si256(l, _mm256_set1_epi8(15)),
                _mm256_and_si256(qh, _mm256_set1_epi8(0x30)),
            )
        }
    }
}

/// [`G16Scales`] from the sixteen int16 scales in order.
#[inline(always)]
unsafe fn g16_scales(all: __m256i) -> G16Scales {
    // SAFETY: AVX2 present (caller).
    unsafe {
        G16Scales {
            lo: _mm256_permute4x64_epi64::<0x44>(all),
            hi: _mm256_permute4x64_epi64::<0xee>(all),
            all,
        }
    }
}

/// Two-bit codes of chunk `C` (Q2_K, Q3_K): bits 2j..2j + 2 of
/// `qs[32h..32h + 32]`, `C = 4h + j`.
#[inline(always)]
unsafe fn two_bits<const C: usize>(qs: *const u8) -> __m256i {
    // SAFETY: 64 readable bytes at qs (caller); AVX2 present.
    unsafe {
        let v = _mm256_loadu_si256(qs.add(32 * (C / 4)).cast());
        let v = match C % 4 {
            0 => v,
            1 => _mm256_srli_epi16::<2>(v),
            2 => _mm256_srli_epi16::<4>(v),
            _ => _mm256_srli_epi16::<6>(v),
        };
        _mm256_and_si256(v, _mm256_set1_epi8(3))
    }
}

struct Q3K;
impl Super for Q3K {
    const D_AT: usize = 108;
    const BIAS_SHIFT: i32 = 2;
    const BYTES: usize = 110;
    const OFFSET: bool = false;
    type Scales = G16Scales;
    #[inline(always)]
    unsafe fn scales(b: *const u8) -> G16Scales {
        // SAFETY: forwarded; hmask[32], qs[64], scales[12] at 96, d at 108.
        // Scale s: low four bits of byte s % 8 (shifted by 4 for s >= 8),
        // bits 2(s / 4).. of byte 8 + s % 4 above them, less 32.
        unsafe {
            let w = |i: usize| b.add(96 + 4 * i).cast::<u32>().read_unaligned();
            let (w0, w1, w2) = (w(0), w(1), w(2));
            const LOW4: u32 = 0x0f0f_0f0f;
            const LOW2: u32 = 0x0303_0303;
            let s = [
                (w0 & LOW4) | ((w2 & LOW2) << 4),
                (w1 & LOW4) | (((w2 >> 2) & LOW2) << 4),
                ((w0 >> 4) & LOW4) | (((w2 >> 4) & LOW2) << 4),
                ((w1 >> 4) & LOW4) | (((w2 >> 6) & LOW2) << 4),
            ];
            let v = _mm_set_epi32(s[3] as i32, s[2] as i32, s[1] as i32, s[0] as i32);
            let v = _mm_sub_epi8(v, _mm_set1_epi8(32));
            g16_scales(_mm256_cvtepi8_epi16(v))
        }
    }
    #[inline(always)]
    unsafe fn chunk<const C: usize>(b: *const u8) -> __m256i {
        // SAFETY: forwarded. Stored code: the two bits, plus 4 where bit C of
        // hmask[l] is set (the code is that less 4).
        unsafe {
            let h = _mm256_loadu_si256(b.cast());
            _mm256_or_si256(two_bits::<C>(b.add(32)), bit_to::<C, 2>(h))
        }
    }
}

/// Q2_K's scales: [`G16Scales`] of the low nibbles, the high nibbles (mins) as int16.
#[derive(Clone, Copy)]
struct K2Scales {
    s: G16Scales,
    m: __m256i,
}

struct Q2K;
impl Super for Q2K {
    const D_AT: usize = 80;
    const BYTES: usize = 84;
    const OFFSET: bool = true;
    type Scales = K2Scales;
    #[inline(always)]
    unsafe fn scales(b: *const u8) -> K2Scales {
        // SAFETY: forwarded; scales[16] (scale low nibble, min high), qs[64]
        // at 16, d at 80, dmin at 82.
        unsafe {
            let v = _mm_loadu_si128(b.cast());
            let m4 = _mm_set1_epi8(15);
            K2Scales {
                s: g16_scales(_mm256_cvtepu8_epi16(_mm_and_si128(v, m4))),
                m: _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16::<4>(v), m4)),
            }
        }
    }
    #[inline(always)]
    unsafe fn chunk<const C: usize>(b: *const u8) -> __m256i {
        // SAFETY: forwarded.
        unsafe { two_bits::<C>(b.add(16)) }
    }
}

/// IQ4_XS's eight signed scales as int16, in both halves.
#[derive(Clone, Copy)]
struct X4Scales(__m256i);

struct Iq4Xs;
impl Super for Iq4Xs {
    const D_AT: usize = 0;
    const BYTES: usize = 136;
    const OFFSET: bool = false;
    const SIGNED: bool = true;
    type Scales = X4Scales;
    #[inline(always)]
    unsafe fn scales(b: *const u8) -> X4Scales {
        // SAFETY: forwarded; d, scales_h (u16), scales_l[4], qs[128]. Scale
        // g: nibble g of scales_l (low nibble first), bits 2g..2g + 2 of
        // scales_h above it, less 32.
        unsafe {
            let l = _mm_cvtsi32_si128(b.add(4).cast::<i32>().read_unaligned());
            let m4 = _mm_set1_epi8(15);
            let low = _mm_unpacklo_epi8(
                _mm_and_si128(l, m4),
                _mm_and_si128(_mm_srli_epi16::<4>(l), m4),
            );
            // The eight two-bit fields of scales_h, one a byte.
            let h = u64::from(b.add(2).cast::<u16>().read_unaligned());
            let h = (h | h << 24) & 0x0000_00ff_0000_00ff;
            let h = (h | h << 12) & 0x000f_000f_000f_000f;
            let h = (h | h << 6) & 0x0303_0303_0303_0303;
            let v = _mm_or_si128(low, _mm_cvtsi64_si128((h << 4) as i64));
            let v = _mm_cvtepi8_epi16(_mm_sub_epi8(v, _mm_set1_epi8(32)));
            X4Scales(_mm256_broadcastsi128_si256(v))
        }
    }
    #[inline(always)]
    unsafe fn chunk<const C: usize>(b: *const u8) -> __m256i {
        // SAFETY: forwarded; chunk C: the low nibbles of qs[16C..16C + 16],
        // then the high ones, through the IQ4 table.
        unsafe {
            let v = _mm_loadu_si128(b.add(8 + 16 * C).cast());
            let m4 = _mm_set1_epi8(15);
            let n = _mm256_set_m128i(
                _mm_and_si128(_mm_srli_epi16::<4>(v), m4),
                _mm_and_si128(v, m4),
            );
            let t = _mm256_broadcastsi128_si256(_mm_loadu_si128(
                crate::quant::unpack::IQ4_VALUES.as_ptr().cast(),
            ));
            _mm256_shuffle_epi8(t, n)
        }
    }
}

/// Each activation row's sums of 16 codes, sixteen int16 a block
/// (row `t`, block `b` at `t * blocks + b`).
fn group_sums(job: &Job<'_>, into: &mut Vec<[i16; 16]>) {
    into.clear();
    into.extend(
        job.acts.codes[..job.n * job.cols]
            .chunks_exact(256)
            .map(|x| {
                let mut g = [0i16; 16];
                for (g, x) in g.iter_mut().zip(x.chunks_exact(16)) {
                    *g = x.iter().map(|&q| i16::from(q)).sum();
                }
                g
            }),
    );
}

#[inline(always)]
unsafe fn rows_of<L: Super>(job: &Job<'_>, lo: usize, hi: usize, out: *mut f32, s: &mut Scratch) {
    group_sums(job, &mut s.gsum);
    let gsum = s.gsum.as_ptr();
    let n = job.n;
    let mut t = 0;
    // SAFETY (whole body): forwarded; every tile inside rows lo..hi and
    // activation rows 0..n.
    unsafe {
        while t < n {
            // One weight row at a time, against up to eight activation rows:
            // streaming one activation row from memory (a decode step's
            // case), one row a pass measured 1.5x faster than four.
            let nt = (n - t).min(8);
            let mut r = lo;
            macro_rules! sweep {
                ($n:literal) => {{
                    while r < hi {
                        tile::<L, $n>(job, r, t, gsum, out);
                        r += 1;
                    }
                }};
            }
            match nt {
                8 => sweep!(8),
                7 => sweep!(7),
                6 => sweep!(6),
                5 => sweep!(5),
                4 => sweep!(4),
                3 => sweep!(3),
                2 => sweep!(2),
                _ => sweep!(1),
            }
            t += nt;
        }
    }
}

/// Weight row `r` times activation rows `t..t + NT`.
#[inline(always)]
unsafe fn tile<L: Super, const NT: usize>(
    job: &Job<'_>,
    r: usize,
    t: usize,
    gsum: *const [i16; 16],
    out: *mut f32,
) {
    let (k, rb) = (job.cols, job.row_bytes);
    let blocks = k / 256;
    // SAFETY (whole body): row r of `raw` holds `blocks` blocks of
    // L::BYTES; activation rows t..t + NT hold `k` codes, `blocks` scales
    // and `blocks` group sums each; AVX2, FMA and F16C present (caller).
    unsafe {
        let row = job.raw.as_ptr().add(r * rb);
        let xq = job.acts.codes.as_ptr().add(t * k);
        let xd = job.acts.scales.as_ptr().add(t * blocks);
        let gsum = gsum.add(t * blocks);
        let mut acc = [_mm256_setzero_ps(); NT];
        let mut off = [_mm256_setzero_ps(); NT];
        for blk in 0..blocks {
            let b = row.add(blk * L::BYTES);
            if t == 0 {
                // The first activation tile streams the weights from memory.
                let ahead = b.wrapping_add(AHEAD * rb);
                let mut line = 0;
                while line < L::BYTES {
                    _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(line).cast());
                    line += 64;
                }
            }
            let sc = L::scales(b);
            let x = xq.add(blk * 256);
            let mut lanes = [_mm256_setzero_si256(); NT];
            macro_rules! chunk {
                ($c:literal) => {
                    let w = L::chunk::<$c>(b);
                    let u = if L::SIGNED { _mm256_sign_epi8(w, w) } else { w };
                    let s = sc.chunk::<$c>();
                    for (tt, lanes) in lanes.iter_mut().enumerate() {
                        let xv = _mm256_loadu_si256(x.add(tt * k + 32 * $c).cast());
                        let xv = if L::SIGNED {
                            _mm256_sign_epi8(xv, w)
                        } else {
                            xv
                        };
                        let p = _mm256_madd_epi16(_mm256_maddubs_epi16(u, xv), s);
                        *lanes = _mm256_add_epi32(*lanes, p);
                    }
                };
            }
            chunk!(0);
            chunk!(1);
            chunk!(2);
            chunk!(3);
            chunk!(4);
            chunk!(5);
            chunk!(6);
            chunk!(7);
            let dw = half(b.add(L::D_AT));
            let mw = if L::OFFSET {
                half(b.add(L::D_AT + 2))
            } else {
                0.0
            };
            for tt in 0..NT {
                let g = _mm256_loadu_si256(gsum.add(tt * blocks + blk).cast());
                let dx = *xd.add(tt * blocks + blk);
                let l = if L::BIAS_SHIFT > 0 {
                    let bias = _mm256_madd_epi16(sc.all(), g);
                    _mm256_sub_epi32(
                        lanes[tt],
                        _mm256_sll_epi32(bias, _mm_cvtsi32_si128(L::BIAS_SHIFT)),
                    )
                } else {
                    lanes[tt]
                };
                acc[tt] = _mm256_fmadd_ps(_mm256_set1_ps(dw * dx), _mm256_cvtepi32_ps(l), acc[tt]);
                if L::OFFSET {
                    let m = _mm256_cvtepi32_ps(sc.offsets(g));
                    off[tt] = _mm256_fmadd_ps(_mm256_set1_ps(mw * dx), m, off[tt]);
                }
            }
        }
        for tt in 0..NT {
            let v = hsum(acc[tt]);
            let v = if L::OFFSET { v - hsum(off[tt]) } else { v };
            *out.add((t + tt) * job.rows + r) = v;
        }
    }
}

/// The sum of eight lanes, in a fixed order.
#[inline(always)]
unsafe fn hsum(v: __m256) -> f32 {
    // SAFETY: AVX2 present (caller).
    unsafe { Avx2::hsum(v) }
}
