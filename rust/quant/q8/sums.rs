//! The VNNI kernels of every quantised format: the 32-value-block ones
//! (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4), and the K-quants and IQ4_XS read
//! as eight blocks of 32 a 256-value block ([`Q2k`], [`Q3k`], [`Q4k`],
//! [`Q5k`], [`Q6k`], [`Iq4Xs`]; Q2_K's, Q3_K's and Q6_K's totalled by
//! halves, their groups of 16):
//! every block's integer dot product totalled exactly, then the portable
//! route's float operations, so the portable build's bits.
//!
//! The eight-lane kernels (the AVX2 build's, since removed) turned every four
//! byte products into a float and multiply-added it: three float operations
//! per 32 products of each weight row and activation row, which bounds a
//! batch at about two of the integer unit's operations per 64 products.
//! Here each block's 32 products are one exact int32 total, and per output
//! and block the float work is the portable one:
//!
//! ```text
//! acc = acc + (scale_b * d_b) * float(total_b)      (block by block from 0)
//! off = off + offset_b * qsum_b                       (block by block from 0)
//! result = acc - off
//! ```
//!
//! - **Batches** ([`rows`]): each 512-bit lane is one (weight row,
//!   activation row) output: lane `2m + h` is weight row `2j + h` times
//!   activation row `m` of a slab of eight. `vpdpbusd` takes the pair's
//!   four codes of a block's quarter `q` broadcast from an interleaved band
//!   and the eight activation rows' four codes of that quarter, duplicated;
//!   eight of them total a block for 16 outputs. So 64 byte products cost
//!   one integer operation and a quarter of a float one.
//! - **One row** ([`row1`]): two weight rows' blocks in one `vpdpbusd`
//!   against the activation block twice, eight lanes a row, and a tree of
//!   shuffles and adds totalling 16 rows' lanes into 16 lanes, one a row.
//!
//! The codes go in unsigned: `u = code + bias` (stored nibbles for Q4_0 and
//! Q5_0 in [`row1`], `code + 128` otherwise), the total being `sum u * x -
//! bias * sum x` with no rounding or saturation anywhere.

use std::arch::x86_64::*;

use super::x86::{self, Block};
use super::{amx, AmxSlabs, Job, Line, QActs, QuantType, Scratch, Slabs};
use crate::quant::unpack::E8M0_HALF;

/// Weight rows a band holds (eight pairs).
const BAND: usize = 16;
/// Activation rows a slab holds.
const SLAB: usize = 8;

/// Whether `qtype` runs these kernels on a VNNI CPU.
pub(super) fn covers(qtype: QuantType) -> bool {
    matches!(
        qtype,
        QuantType::Q8_0
            | QuantType::Q4_0
            | QuantType::Q4_1
            | QuantType::Q5_0
            | QuantType::Q5_1
            | QuantType::IQ4NL
            | QuantType::MXFP4
            | QuantType::Q2K
            | QuantType::Q3K
            | QuantType::Q4K
            | QuantType::Q5K
            | QuantType::Q6K
            | QuantType::IQ4XS
    )
}

/// Activation row `t` times rows `lo..hi` (a format [`covers`] takes).
///
/// # Safety
/// AVX2, FMA, F16C, AVX-512 F/BW/VL/VNNI present; `t < job.n`; `out`
/// holds `rows` floats (row `t`'s outputs) and nobody else writes `lo..hi`
/// of it.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn row1(job: &Job<'_>, t: usize, lo: usize, hi: usize, out: *mut f32) {
    // SAFETY: forwarded.
    unsafe { few::<1>(job, t, lo, hi, out) }
}

/// Activation rows `t` and `t + 1` times rows `lo..hi`: [`row1`]'s
/// kernel decoding each band once for both (the same bits as one by one).
///
/// # Safety
/// As [`row1`], with `t + 1 < job.n` and `out` holding row `t`'s outputs
/// then row `t + 1`'s, `rows` apart.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn row2(job: &Job<'_>, t: usize, lo: usize, hi: usize, out: *mut f32) {
    // SAFETY: forwarded.
    unsafe { few::<2>(job, t, lo, hi, out) }
}

/// [`row2`] for rows `t..t + 3`.
///
/// # Safety
/// As [`row2`], with `t + 2 < job.n` and three rows of outputs.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn row3(job: &Job<'_>, t: usize, lo: usize, hi: usize, out: *mut f32) {
    // SAFETY: forwarded.
    unsafe { few::<3>(job, t, lo, hi, out) }
}

/// [`row2`] for rows `t..t + 4`.
///
/// # Safety
/// As [`row2`], with `t + 3 < job.n` and four rows of outputs.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn row4(job: &Job<'_>, t: usize, lo: usize, hi: usize, out: *mut f32) {
    // SAFETY: forwarded.
    unsafe { few::<4>(job, t, lo, hi, out) }
}

/// [`row1_of`] for `job`'s format.
#[inline(always)]
unsafe fn few<const N: usize>(job: &Job<'_>, t: usize, lo: usize, hi: usize, out: *mut f32) {
    // SAFETY: forwarded.
    unsafe {
        match job.qtype {
            QuantType::Q8_0 => row1_of::<x86::Q8_0, N>(job, t, lo, hi, out),
            QuantType::Q4_0 => row1_of::<x86::Q4_0, N>(job, t, lo, hi, out),
            QuantType::Q4_1 => row1_of::<x86::Q4_1, N>(job, t, lo, hi, out),
            QuantType::Q5_0 => row1_of::<x86::Q5_0, N>(job, t, lo, hi, out),
            QuantType::Q5_1 => row1_of::<x86::Q5_1, N>(job, t, lo, hi, out),
            QuantType::IQ4NL => row1_of::<x86::Iq4Nl, N>(job, t, lo, hi, out),
            QuantType::MXFP4 => row1_of::<x86::Mxfp4, N>(job, t, lo, hi, out),
            QuantType::Q2K => row1_of::<Q2k, N>(job, t, lo, hi, out),
            QuantType::Q3K => row1_of::<Q3k, N>(job, t, lo, hi, out),
            QuantType::Q4K => row1_of::<Q4k, N>(job, t, lo, hi, out),
            QuantType::Q5K => row1_of::<Q5k, N>(job, t, lo, hi, out),
            QuantType::Q6K => row1_of::<Q6k, N>(job, t, lo, hi, out),
            QuantType::IQ4XS => row1_of::<Iq4Xs, N>(job, t, lo, hi, out),
            other => unreachable!("{} has no block-total kernel", other.name()),
        }
    }
}

/// The 16 rows' block scales from their blocks' first four bytes (a lane
/// each): the float16 `d` in the low half, or MXFP4's `2^(e - 128)` of the
/// low byte (`unpack.rs`'s floats: `(e - 1) << 23` from e = 2, the
/// subnormal `0x00200000 << e` below).
///
/// # Safety
/// AVX-512 F and F16C present.
#[inline(always)]
unsafe fn head_scales<L: Block>(head: __m512i) -> __m512 {
    // SAFETY: AVX-512 F and F16C present (caller).
    unsafe {
        if !L::E8M0 {
            return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(head));
        }
        let e = _mm512_and_si512(head, _mm512_set1_epi32(0xff));
        let one = _mm512_set1_epi32(1);
        let normal = _mm512_slli_epi32::<23>(_mm512_sub_epi32(e, one));
        let tiny = _mm512_sllv_epi32(_mm512_set1_epi32(0x0020_0000), e);
        let big = _mm512_cmpgt_epu32_mask(e, one);
        _mm512_castsi512_ps(_mm512_mask_blend_epi32(big, tiny, normal))
    }
}

/// The 16 lanes' int32 totals of `p[j]` (lanes 0-7 weight row `2j`, 8-15
/// row `2j + 1`): lane `i` the sum of row `i`'s eight lanes.
#[inline(always)]
unsafe fn totals(p: [__m512i; 8]) -> __m512i {
    // SAFETY: AVX-512 F present (caller).
    unsafe {
        // Rows 4i..4i + 4, four lanes each: a row's two 128-bit quarters added.
        let mut q = [_mm512_setzero_si512(); 4];
        for (i, q) in q.iter_mut().enumerate() {
            let (a, b) = (p[2 * i], p[2 * i + 1]);
            *q = _mm512_add_epi32(
                _mm512_shuffle_i64x2::<0x88>(a, b),
                _mm512_shuffle_i64x2::<0xdd>(a, b),
            );
        }
        // Rows 8i..8i + 8, two lanes each; then 16 rows, one lane each.
        let r0 = pairs(q[0], q[1]);
        let r1 = pairs(q[2], q[3]);
        pairs(r0, r1)
    }
}

/// [`totals`] by halves (groups of 16): lane `i` of the first result is
/// the sum of row `i`'s lanes 0-3 (its first 16 values), of the second its
/// lanes 4-7. Each row's four lanes of a half are a 128-bit quarter, so
/// two rounds of adjacent sums give a lane per (row, half), rows 0-7 in
/// the first register and 8-15 in the second, halves alternating.
#[inline(always)]
unsafe fn halves(p: [__m512i; 8]) -> [__m512i; 2] {
    // SAFETY: AVX-512 F present (caller).
    unsafe {
        let r = [
            pairs(p[0], p[1]),
            pairs(p[2], p[3]),
            pairs(p[4], p[5]),
            pairs(p[6], p[7]),
        ];
        let (lo, hi) = (pairs(r[0], r[1]), pairs(r[2], r[3]));
        let even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
        let odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
        [
            _mm512_permutex2var_epi32(lo, even, hi),
            _mm512_permutex2var_epi32(lo, odd, hi),
        ]
    }
}

/// Lanes `2i` and `2i + 1` of `a` then of `b` (32 lanes) added: lane `i`.
#[inline(always)]
unsafe fn pairs(a: __m512i, b: __m512i) -> __m512i {
    // SAFETY: AVX-512 F present (caller).
    unsafe {
        let even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
        let odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
        _mm512_add_epi32(
            _mm512_permutex2var_epi32(a, even, b),
            _mm512_permutex2var_epi32(a, odd, b),
        )
    }
}

/// [`row1`] for the format `L` and activation rows `t..t + N` (each
/// band's codes decoded once for the `N`): bands of 16 rows (the last
/// one's missing rows repeat row `hi - 1` and are not written); row
/// `t + i`'s outputs at `out + i * rows`.
#[inline(always)]
unsafe fn row1_of<L: Pairs, const N: usize>(
    job: &Job<'_>,
    t: usize,
    lo: usize,
    hi: usize,
    out: *mut f32,
) {
    let chunks = job.cols / 32;
    let rb = job.row_bytes;
    // Activation blocks of 32 or 256 (the K-quants): block c / per.
    let per = job.acts.block / 32;
    debug_assert!(t + N <= job.n);
    // Groups of 32 values, or of 16 (Q2_K, Q3_K, Q6_K); formats whose
    // scales are not a block's head: the band's scales (offsets) of group
    // g at g * 16 (16 * groups further), from `unpack.rs`.
    let groups = if L::G16 { 2 * chunks } else { chunks };
    // SAFETY: rows t..t + N of the activations (codes, scales, qsum).
    let (xq, xd, qsum): ([*const i8; N], [*const f32; N], [*const f32; N]) = unsafe {
        (
            std::array::from_fn(|i| job.acts.codes.as_ptr().add((t + i) * job.cols)),
            std::array::from_fn(|i| job.acts.scales.as_ptr().add((t + i) * chunks / per)),
            std::array::from_fn(|i| job.qsum.as_ptr().wrapping_add((t + i) * groups)),
        )
    };
    let mut kscales = vec![0.0f32; if L::UNPACKED { 2 * 16 * groups } else { 0 }];
    // MXFP4's E8M0 scales read by scalar loads through `unpack.rs`'s
    // 1 KiB table as each pair is decoded: the 16-lane gather a block column
    // (`vpgatherdd`) was 16% of its one-row kernel, waiting, where scalar
    // loads run beside the vector work (2880 x 2880, one thread: hot 345 ->
    // 288 us with `nibbles2`). The float16 formats keep the gather: their
    // 256 KiB table missed in cache on weights streamed from memory (Q4_0
    // cold 345 -> 390 us), and storing the halves for one `vcvtph2ps` was
    // no better.
    let heads = L::E8M0;
    // Unsigned codes: nibbles as stored, or the signed codes + 128.
    let bias: i32 = if L::SIGNED { 128 } else { i32::from(L::BIAS) };
    // SAFETY (whole body): rows lo..hi of `raw` hold `chunks` blocks of
    // L::BYTES (every row index below is clamped into lo..hi); `xq`/`xd`
    // rows of `cols` codes and `chunks` scales; `qsum` (offsets) one entry
    // per block; `out[lo..hi]` of each row is ours.
    unsafe {
        // -bias * sum x of each block (of each half of it: groups of 16),
        // row by row.
        let mut xsum = vec![[0i32; N]; chunks];
        let mut xsum16 = vec![[0i32; N]; if L::G16 { 2 * chunks } else { 0 }];
        for c in 0..chunks {
            for i in 0..N {
                let s: i32 = (0..32).map(|j| i32::from(*xq[i].add(32 * c + j))).sum();
                xsum[c][i] = -bias * s;
                if L::G16 {
                    let h: i32 = (0..16).map(|j| i32::from(*xq[i].add(32 * c + j))).sum();
                    xsum16[2 * c][i] = -bias * h;
                    xsum16[2 * c + 1][i] = -bias * (s - h);
                }
            }
        }
        let mut r = lo;
        while r < hi {
            let live = (hi - r).min(BAND);
            let row = |i: usize| job.raw.as_ptr().add((r + i.min(live - 1)) * rb);
            let (_, at) = band_rows(job, r, live);
            let base = row(0);
            if L::UNPACKED {
                band_scales::<L>(job, r, live, &mut kscales);
            }
            let mut acc = [_mm512_setzero_ps(); N];
            let mut off = [_mm512_setzero_ps(); N];
            // The band after the next one, a block column per block: a
            // decode step streams its weights from memory.
            let ahead = job.raw.as_ptr().wrapping_add((r + 2 * BAND) * rb);
            let span = BAND * L::BYTES;
            for c in 0..chunks {
                let mut line = 0;
                while line < span {
                    _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(c * span + line).cast());
                    line += 64;
                }
                let xv: [__m512i; N] = std::array::from_fn(|i| {
                    _mm512_broadcast_i64x4(_mm256_loadu_si256(xq[i].add(32 * c).cast()))
                });
                let mut p = [[_mm512_setzero_si512(); 8]; N];
                let mut sc = Scales([0.0; 16]);
                for j in 0..8 {
                    if heads {
                        for h in 0..2 {
                            let e = *row(2 * j + h).add(c * L::BYTES);
                            sc.0[2 * j + h] = *E8M0_HALF.get_unchecked(usize::from(e));
                        }
                    }
                    let u = L::unsigned2(row(2 * j), row(2 * j + 1), c);
                    for (p, xv) in p.iter_mut().zip(&xv) {
                        p[j] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, *xv);
                    }
                }
                if L::G16 {
                    // Lanes 0-3 of a row are its first 16 values, 4-7 the rest:
                    // each half totalled and scaled alone, in order.
                    for i in 0..N {
                        let both = halves(p[i]);
                        for (h, half) in both.into_iter().enumerate() {
                            let tt = _mm512_add_epi32(
                                half,
                                _mm512_set1_epi32(xsum16.get_unchecked(2 * c + h)[i]),
                            );
                            let scale = _mm512_loadu_ps(kscales.as_ptr().add((2 * c + h) * 16));
                            let cf = _mm512_mul_ps(scale, _mm512_set1_ps(*xd[i].add(c / per)));
                            acc[i] =
                                _mm512_add_ps(acc[i], _mm512_mul_ps(cf, _mm512_cvtepi32_ps(tt)));
                            if L::OFFSET {
                                let g = 2 * c + h;
                                let o = _mm512_loadu_ps(kscales.as_ptr().add((groups + g) * 16));
                                let q = _mm512_set1_ps(*qsum[i].add(g));
                                off[i] = _mm512_add_ps(off[i], _mm512_mul_ps(o, q));
                            }
                        }
                    }
                    continue;
                }
                // Each block's first four bytes: its float16 scale (and a
                // Q4_1 / Q5_1 offset above it), or MXFP4's `e`.
                let head = if L::UNPACKED || heads {
                    _mm512_setzero_si512()
                } else {
                    _mm512_i32gather_epi32::<1>(at, base.add(c * L::BYTES).cast())
                };
                let scale = if L::UNPACKED {
                    _mm512_loadu_ps(kscales.as_ptr().add(c * 16))
                } else if heads {
                    _mm512_load_ps(sc.0.as_ptr())
                } else {
                    head_scales::<L>(head)
                };
                let o = if !L::OFFSET {
                    _mm512_setzero_ps()
                } else if L::UNPACKED {
                    _mm512_loadu_ps(kscales.as_ptr().add((chunks + c) * 16))
                } else {
                    let m = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(head)));
                    _mm512_sub_ps(_mm512_setzero_ps(), m)
                };
                for i in 0..N {
                    let tt =
                        _mm512_add_epi32(totals(p[i]), _mm512_set1_epi32(xsum.get_unchecked(c)[i]));
                    let cf = _mm512_mul_ps(scale, _mm512_set1_ps(*xd[i].add(c / per)));
                    acc[i] = _mm512_add_ps(acc[i], _mm512_mul_ps(cf, _mm512_cvtepi32_ps(tt)));
                    if L::OFFSET {
                        let q = _mm512_set1_ps(*qsum[i].add(c));
                        off[i] = _mm512_add_ps(off[i], _mm512_mul_ps(o, q));
                    }
                }
            }
            let mask = if live == BAND {
                !0u16
            } else {
                (1u16 << live) - 1
            };
            for i in 0..N {
                let v = if L::OFFSET {
                    _mm512_sub_ps(acc[i], off[i])
                } else {
                    acc[i]
                };
                _mm512_mask_storeu_ps(out.add(i * job.rows + r), mask, v);
            }
            r += live;
        }
    }
}

/// Rows `lo..hi` of `job` (`n >= 2` activation rows, a format [`covers`]
/// takes): bands of 16 weight rows decoded straight from their blocks into
/// codes interleaved by pairs, times slabs of 8 activation rows.
///
/// # Safety
/// As [`row1`], with `out` holding `n * rows` floats.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn rows(job: &Job<'_>, lo: usize, hi: usize, out: *mut f32, s: &mut Scratch) {
    // SAFETY: forwarded.
    unsafe {
        match job.qtype {
            QuantType::Q8_0 => rows_of::<x86::Q8_0>(job, lo, hi, out, s),
            QuantType::Q4_0 => rows_of::<x86::Q4_0>(job, lo, hi, out, s),
            QuantType::Q4_1 => rows_of::<x86::Q4_1>(job, lo, hi, out, s),
            QuantType::Q5_0 => rows_of::<x86::Q5_0>(job, lo, hi, out, s),
            QuantType::Q5_1 => rows_of::<x86::Q5_1>(job, lo, hi, out, s),
            QuantType::IQ4NL => rows_of::<x86::Iq4Nl>(job, lo, hi, out, s),
            QuantType::MXFP4 => rows_of::<x86::Mxfp4>(job, lo, hi, out, s),
            QuantType::Q2K => rows_of::<Q2k>(job, lo, hi, out, s),
            QuantType::Q3K => rows_of::<Q3k>(job, lo, hi, out, s),
            QuantType::Q4K => rows_of::<Q4k>(job, lo, hi, out, s),
            QuantType::Q5K => rows_of::<Q5k>(job, lo, hi, out, s),
            QuantType::Q6K => rows_of::<Q6k>(job, lo, hi, out, s),
            QuantType::IQ4XS => rows_of::<Iq4Xs>(job, lo, hi, out, s),
            other => unreachable!("{} has no block-total kernel", other.name()),
        }
    }
}

/// [`rows`] for the format `L`.
#[inline(always)]
unsafe fn rows_of<L: Pairs>(job: &Job<'_>, lo: usize, hi: usize, out: *mut f32, s: &mut Scratch) {
    let (k, n) = (job.cols, job.n);
    let chunks = k / 32;
    let slabs = n.div_ceil(SLAB);
    let offsets = L::OFFSET;
    // The codes go in as `code + 2^shift` (none for Q4_1, Q5_1).
    let shift: Option<u32> = if L::SIGNED {
        Some(7)
    } else if L::BIAS != 0 {
        Some(L::BIAS.trailing_zeros())
    } else {
        None
    };
    debug_assert!(L::SIGNED || L::BIAS == 0 || L::BIAS.count_ones() == 1);
    // AMX for Q8_0, whose codes it reads in place: the nibble formats'
    // decoding into rows for it measured no faster than their `vpdpbusd`
    // tiles (0.9-1.1x at 2-16 rows), Q8_0 1.4-1.7x at 8-16.
    let amx = job.amx && L::SIGNED && L::BYTES == 34;
    // The tables of the path taken (built by the first product of these
    // activations that takes it).
    // SAFETY: AVX-512 F/BW/VNNI present (caller).
    let tables = unsafe {
        if amx {
            Tables::Amx(amx_slabs(job.acts))
        } else {
            Tables::Vnni(acts_slabs(job.acts))
        }
    };
    // Once per call: qsum in the slabs' lanes (offsets), a group (of 32,
    // or of 16: Q2_K) at a time.
    let groups = if L::G16 { 2 * chunks } else { chunks };
    s.sq.clear();
    s.sq.resize(if offsets { slabs * groups * 16 } else { 0 }, 0.0);
    s.sq2.clear();
    s.sq2
        .resize(if offsets { slabs * groups * 16 } else { 0 }, 0.0);
    if offsets {
        for t in 0..n {
            let (sl, m) = (t / SLAB, t % SLAB);
            for g in 0..groups {
                let q = job.qsum[t * groups + g];
                let at = (sl * groups + g) * 16;
                s.sq[at + 2 * m] = q;
                s.sq[at + 2 * m + 1] = q;
                s.sq2[at + m] = q;
                s.sq2[at + 8 + m] = q;
            }
        }
    }
    if amx {
        s.codes.resize(BAND * k, 0);
        s.scale.resize(chunks, 0.0);
        s.offset.resize(chunks, 0.0);
        // SAFETY: job.amx only where `amx::available`.
        unsafe { amx::configure() };
    }
    // A band: pair j's quarter q of block c at (j * chunks + c) * 8 + q, the
    // two rows' four unsigned codes side by side; block c's scales
    // (offsets) of the 16 rows at c * 16.
    s.wband.resize(BAND / 2 * chunks * 8, 0);
    s.sband.resize(BAND * groups, 0.0);
    s.oband.resize(if offsets { BAND * groups } else { 0 }, 0.0);
    let rb = job.row_bytes;
    let mut r = lo;
    while r < hi {
        let live = (hi - r).min(BAND);
        // The band after the next one, a block column per block (as in
        // `row1_of`).
        let ahead = job.raw.as_ptr().wrapping_add((r + 2 * BAND) * rb);
        let span = BAND * L::BYTES;
        // SAFETY (whole block): rows r..r + live of `raw` hold `chunks`
        // blocks of L::BYTES (missing rows repeat row r + live - 1); the
        // band's buffers are sized above.
        unsafe {
            let row = |i: usize| job.raw.as_ptr().add((r + i.min(live - 1)) * rb);
            let (_, at) = band_rows(job, r, live);
            let w = s.wband.as_mut_ptr().cast::<__m256i>();
            // AMX reads the signed codes row by row: Q8_0's in place (a
            // whole band), a short band's copied (its last row repeated).
            let in_place = amx && live == BAND;
            if amx && !in_place {
                let dst = s.codes.as_mut_ptr();
                for c in 0..chunks {
                    for j in 0..BAND / 2 {
                        let (a, b) = (
                            row(2 * j).add(c * L::BYTES),
                            row(2 * j + 1).add(c * L::BYTES),
                        );
                        let (ca, cb) = L::codes2(a, b);
                        _mm256_storeu_si256(dst.add(2 * j * k + 32 * c).cast(), ca);
                        _mm256_storeu_si256(dst.add((2 * j + 1) * k + 32 * c).cast(), cb);
                    }
                }
            }
            for c in 0..chunks {
                // AMX's blocks prefetch as they go (`amx_tile`): a burst
                // here, with no work between the prefetches, starved its
                // tile loads on weights streamed from memory.
                let mut line = 0;
                while line < span && !amx {
                    _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(c * span + line).cast());
                    line += 64;
                }
                for j in 0..BAND / 2 {
                    if amx {
                        break;
                    }
                    let dst = w.add((j * chunks + c) * 2);
                    if L::UNPACKED {
                        // Both rows decoded in one register, their four-code
                        // quarters interleaved by one permutation.
                        let both = L::stored2(row(2 * j), row(2 * j + 1), c);
                        // Signed codes go in as `code + 128`.
                        let both = if L::SIGNED {
                            _mm512_xor_si512(both, _mm512_set1_epi8(-128))
                        } else {
                            both
                        };
                        let order =
                            _mm512_setr_epi32(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15);
                        _mm512_storeu_si512(dst.cast(), _mm512_permutexvar_epi32(order, both));
                        continue;
                    }
                    let (q03, q47) = L::pair_at(row(2 * j), row(2 * j + 1), c);
                    _mm256_storeu_si256(dst, q03);
                    _mm256_storeu_si256(dst.add(1), q47);
                }
                if L::UNPACKED {
                    continue;
                }
                let head = _mm512_i32gather_epi32::<1>(at, row(0).add(c * L::BYTES).cast());
                let scale = head_scales::<L>(head);
                _mm512_storeu_ps(s.sband.as_mut_ptr().add(c * 16), scale);
                if offsets {
                    let m = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(head)));
                    let o = _mm512_sub_ps(_mm512_setzero_ps(), m);
                    _mm512_storeu_ps(s.oband.as_mut_ptr().add(c * 16), o);
                }
            }
        }
        if L::UNPACKED {
            // The band's scales and offsets: block c's at c * 16 (as the
            // gathers above lay them out).
            s.kband.resize(2 * 16 * groups, 0.0);
            // SAFETY: AVX-512 F present (caller); kband sized above.
            unsafe { band_scales::<L>(job, r, live, &mut s.kband) };
            s.sband.copy_from_slice(&s.kband[..16 * groups]);
            if offsets {
                s.oband.copy_from_slice(&s.kband[16 * groups..]);
            }
        }
        for sl in 0..slabs {
            // SAFETY: the slab's tables and the band are filled; out is n x rows.
            unsafe {
                match tables {
                    Tables::Amx(tables) => {
                        let (a, stride, cstride) = if live == BAND {
                            (job.raw.as_ptr().add(r * rb + 2).cast::<i8>(), rb, 34)
                        } else {
                            (s.codes.as_ptr(), k, 32)
                        };
                        let band = AmxBand {
                            a,
                            stride,
                            cstride,
                            ahead: if sl == 0 { ahead } else { std::ptr::null() },
                            span,
                        };
                        amx_tile(job, tables, s, &band, r, live, sl, offsets, out);
                    }
                    Tables::Vnni(tables) => {
                        tile(job, tables, s, r, live, sl, shift, offsets, L::G16, out)
                    }
                }
            }
        }
        r += live;
    }
    if amx {
        // SAFETY: configured above.
        unsafe { amx::release() };
    }
}

/// The activations' tables for the path a product takes.
#[derive(Clone, Copy)]
enum Tables<'a> {
    Amx(&'a AmxSlabs),
    Vnni(&'a Slabs),
}

/// Where an AMX band's signed codes lie: row `i`, block `c` at
/// `a + i * stride + c * cstride`.
struct AmxBand {
    a: *const i8,
    stride: usize,
    cstride: usize,
    /// The band after the next one (null: prefetched already), `span`
    /// bytes of it a block.
    ahead: *const u8,
    span: usize,
}

/// Writes a band's outputs of slab `sl`: pair `j`'s lane `2m + h` (or
/// `8h + m` when `by_row`) is weight row `r + 2j + h` times activation row
/// `8 sl + m`; rows past `live` and `n` are not written.
///
/// # Safety
/// AVX-512 F present; out is n x rows.
#[inline(always)]
unsafe fn store(
    job: &Job<'_>,
    acc: &[__m512; BAND / 2],
    r: usize,
    live: usize,
    sl: usize,
    by_row: bool,
    out: *mut f32,
) {
    let (n, rows) = (job.n, job.rows);
    let mut v = [0.0f32; 16];
    for (j, acc) in acc.iter().enumerate() {
        if 2 * j >= live {
            break;
        }
        // SAFETY: AVX-512 F present (caller); 16 floats.
        unsafe { _mm512_storeu_ps(v.as_mut_ptr(), *acc) };
        for m in 0..SLAB.min(n.saturating_sub(sl * SLAB)) {
            for h in 0..2.min(live - 2 * j) {
                let lane = if by_row { 8 * h + m } else { 2 * m + h };
                // SAFETY: (sl * SLAB + m, r + 2j + h) inside the output.
                unsafe { *out.add((sl * SLAB + m) * rows + r + 2 * j + h) = v[lane] };
            }
        }
    }
}

/// Sixteen rows' block scales, aligned for one load.
#[repr(C, align(64))]
struct Scales([f32; 16]);

/// The first row of the band `r..r + live` and its 16 rows' byte offsets
/// from it, one lane each (missing rows repeat the last): the gathers'
/// indices.
///
/// # Safety
/// AVX-512 F present; rows `r..r + live` of the job exist.
#[inline(always)]
unsafe fn band_rows(job: &Job<'_>, r: usize, live: usize) -> (*const u8, __m512i) {
    let mut at = [0i32; BAND];
    for (i, at) in at.iter_mut().enumerate() {
        *at = (i.min(live - 1) * job.row_bytes) as i32;
    }
    // SAFETY: forwarded; row r exists.
    unsafe {
        (
            job.raw.as_ptr().add(r * job.row_bytes),
            _mm512_loadu_si512(at.as_ptr().cast()),
        )
    }
}

/// Lanes 0-7 `2j`, lanes 8-15 `2j + 1`: pair `j`'s rows from 16 lanes.
#[inline(always)]
unsafe fn pick(j: usize) -> __m512i {
    // SAFETY: AVX-512 F present (caller).
    unsafe {
        _mm512_mask_blend_epi32(
            0xff00,
            _mm512_set1_epi32(2 * j as i32),
            _mm512_set1_epi32(2 * j as i32 + 1),
        )
    }
}

/// Block totals in memory: 16 weight rows x 8 activation rows.
#[repr(C, align(64))]
struct Totals([i32; 128]);

/// [`tile`] with the totals from AMX: lanes `8h + m` of pair `j` are
/// weight row `2j + h` times activation row `m` (the totals' memory
/// order), the same float operations.
///
/// # Safety
/// As [`tile`]; AMX configured on this thread; the band's 16 rows of codes
/// readable.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn amx_tile(
    job: &Job<'_>,
    tables: &AmxSlabs,
    s: &Scratch,
    band: &AmxBand,
    r: usize,
    live: usize,
    sl: usize,
    offsets: bool,
    out: *mut f32,
) {
    const P: usize = BAND / 2;
    let chunks = job.cols / 32;
    // SAFETY (whole body): the tables hold `chunks` blocks of this slab and
    // the band's scales; out is n x rows.
    unsafe {
        let xb = tables.b.as_ptr().add(sl * chunks * 4).cast::<i8>();
        let d2 = tables.d2.as_ptr().add(sl * chunks * 16);
        let mut totals = [Totals([0; 128]), Totals([0; 128])];
        let mut acc = [_mm512_setzero_ps(); P];
        // Block c + 1's totals start before block c's float work: the tile
        // unit and the vector units overlap.
        let issue = |c: usize, totals: &mut [Totals; 2]| {
            let w = band.a.add(c * band.cstride);
            let tt = totals[c % 2].0.as_mut_ptr();
            if c.is_multiple_of(2) {
                amx::block::<false>(w, band.stride, xb.add(c * 256), tt);
            } else {
                amx::block::<true>(w, band.stride, xb.add(c * 256), tt);
            }
        };
        issue(0, &mut totals);
        for c in 0..chunks {
            if c + 1 < chunks {
                issue(c + 1, &mut totals);
            }
            if !band.ahead.is_null() {
                let mut line = 0;
                while line < band.span {
                    let at = band.ahead.wrapping_add(c * band.span + line);
                    _mm_prefetch::<_MM_HINT_T0>(at.cast());
                    line += 64;
                }
            }
            let tt = totals[c % 2].0.as_ptr();
            let sc16 = _mm512_loadu_ps(s.sband.as_ptr().add(c * 16));
            let d = _mm512_loadu_ps(d2.add(c * 16));
            for (j, acc) in acc.iter_mut().enumerate() {
                let v = _mm512_load_si512(tt.add(16 * j).cast());
                let cf = _mm512_mul_ps(_mm512_permutexvar_ps(pick(j), sc16), d);
                *acc = _mm512_add_ps(*acc, _mm512_mul_ps(cf, _mm512_cvtepi32_ps(v)));
            }
        }
        if offsets {
            let qs = s.sq2.as_ptr().add(sl * chunks * 16);
            let mut off = [_mm512_setzero_ps(); P];
            for c in 0..chunks {
                let of16 = _mm512_loadu_ps(s.oband.as_ptr().add(c * 16));
                let q = _mm512_loadu_ps(qs.add(c * 16));
                for (j, off) in off.iter_mut().enumerate() {
                    let o = _mm512_permutexvar_ps(pick(j), of16);
                    *off = _mm512_add_ps(*off, _mm512_mul_ps(o, q));
                }
            }
            for (acc, off) in acc.iter_mut().zip(off) {
                *acc = _mm512_sub_ps(*acc, off);
            }
        }
        store(job, &acc, r, live, sl, true, out);
    }
}

/// The slab tables of `acts` (block 32), built on first use.
///
/// # Safety
/// AVX-512 F/BW/VNNI present.
#[inline(always)]
unsafe fn acts_slabs(acts: &QActs) -> &Slabs {
    // SAFETY: forwarded.
    acts.slabs.0.get_or_init(|| unsafe { build_slabs(acts) })
}

/// The AMX tables of `acts`, built on first use.
///
/// # Safety
/// As [`acts_slabs`].
#[inline(always)]
unsafe fn amx_slabs(acts: &QActs) -> &AmxSlabs {
    // SAFETY: forwarded.
    acts.slabs
        .1
        .get_or_init(|| unsafe { build_amx_slabs(acts) })
}

/// Quarters `q` (lines 0 and 2 of the result's four 128-bit lanes) and
/// `q + 1` of a slab's block, each row's quarter in two adjacent lanes: the
/// eight rows' blocks come as four registers of two rows each.
///
/// # Safety
/// AVX-512 F present.
#[inline(always)]
unsafe fn slab_block(acts: &QActs, sl: usize, c: usize) -> [__m512i; 8] {
    let (k, n) = (acts.cols, acts.codes.len() / acts.cols);
    // SAFETY (whole body): rows below n hold block c.
    unsafe {
        let row = |m: usize| {
            let t = sl * SLAB + m;
            if t < n {
                _mm256_loadu_si256(acts.codes.as_ptr().add(t * k + c * 32).cast())
            } else {
                _mm256_setzero_si256()
            }
        };
        let two = |m: usize| _mm512_inserti64x4::<1>(_mm512_castsi256_si512(row(m)), row(m + 1));
        let rows = [two(0), two(2), two(4), two(6)];
        // Rows 0-3 of the pair's first register pair (lanes 0-7 then 8-15 of
        // each, 16 apart across the two): quarter q duplicated, then q + 1.
        let base = _mm512_setr_epi32(0, 0, 8, 8, 16, 16, 24, 24, 1, 1, 9, 9, 17, 17, 25, 25);
        let mut lines = [_mm512_setzero_si512(); 8];
        for q in (0..8).step_by(2) {
            let idx = _mm512_add_epi32(base, _mm512_set1_epi32(q as i32));
            let lo = _mm512_permutex2var_epi32(rows[0], idx, rows[1]);
            let hi = _mm512_permutex2var_epi32(rows[2], idx, rows[3]);
            lines[q] = _mm512_shuffle_i64x2::<0b01_00_01_00>(lo, hi);
            lines[q + 1] = _mm512_shuffle_i64x2::<0b11_10_11_10>(lo, hi);
        }
        lines
    }
}

/// Block `c`'s scale of slab `sl`'s rows (zero past the last row).
fn slab_scales(acts: &QActs, sl: usize, c: usize) -> [f32; SLAB] {
    let (k, n) = (acts.cols, acts.codes.len() / acts.cols);
    let (chunks, per) = (k / 32, acts.block / 32);
    let mut d = [0.0f32; SLAB];
    for (m, d) in d.iter_mut().enumerate() {
        let t = sl * SLAB + m;
        if t < n {
            // Blocks of 32 or 256 (the K-quants): block c / per.
            *d = acts.scales[(t * chunks + c) / per];
        }
    }
    d
}

/// A line from a register.
///
/// # Safety
/// AVX-512 F present.
#[inline(always)]
unsafe fn line(v: __m512i) -> Line {
    let mut l = Line::default();
    // SAFETY: a line is 64 aligned bytes.
    unsafe { _mm512_store_si512(l.0.as_mut_ptr().cast(), v) };
    l
}

/// [`Slabs`] of `acts`: the codes moved by permutations (one load per row
/// and block) and the block sums by `vpdpbusd` against ones.
///
/// # Safety
/// AVX-512 F/BW/VNNI present.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn build_slabs(acts: &QActs) -> Slabs {
    let (k, n) = (acts.cols, acts.codes.len() / acts.cols);
    let chunks = k / 32;
    let slabs = n.div_ceil(SLAB);
    let mut t = Slabs {
        x: Vec::with_capacity(slabs * chunks * 8),
        negsum: Vec::with_capacity(slabs * chunks),
        negsum16: Vec::with_capacity(slabs * chunks * 2),
        d: Vec::with_capacity(slabs * chunks * 16),
    };
    let ones = _mm512_set1_epi8(1);
    for sl in 0..slabs {
        for c in 0..chunks {
            // SAFETY: AVX-512 present (caller).
            unsafe {
                let lines = slab_block(acts, sl, c);
                let (mut first, mut second) = (_mm512_setzero_si512(), _mm512_setzero_si512());
                for (q, &v) in lines.iter().enumerate() {
                    t.x.push(line(v));
                    if q < 4 {
                        first = _mm512_dpbusd_epi32(first, ones, v);
                    } else {
                        second = _mm512_dpbusd_epi32(second, ones, v);
                    }
                }
                let zero = _mm512_setzero_si512();
                let sum = _mm512_add_epi32(first, second);
                t.negsum.push(line(_mm512_sub_epi32(zero, sum)));
                t.negsum16.push(line(_mm512_sub_epi32(zero, first)));
                t.negsum16.push(line(_mm512_sub_epi32(zero, second)));
            }
            for d in slab_scales(acts, sl, c) {
                t.d.extend([d, d]);
            }
        }
    }
    t
}

/// [`AmxSlabs`] of `acts`.
///
/// # Safety
/// AVX-512 F/BW/VNNI present.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn build_amx_slabs(acts: &QActs) -> AmxSlabs {
    let (k, n) = (acts.cols, acts.codes.len() / acts.cols);
    let chunks = k / 32;
    let slabs = n.div_ceil(SLAB);
    let mut t = AmxSlabs {
        b: Vec::with_capacity(slabs * chunks * 4),
        d2: Vec::with_capacity(slabs * chunks * 16),
    };
    // Lanes 2m of quarters 2p and 2p + 1: rows 0-7 of each.
    let even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    for sl in 0..slabs {
        for c in 0..chunks {
            // SAFETY: AVX-512 present (caller).
            unsafe {
                let lines = slab_block(acts, sl, c);
                for p in 0..4 {
                    let v = _mm512_permutex2var_epi32(lines[2 * p], even, lines[2 * p + 1]);
                    t.b.push(line(v));
                }
            }
            let d = slab_scales(acts, sl, c);
            t.d2.extend(d);
            t.d2.extend(d);
        }
    }
    t
}

/// A 32-value-block format's codes of one block of two rows, unsigned
/// (`code + BIAS`, or `code + 128` for signed formats), interleaved by
/// quarters: `[a q0, b q0, a q1, b q1, a q2, b q2, a q3, b q3]` then the
/// same for quarters 4-7 (four bytes each).
trait Pairs: Block {
    /// Scales and offsets from `unpack.rs` ([`band_scales`]), not from
    /// each block's head; block `c` at [`Pairs::stored_at`].
    const UNPACKED: bool = false;
    /// Groups of 16 values (two scales a block, Q6_K): each half of a
    /// block totalled and scaled alone.
    const G16: bool = false;

    /// Block `c`'s 32 codes as stored, of the row at `row`.
    ///
    /// # Safety
    /// AVX2 present; the row holds block `c`.
    #[inline(always)]
    unsafe fn stored_at(row: *const u8, c: usize) -> __m256i {
        // SAFETY: forwarded.
        unsafe { Self::stored(row.add(c * Self::BYTES)) }
    }

    /// Block `c`'s codes as stored of the rows at `a` (low half) and `b`.
    ///
    /// # Safety
    /// AVX-512 F present; both rows hold block `c`.
    #[inline(always)]
    unsafe fn stored2(a: *const u8, b: *const u8, c: usize) -> __m512i {
        // SAFETY: forwarded.
        unsafe {
            _mm512_inserti64x4::<1>(
                _mm512_castsi256_si512(Self::stored_at(a, c)),
                Self::stored_at(b, c),
            )
        }
    }

    /// [`Pairs::stored2`] as the unsigned codes [`row1`] multiplies
    /// (`code + 128` for signed formats).
    ///
    /// # Safety
    /// AVX-512 F/BW present; both rows hold block `c`.
    #[inline(always)]
    unsafe fn unsigned2(a: *const u8, b: *const u8, c: usize) -> __m512i {
        // SAFETY: forwarded.
        unsafe {
            let w = Self::stored2(a, b, c);
            if Self::SIGNED {
                _mm512_xor_si512(w, _mm512_set1_epi8(-128))
            } else {
                w
            }
        }
    }

    /// [`Pairs::pair`] of block `c` of the rows at `a` and `b` (formats
    /// with [`Pairs::UNPACKED`] scales are interleaved from
    /// [`Pairs::stored2`] instead, one permutation for both rows).
    ///
    /// # Safety
    /// AVX2 present; both rows hold block `c`.
    #[inline(always)]
    unsafe fn pair_at(a: *const u8, b: *const u8, c: usize) -> (__m256i, __m256i) {
        // SAFETY: forwarded.
        unsafe { Self::pair(a.add(c * Self::BYTES), b.add(c * Self::BYTES)) }
    }

    /// The two blocks' 32 signed codes each (AMX reads a short band's
    /// codes row by row).
    ///
    /// # Safety
    /// AVX2 present; `BYTES` readable bytes at `a` and at `b`.
    #[inline(always)]
    unsafe fn codes2(a: *const u8, b: *const u8) -> (__m256i, __m256i) {
        // SAFETY: forwarded.
        unsafe { (Self::codes(a), Self::codes(b)) }
    }

    /// # Safety
    /// AVX2 present; `BYTES` readable bytes at `a` and at `b`.
    #[inline(always)]
    unsafe fn pair(a: *const u8, b: *const u8) -> (__m256i, __m256i) {
        // SAFETY: forwarded.
        unsafe {
            let (mut sa, mut sb) = (Self::stored(a), Self::stored(b));
            if Self::SIGNED {
                let flip = _mm256_set1_epi8(-128);
                sa = _mm256_xor_si256(sa, flip);
                sb = _mm256_xor_si256(sb, flip);
            }
            // [a0 b0 a1 b1 | a4 b4 a5 b5] and [a2 b2 a3 b3 | a6 b6 a7 b7].
            let lo = _mm256_unpacklo_epi32(sa, sb);
            let hi = _mm256_unpackhi_epi32(sa, sb);
            (
                _mm256_permute2x128_si256::<0x20>(lo, hi),
                _mm256_permute2x128_si256::<0x31>(lo, hi),
            )
        }
    }
}

/// Nibble blocks (16 bytes at `skip`): the low nibbles are codes 0-15, the
/// high ones 16-31; `[low a | low b]` and `[high a | high b]` permuted.
///
/// # Safety
/// AVX2 present; 16 readable bytes at `a + skip` and `b + skip`.
#[inline(always)]
unsafe fn nibble_pair(a: *const u8, b: *const u8, skip: usize) -> (__m256i, __m256i) {
    // SAFETY: forwarded.
    unsafe {
        let v = _mm256_loadu2_m128i(b.add(skip).cast(), a.add(skip).cast());
        let m = _mm256_set1_epi8(15);
        let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        let low = _mm256_and_si256(v, m);
        let high = _mm256_and_si256(_mm256_srli_epi16::<4>(v), m);
        (
            _mm256_permutevar8x32_epi32(low, order),
            _mm256_permutevar8x32_epi32(high, order),
        )
    }
}

/// Block `c`'s nibbles (16 bytes at `skip` of each block) of the rows at
/// `a` and `b`, as [`Pairs::stored2`] lays out their codes: `a`'s low
/// nibbles, its high ones, then `b`'s, a byte each. Both rows are split
/// in one register (one shift, one mask) where decoding them one by one
/// took two of each and three insertions: the code-book formats' [`row1`]
/// 1.08x faster on MXFP4 (2880 x 2880 hot, one thread, 308 -> 285 us), on
/// IQ4_NL 1.03x; Q4_0's plain nibbles measured 6% slower this way (no
/// lookup to share), so it keeps [`Pairs::stored2`].
///
/// # Safety
/// AVX-512 F present; 16 readable bytes at `skip` of block `c` of each row.
#[inline(always)]
unsafe fn nibbles2<L: Block>(a: *const u8, b: *const u8, c: usize, skip: usize) -> __m512i {
    // SAFETY: forwarded.
    unsafe {
        let at = c * L::BYTES + skip;
        // [a | b], then [a | b | a >> 4 | b >> 4] (per 16-bit lane: each
        // byte's high nibble lands in its low four bits, masked below).
        let v = _mm256_loadu2_m128i(b.add(at).cast(), a.add(at).cast());
        let z = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(v), _mm256_srli_epi16::<4>(v));
        // [a, a >> 4, b, b >> 4].
        let z = _mm512_shuffle_i64x2::<0b11_01_10_00>(z, z);
        _mm512_and_si512(z, _mm512_set1_epi8(15))
    }
}

/// A code book's 16 values plus 128 (unsigned), in each 128-bit lane.
#[inline(always)]
unsafe fn book_unsigned(values: &[i8; 16]) -> __m512i {
    // SAFETY: AVX-512 F present (caller); 16 bytes.
    unsafe {
        _mm512_xor_si512(
            _mm512_broadcast_i32x4(_mm_loadu_si128(values.as_ptr().cast())),
            _mm512_set1_epi8(-128),
        )
    }
}

impl Pairs for x86::Q8_0 {}
impl Pairs for x86::Q5_0 {}
impl Pairs for x86::Q5_1 {}
impl Pairs for x86::Q4_0 {
    #[inline(always)]
    unsafe fn pair(a: *const u8, b: *const u8) -> (__m256i, __m256i) {
        // SAFETY: forwarded; nibbles after `d`.
        unsafe { nibble_pair(a, b, 2) }
    }
}
impl Pairs for x86::Q4_1 {
    #[inline(always)]
    unsafe fn pair(a: *const u8, b: *const u8) -> (__m256i, __m256i) {
        // SAFETY: forwarded; nibbles after `d`, `m`.
        unsafe { nibble_pair(a, b, 4) }
    }
}
impl Pairs for x86::Mxfp4 {
    #[inline(always)]
    unsafe fn unsigned2(a: *const u8, b: *const u8, c: usize) -> __m512i {
        // SAFETY: forwarded; nibbles after `e` index the book.
        unsafe {
            let t = book_unsigned(&crate::quant::unpack::MXFP4_VALUES);
            _mm512_shuffle_epi8(t, nibbles2::<Self>(a, b, c, 1))
        }
    }
    #[inline(always)]
    unsafe fn pair(a: *const u8, b: *const u8) -> (__m256i, __m256i) {
        // SAFETY: forwarded; nibbles after `e` index the book, + 128.
        unsafe {
            let t = _mm256_broadcastsi128_si256(_mm_loadu_si128(
                crate::quant::unpack::MXFP4_VALUES.as_ptr().cast(),
            ));
            let t = _mm256_xor_si256(t, _mm256_set1_epi8(-128));
            let (lo, hi) = nibble_pair(a, b, 1);
            (_mm256_shuffle_epi8(t, lo), _mm256_shuffle_epi8(t, hi))
        }
    }
}
impl Pairs for x86::Iq4Nl {
    #[inline(always)]
    unsafe fn unsigned2(a: *const u8, b: *const u8, c: usize) -> __m512i {
        // SAFETY: forwarded; nibbles after `d` index the book.
        unsafe {
            let t = book_unsigned(&crate::quant::unpack::IQ4_VALUES);
            _mm512_shuffle_epi8(t, nibbles2::<Self>(a, b, c, 2))
        }
    }
    #[inline(always)]
    unsafe fn pair(a: *const u8, b: *const u8) -> (__m256i, __m256i) {
        // SAFETY: forwarded; nibbles after `d` index the table, + 128.
        unsafe {
            let t = _mm256_broadcastsi128_si256(_mm_loadu_si128(
                crate::quant::unpack::IQ4_VALUES.as_ptr().cast(),
            ));
            let t = _mm256_xor_si256(t, _mm256_set1_epi8(-128));
            let (lo, hi) = nibble_pair(a, b, 2);
            (_mm256_shuffle_epi8(t, lo), _mm256_shuffle_epi8(t, hi))
        }
    }
}

/// Q4_K as eight blocks of 32 values a 256-value block (144 bytes: `d`,
/// `dmin`, twelve bytes of 6-bit scales and mins, 128 bytes of nibbles:
/// values `64i..64i + 32` the low nibbles of bytes `32i..`, the next 32 the
/// high ones): codes 0-15 unsigned, scale `d * sc_j` and offset
/// `dmin * m_j` of block `j` as `unpack.rs` computes them.
struct Q4k;

impl Q4k {
    /// Block `c`'s 32 nibbles' bytes, and whether they are the high ones.
    #[inline(always)]
    fn at(c: usize) -> (usize, bool) {
        ((c / 8) * 144 + 16 + 32 * ((c % 8) / 2), c % 2 == 1)
    }
}

impl Block for Q4k {
    /// A 256-value block's bytes over its eight blocks of 32 (prefetching:
    /// a band's rows are whole blocks of 144).
    const BYTES: usize = 18;
    const OFFSET: bool = true;
    unsafe fn stored(_: *const u8) -> __m256i {
        unreachable!("Q4_K blocks are read with stored2")
    }
}

impl Pairs for Q4k {
    const UNPACKED: bool = true;

    #[inline(always)]
    unsafe fn stored2(a: *const u8, b: *const u8, c: usize) -> __m512i {
        let (at, high) = Self::at(c);
        // SAFETY: forwarded; both rows' nibbles in one register.
        unsafe {
            let v = _mm512_inserti64x4::<1>(
                _mm512_castsi256_si512(_mm256_loadu_si256(a.add(at).cast())),
                _mm256_loadu_si256(b.add(at).cast()),
            );
            let v = if high { _mm512_srli_epi16::<4>(v) } else { v };
            _mm512_and_si512(v, _mm512_set1_epi8(15))
        }
    }
}

/// Q5_K as eight blocks of 32 values a 256-value block (176 bytes: `d`,
/// `dmin`, Q4_K's twelve bytes of scales and mins, 32 bytes of high bits
/// `qh`, 128 bytes of nibbles laid out as Q4_K's): block `j`'s codes are
/// its nibbles plus bit `j` of `qh[l]` times 16, 0-31 unsigned; scale
/// `d * sc_j` and offset `dmin * m_j` as for Q4_K.
struct Q5k;

impl Block for Q5k {
    /// A 256-value block's bytes over its eight blocks of 32 (prefetching).
    const BYTES: usize = 22;
    const OFFSET: bool = true;
    unsafe fn stored(_: *const u8) -> __m256i {
        unreachable!("Q5_K blocks are read with stored2")
    }
}

impl Pairs for Q5k {
    const UNPACKED: bool = true;

    #[inline(always)]
    unsafe fn stored2(a: *const u8, b: *const u8, c: usize) -> __m512i {
        let (sb, j) = (c / 8, c % 8);
        let (qs, qh) = (sb * 176 + 48 + 32 * (j / 2), sb * 176 + 16);
        // SAFETY: forwarded; both rows' codes in one register.
        unsafe {
            let two = |at: usize| {
                _mm512_inserti64x4::<1>(
                    _mm512_castsi256_si512(_mm256_loadu_si256(a.add(at).cast())),
                    _mm256_loadu_si256(b.add(at).cast()),
                )
            };
            let (v, h) = (two(qs), two(qh));
            let low = if j % 2 == 1 {
                _mm512_srli_epi16::<4>(v)
            } else {
                v
            };
            let low = _mm512_and_si512(low, _mm512_set1_epi8(15));
            // Bit j of each byte rotated into its bit 4 (j < 8: within the
            // byte), then `low | (top & 16)` in one bit select.
            let top = _mm512_rolv_epi32(h, _mm512_set1_epi32((4 - j as i32) & 31));
            _mm512_ternarylogic_epi32::<0xf8>(low, top, _mm512_set1_epi8(16))
        }
    }
}

/// IQ4_XS as eight blocks of 32 values a 256-value block (136 bytes: `d`,
/// the scales' high bit pairs `scales_h`, their low nibbles `scales_l[4]`,
/// 128 bytes of nibbles, 16 a block: low nibbles values 0-15, high ones
/// 16-31), the nibbles indexing IQ4_NL's table of signed codes; scale
/// `d * (ls_j - 32)` as `unpack.rs` computes it.
struct Iq4Xs;

impl Block for Iq4Xs {
    /// A 256-value block's bytes over its eight blocks of 32 (prefetching).
    const BYTES: usize = 17;
    const SIGNED: bool = true;
    unsafe fn stored(_: *const u8) -> __m256i {
        unreachable!("IQ4_XS blocks are read with stored2")
    }
}

impl Pairs for Iq4Xs {
    const UNPACKED: bool = true;

    #[inline(always)]
    unsafe fn stored2(a: *const u8, b: *const u8, c: usize) -> __m512i {
        let at = (c / 8) * 136 + 8 + 16 * (c % 8);
        // SAFETY: forwarded; both rows' 16 bytes, low nibbles then high
        // ones a row, looked up in the table (128-bit lanes: a, a, b, b).
        unsafe {
            let t = _mm512_broadcast_i32x4(_mm_loadu_si128(
                crate::quant::unpack::IQ4_VALUES.as_ptr().cast(),
            ));
            let (va, vb) = (
                _mm_loadu_si128(a.add(at).cast()),
                _mm_loadu_si128(b.add(at).cast()),
            );
            let m = _mm_set1_epi8(15);
            let nib = |v: __m128i| {
                _mm256_inserti128_si256::<1>(
                    _mm256_castsi128_si256(_mm_and_si128(v, m)),
                    _mm_and_si128(_mm_srli_epi16::<4>(v), m),
                )
            };
            let idx = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(nib(va)), nib(vb));
            _mm512_shuffle_epi8(t, idx)
        }
    }
}

/// IQ4_XS's band scales for [`band_scales`]: block `c` of row `i` at
/// `c * 16 + i`, `d * float(ls - 32)` as `unpack.rs`.
///
/// # Safety
/// As [`band_scales`].
#[inline(always)]
unsafe fn iq4xs_scales(job: &Job<'_>, r: usize, live: usize, into: &mut [f32]) {
    let supers = job.cols / 256;
    debug_assert!(into.len() >= 16 * 8 * supers);
    // SAFETY (whole body): every gathered word lies in a row of the band
    // (bytes 0-7 of each 136-byte block).
    unsafe {
        let (base, at) = band_rows(job, r, live);
        let dst = into.as_mut_ptr();
        for sb in 0..supers {
            let b = base.add(sb * 136);
            // Bytes 0-1 `d`, 2-3 `scales_h`; 4-7 `scales_l`.
            let head = _mm512_i32gather_epi32::<1>(at, b.cast());
            let low = _mm512_i32gather_epi32::<1>(at, b.add(4).cast());
            let d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(head));
            let high = _mm512_srli_epi32::<16>(head);
            for j in 0..8 {
                let lo = _mm512_and_si512(
                    _mm512_srl_epi32(low, _mm_cvtsi32_si128(4 * j as i32)),
                    _mm512_set1_epi32(15),
                );
                let hi = _mm512_and_si512(
                    _mm512_srl_epi32(high, _mm_cvtsi32_si128(2 * j as i32)),
                    _mm512_set1_epi32(3),
                );
                let ls = _mm512_or_si512(lo, _mm512_slli_epi32::<4>(hi));
                let sc = _mm512_sub_epi32(ls, _mm512_set1_epi32(32));
                let g = sb * 8 + j;
                _mm512_storeu_ps(dst.add(g * 16), _mm512_mul_ps(d, _mm512_cvtepi32_ps(sc)));
            }
        }
    }
}

/// Q6_K's band scales for [`band_scales`]: group `g` (of 16 values) of
/// row `i` at `g * 16 + i`, `d * sc_g` (`sc_g` int8) as `unpack.rs`.
///
/// # Safety
/// As [`band_scales`], `into` holding `16 * cols / 16` floats.
#[inline(always)]
unsafe fn q6k_scales(job: &Job<'_>, r: usize, live: usize, into: &mut [f32]) {
    let supers = job.cols / 256;
    debug_assert!(into.len() >= 16 * 16 * supers);
    // SAFETY (whole body): every gathered word lies in a row of the band
    // (bytes 192-209 of each 210-byte block).
    unsafe {
        let (base, at) = band_rows(job, r, live);
        let dst = into.as_mut_ptr();
        for sb in 0..supers {
            let b = base.add(sb * 210);
            // `d` is bytes 208-209: the top half of the word at 206.
            let dw = _mm512_i32gather_epi32::<1>(at, b.add(206).cast());
            let d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(dw)));
            for w in 0..4 {
                let word = _mm512_i32gather_epi32::<1>(at, b.add(192 + 4 * w).cast());
                for j in 0..4 {
                    let sc = match j {
                        0 => _mm512_srai_epi32::<24>(_mm512_slli_epi32::<24>(word)),
                        1 => _mm512_srai_epi32::<24>(_mm512_slli_epi32::<16>(word)),
                        2 => _mm512_srai_epi32::<24>(_mm512_slli_epi32::<8>(word)),
                        _ => _mm512_srai_epi32::<24>(word),
                    };
                    let g = sb * 16 + 4 * w + j;
                    _mm512_storeu_ps(dst.add(g * 16), _mm512_mul_ps(d, _mm512_cvtepi32_ps(sc)));
                }
            }
        }
    }
}

/// Q6_K as eight blocks of 32 values a 256-value block (210 bytes: 128 of
/// low nibbles `ql`, 64 of high bit pairs `qh`, 16 int8 scales, `d`):
/// block `k` of a half `h` of 128 values takes the low (`k < 2`) or high
/// nibbles of `ql[64h + 32 (k % 2)..]` and bits `2k..2k + 2` of
/// `qh[32h..]`, codes 0-63 stored (`code + 32`); groups of 16, scale
/// `d * sc_g` as `unpack.rs` computes it.
struct Q6k;

impl Block for Q6k {
    /// A 256-value block's bytes over its eight blocks of 32, rounded up
    /// (prefetching only).
    const BYTES: usize = 27;
    const BIAS: i8 = 32;
    unsafe fn stored(_: *const u8) -> __m256i {
        unreachable!("Q6_K blocks are read with stored2")
    }
}

impl Pairs for Q6k {
    const UNPACKED: bool = true;
    const G16: bool = true;

    #[inline(always)]
    unsafe fn stored2(a: *const u8, b: *const u8, c: usize) -> __m512i {
        let (sb, k) = (c / 8, c % 8);
        let (h, k) = (k / 4, k % 4);
        let (lo, hi) = (sb * 210 + 64 * h + 32 * (k % 2), sb * 210 + 128 + 32 * h);
        // SAFETY: forwarded; both rows' halves decoded in one register.
        unsafe {
            let two = |at: usize| {
                _mm512_inserti64x4::<1>(
                    _mm512_castsi256_si512(_mm256_loadu_si256(a.add(at).cast())),
                    _mm256_loadu_si256(b.add(at).cast()),
                )
            };
            let (ql, qh) = (two(lo), two(hi));
            let low = if k >= 2 {
                _mm512_srli_epi16::<4>(ql)
            } else {
                ql
            };
            let low = _mm512_and_si512(low, _mm512_set1_epi8(15));
            // Bits 2k..2k + 2 of each byte rotated into bits 4-5 (left by
            // 4 - 2k; k = 3: right by 2, bits 6-7 of the same byte), then
            // `low | (top & 0x30)` in one bit select (a shift by a register
            // count, two operations, then a mask, a shift and an or: one
            // row about 1.1x slower).
            static TURN: [i32; 4] = [4, 2, 0, 30];
            let top = _mm512_rolv_epi32(qh, _mm512_set1_epi32(TURN[k]));
            _mm512_ternarylogic_epi32::<0xf8>(low, top, _mm512_set1_epi8(0x30))
        }
    }
}

/// Q2_K as eight blocks of 32 values a 256-value block (84 bytes: sixteen
/// bytes of 4-bit scales and mins, 64 of bit pairs `qs`, `d`, `dmin`):
/// block `b = 4h + i` takes bits `2i..2i + 2` of `qs[32h..]`, codes 0-3
/// unsigned; groups of 16, scale `d * (sc_g & 15)` and offset
/// `dmin * (sc_g >> 4)` as `unpack.rs` computes them.
struct Q2k;

impl Block for Q2k {
    /// A 256-value block's bytes over its eight blocks of 32, rounded up
    /// (prefetching only).
    const BYTES: usize = 11;
    const OFFSET: bool = true;
    unsafe fn stored(_: *const u8) -> __m256i {
        unreachable!("Q2_K blocks are read with stored2")
    }
}

impl Pairs for Q2k {
    const UNPACKED: bool = true;
    const G16: bool = true;

    #[inline(always)]
    unsafe fn stored2(a: *const u8, b: *const u8, c: usize) -> __m512i {
        let (sb, k) = (c / 8, c % 8);
        let at = sb * 84 + 16 + 32 * (k / 4);
        // SAFETY: forwarded; both rows' codes in one register.
        unsafe {
            let q = _mm512_inserti64x4::<1>(
                _mm512_castsi256_si512(_mm256_loadu_si256(a.add(at).cast())),
                _mm256_loadu_si256(b.add(at).cast()),
            );
            // Shifts below 8: bits 0-1 of each byte stay its own.
            let q = _mm512_srlv_epi32(q, _mm512_set1_epi32(2 * (k % 4) as i32));
            _mm512_and_si512(q, _mm512_set1_epi8(3))
        }
    }
}

/// Q2_K's band scales for [`band_scales`]: group `g` (of 16 values) of
/// row `i` at `g * 16 + i`, `d * (sc_g & 15)`, and its offset
/// `dmin * (sc_g >> 4)` `16 * groups` further, as `unpack.rs`.
///
/// # Safety
/// As [`band_scales`], `into` holding `2 * 16 * cols / 16` floats.
#[inline(always)]
unsafe fn q2k_scales(job: &Job<'_>, r: usize, live: usize, into: &mut [f32]) {
    let supers = job.cols / 256;
    let groups = 16 * supers;
    debug_assert!(into.len() >= 2 * 16 * groups);
    // SAFETY (whole body): every gathered word lies in a row of the band
    // (bytes 0-15 and 80-83 of each 84-byte block).
    unsafe {
        let (base, at) = band_rows(job, r, live);
        let dst = into.as_mut_ptr();
        let m4 = _mm512_set1_epi32(15);
        for sb in 0..supers {
            let b = base.add(sb * 84);
            let head = _mm512_i32gather_epi32::<1>(at, b.add(80).cast());
            let d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(head));
            let dmin = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(head)));
            for w in 0..4 {
                let word = _mm512_i32gather_epi32::<1>(at, b.add(4 * w).cast());
                for j in 0..4 {
                    let byte = _mm512_srl_epi32(word, _mm_cvtsi32_si128(8 * j as i32));
                    let sc = _mm512_and_si512(byte, m4);
                    let m = _mm512_and_si512(_mm512_srli_epi32::<4>(byte), m4);
                    let g = sb * 16 + 4 * w + j;
                    _mm512_storeu_ps(dst.add(g * 16), _mm512_mul_ps(d, _mm512_cvtepi32_ps(sc)));
                    _mm512_storeu_ps(
                        dst.add((groups + g) * 16),
                        _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(m)),
                    );
                }
            }
        }
    }
}

/// Q3_K as eight blocks of 32 values a 256-value block (110 bytes: 32 of
/// high bits `hmask`, 64 of bit pairs `qs`, twelve bytes of 6-bit scales,
/// `d`): block `b = 4h + i` takes bits `2i..2i + 2` of `qs[32h..]` and bit
/// `b` of `hmask[l]` (times 4), codes 0-7 stored (`code + 4`); groups of
/// 16, scale `d * (sc_g - 32)` as `unpack.rs` computes it.
struct Q3k;

impl Block for Q3k {
    /// A 256-value block's bytes over its eight blocks of 32, rounded up
    /// (prefetching only).
    const BYTES: usize = 14;
    const BIAS: i8 = 4;
    unsafe fn stored(_: *const u8) -> __m256i {
        unreachable!("Q3_K blocks are read with stored2")
    }
}

impl Pairs for Q3k {
    const UNPACKED: bool = true;
    const G16: bool = true;

    #[inline(always)]
    unsafe fn stored2(a: *const u8, b: *const u8, c: usize) -> __m512i {
        let (sb, k) = (c / 8, c % 8);
        let (qs, hm) = (sb * 110 + 32 + 32 * (k / 4), sb * 110);
        // SAFETY: forwarded; both rows' codes in one register.
        unsafe {
            let two = |at: usize| {
                _mm512_inserti64x4::<1>(
                    _mm512_castsi256_si512(_mm256_loadu_si256(a.add(at).cast())),
                    _mm256_loadu_si256(b.add(at).cast()),
                )
            };
            let (q, h) = (two(qs), two(hm));
            // Shifts below 8: bits 0-1 of each byte stay its own; bit k of
            // each byte rotated into its bit 2, merged by one bit select.
            let low = _mm512_srlv_epi32(q, _mm512_set1_epi32(2 * (k % 4) as i32));
            let low = _mm512_and_si512(low, _mm512_set1_epi8(3));
            let top = _mm512_rolv_epi32(h, _mm512_set1_epi32((2 - k as i32) & 31));
            _mm512_ternarylogic_epi32::<0xf8>(low, top, _mm512_set1_epi8(4))
        }
    }
}

/// Q3_K's band scales for [`band_scales`]: group `g` (of 16 values) of
/// row `i` at `g * 16 + i`, `d * (sc_g - 32)` with `sc_g`'s low nibble from
/// byte `g % 8` (its high nibble for `g >= 8`) and its top two bits from
/// byte `8 + g % 4` (bits `2 (g / 4)`), as `unpack.rs`.
///
/// # Safety
/// As [`band_scales`], `into` holding `16 * cols / 16` floats.
#[inline(always)]
unsafe fn q3k_scales(job: &Job<'_>, r: usize, live: usize, into: &mut [f32]) {
    let supers = job.cols / 256;
    debug_assert!(into.len() >= 16 * 16 * supers);
    // SAFETY (whole body): every gathered word lies in a row of the band
    // (bytes 96-109 of each 110-byte block).
    unsafe {
        let (base, at) = band_rows(job, r, live);
        let dst = into.as_mut_ptr();
        for sb in 0..supers {
            let b = base.add(sb * 110);
            // `d` is bytes 108-109: the top half of the word at 106.
            let dw = _mm512_i32gather_epi32::<1>(at, b.add(106).cast());
            let d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(dw)));
            let w = [
                _mm512_i32gather_epi32::<1>(at, b.add(96).cast()),
                _mm512_i32gather_epi32::<1>(at, b.add(100).cast()),
                _mm512_i32gather_epi32::<1>(at, b.add(104).cast()),
            ];
            for g in 0..16 {
                let sh = |v: __m512i, bits: usize, mask: i32| {
                    _mm512_and_si512(
                        _mm512_srl_epi32(v, _mm_cvtsi32_si128(bits as i32)),
                        _mm512_set1_epi32(mask),
                    )
                };
                let low = sh(w[(g % 8) / 4], 8 * (g % 4) + 4 * (g / 8), 15);
                let high = sh(w[2], 8 * (g % 4) + 2 * (g / 4), 3);
                let ls = _mm512_or_si512(low, _mm512_slli_epi32::<4>(high));
                let sc = _mm512_sub_epi32(ls, _mm512_set1_epi32(32));
                _mm512_storeu_ps(
                    dst.add((sb * 16 + g) * 16),
                    _mm512_mul_ps(d, _mm512_cvtepi32_ps(sc)),
                );
            }
        }
    }
}

/// The scales of the band of rows `r..r + live` (missing rows repeat the
/// last) at `c * 16 + i` of `into`, their offsets `16 * chunks` further,
/// one lane a row: for Q4_K and Q5_K `d * sc_j` and `dmin * m_j` of each
/// 256-value block, the 6-bit `sc_j`, `m_j` unpacked as `unpack.rs`'s
/// `scale_min_k4` does and the same float multiplications, so its values
/// (Q2_K, Q3_K, Q6_K and IQ4_XS: their own functions).
///
/// # Safety
/// AVX-512 F present; rows `r..r + live` of the job exist; `into` holds
/// `32 * chunks` floats.
#[inline(always)]
unsafe fn band_scales<L: Pairs>(job: &Job<'_>, r: usize, live: usize, into: &mut [f32]) {
    let chunks = job.cols / 32;
    // The 256-value block's bytes (Q4_K and Q5_K share their scales).
    let block = match job.qtype {
        QuantType::Q6K => {
            // SAFETY: forwarded.
            unsafe { q6k_scales(job, r, live, into) };
            return;
        }
        QuantType::IQ4XS => {
            // SAFETY: forwarded.
            unsafe { iq4xs_scales(job, r, live, into) };
            return;
        }
        QuantType::Q3K => {
            // SAFETY: forwarded.
            unsafe { q3k_scales(job, r, live, into) };
            return;
        }
        QuantType::Q2K => {
            // SAFETY: forwarded.
            unsafe { q2k_scales(job, r, live, into) };
            return;
        }
        QuantType::Q4K => 144,
        QuantType::Q5K => 176,
        other => unreachable!("{} has no band scales", other.name()),
    };
    debug_assert!(L::UNPACKED);
    debug_assert!(into.len() >= 32 * chunks);
    // SAFETY (whole body): every gathered word lies in a row of the band.
    unsafe {
        let (base, at) = band_rows(job, r, live);
        let (m6, m4, m2) = (
            _mm512_set1_epi32(63),
            _mm512_set1_epi32(15),
            _mm512_set1_epi32(3),
        );
        let dst = into.as_mut_ptr();
        for sb in 0..chunks / 8 {
            let b = base.add(sb * block);
            let head = _mm512_i32gather_epi32::<1>(at, b.cast());
            let d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(head));
            let dmin = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(head)));
            // q[0..4], q[4..8], q[8..12] of the twelve scale bytes.
            let w0 = _mm512_i32gather_epi32::<1>(at, b.add(4).cast());
            let w1 = _mm512_i32gather_epi32::<1>(at, b.add(8).cast());
            let w2 = _mm512_i32gather_epi32::<1>(at, b.add(12).cast());
            for i in 0..4u32 {
                let sh = _mm_cvtsi32_si128(8 * i as i32);
                let (q0, q1, q2) = (
                    _mm512_srl_epi32(w0, sh),
                    _mm512_srl_epi32(w1, sh),
                    _mm512_srl_epi32(w2, sh),
                );
                // j = i: q[i] & 63, q[i + 4] & 63.
                let (sc, m) = (_mm512_and_si512(q0, m6), _mm512_and_si512(q1, m6));
                // j = i + 4: (q[i + 8] & 15) | (q[i] >> 6) << 4,
                // (q[i + 8] >> 4) | (q[i + 4] >> 6) << 4.
                let top = |q: __m512i| {
                    _mm512_slli_epi32::<4>(_mm512_and_si512(_mm512_srli_epi32::<6>(q), m2))
                };
                let sc4 = _mm512_or_si512(_mm512_and_si512(q2, m4), top(q0));
                let m4v =
                    _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32::<4>(q2), m4), top(q1));
                for (j, sc, m) in [(i as usize, sc, m), (i as usize + 4, sc4, m4v)] {
                    let c = sb * 8 + j;
                    _mm512_storeu_ps(dst.add(c * 16), _mm512_mul_ps(d, _mm512_cvtepi32_ps(sc)));
                    _mm512_storeu_ps(
                        dst.add((chunks + c) * 16),
                        _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(m)),
                    );
                }
            }
        }
    }
}

/// The band's 16 weight rows (`live` of them real) times slab `sl` of
/// activation rows, into `out`.
///
/// # Safety
/// As [`rows`]; the band and the slab's tables filled.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn tile(
    job: &Job<'_>,
    tables: &Slabs,
    s: &Scratch,
    r: usize,
    live: usize,
    sl: usize,
    shift: Option<u32>,
    offsets: bool,
    g16: bool,
    out: *mut f32,
) {
    const P: usize = BAND / 2;
    let chunks = job.cols / 32;
    // SAFETY (whole body): the tables hold `chunks` blocks of this slab and
    // of the band's P pairs; out is n x rows.
    unsafe {
        let xs = tables.x.as_ptr().add(sl * chunks * 8);
        let negsum = tables.negsum.as_ptr().add(sl * chunks);
        let negsum16 = tables.negsum16.as_ptr().add(sl * chunks * 2);
        let dx = tables.d.as_ptr().add(sl * chunks * 16);
        let w = s.wband.as_ptr();
        // Pair j's two scales (offsets) of block c: f64 c * 8 + j.
        let sp = s.sband.as_ptr().cast::<f64>();
        let mut acc = [_mm512_setzero_ps(); P];
        for c in 0..chunks {
            // Two chains a pair (even and odd quarters), so sixteen
            // `vpdpbusd` chains hide its latency; integers, so exact.
            // -bias * sum x: the unsigned codes' excess.
            let excess = |at: *const Line| match shift {
                Some(sh) => {
                    _mm512_sll_epi32(_mm512_load_si512(at.cast()), _mm_cvtsi32_si128(sh as i32))
                }
                None => _mm512_setzero_si512(),
            };
            // Groups of 16: `t` the first half's quarters (0-3), `u` the
            // second's, each with its own excess; else even and odd quarters.
            let (mut t, mut u) = if g16 {
                (
                    [excess(negsum16.add(2 * c)); P],
                    [excess(negsum16.add(2 * c + 1)); P],
                )
            } else {
                ([excess(negsum.add(c)); P], [_mm512_setzero_si512(); P])
            };
            for step in 0..4 {
                let (qa, qb) = if g16 {
                    (step, step + 4)
                } else {
                    (2 * step, 2 * step + 1)
                };
                let xv = _mm512_load_si512(xs.add(c * 8 + qa).cast());
                let xw = _mm512_load_si512(xs.add(c * 8 + qb).cast());
                for j in 0..P {
                    let wp = w.add((j * chunks + c) * 8);
                    t[j] = _mm512_dpbusd_epi32(t[j], _mm512_set1_epi64(wp.add(qa).read()), xv);
                    u[j] = _mm512_dpbusd_epi32(u[j], _mm512_set1_epi64(wp.add(qb).read()), xw);
                }
            }
            let d = _mm512_loadu_ps(dx.add(c * 16));
            if g16 {
                for (j, acc) in acc.iter_mut().enumerate() {
                    for (h, total) in [(0, t[j]), (1, u[j])] {
                        let at = sp.add((2 * c + h) * 8 + j).read_unaligned();
                        let cf = _mm512_mul_ps(_mm512_castpd_ps(_mm512_set1_pd(at)), d);
                        *acc = _mm512_add_ps(*acc, _mm512_mul_ps(cf, _mm512_cvtepi32_ps(total)));
                    }
                }
                continue;
            }
            for (j, acc) in acc.iter_mut().enumerate() {
                let sc = _mm512_castpd_ps(_mm512_set1_pd(sp.add(c * 8 + j).read_unaligned()));
                let cf = _mm512_mul_ps(sc, d);
                let total = _mm512_add_epi32(t[j], u[j]);
                *acc = _mm512_add_ps(*acc, _mm512_mul_ps(cf, _mm512_cvtepi32_ps(total)));
            }
        }
        if offsets {
            let op = s.oband.as_ptr().cast::<f64>();
            let groups = if g16 { 2 * chunks } else { chunks };
            let qs = s.sq.as_ptr().add(sl * groups * 16);
            let mut off = [_mm512_setzero_ps(); P];
            for g in 0..groups {
                let q = _mm512_loadu_ps(qs.add(g * 16));
                for (j, off) in off.iter_mut().enumerate() {
                    let o = _mm512_castpd_ps(_mm512_set1_pd(op.add(g * 8 + j).read_unaligned()));
                    *off = _mm512_add_ps(*off, _mm512_mul_ps(o, q));
                }
            }
            for (acc, off) in acc.iter_mut().zip(off) {
                *acc = _mm512_sub_ps(*acc, off);
            }
        }
        store(job, &acc, r, live, sl, false, out);
    }
}
