//! Block totals on AVX2 (CPUs without AVX-512 VNNI): the fast mode's
//! 32-value-block formats (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4) total each
//! block's 32 products exactly in one int32 and then run the portable
//! build's float operations block by block, as the VNNI kernels (`sums`)
//! do, so the **portable bits** in one row and in every batch:
//!
//! ```text
//! acc = acc + (scale_b * d_b) * float(total_b)      (block by block from 0)
//! off = off + offset_b * qsum_b                       (block by block from 0)
//! result = acc - off
//! ```
//!
//! The eight-lane kernels (the AVX2 build's before, removed) spent six operations
//! on each weight row, activation row and block (sign, `vpmaddubsw`,
//! `vpmaddwd`, conversion, scale product, multiply-add), so eight activation
//! rows cost nearly eight times one. Here a band of eight weight rows is
//! decoded once into **quarters**: quarter `q` of block `c` is one 256-bit
//! register whose 32-bit lane `j` holds row `j`'s codes `4q..4q + 4`. One
//! `vpmaddubsw` of a quarter against an activation row's four codes of that
//! quarter, broadcast, gives every lane two pair sums of its own row:
//!
//! - unsigned codes below 16 (Q4_0's stored nibbles, Q4_1): the eight
//!   quarters' pair sums add up in int16 without overflow (at most
//!   8 * 2 * 15 * 127 = 30480), below 32 (Q5_0, Q5_1) four of them do; one
//!   `vpmaddwd` by ones then gives the block's eight totals, less
//!   `bias * sum x` for a stored bias (Q4_0: 8, Q5_0: 16);
//! - signed codes (Q8_0, IQ4_NL, MXFP4): `|code|` against the activation carrying
//!   the code's sign (`vpsignb`), one `vpmaddwd` a quarter (a pair reaches
//!   2 * 128 * 127).
//!
//! So per activation row and block of eight weight rows: eight broadcasts
//! (loads), eight `vpmaddubsw`, eight adds and five float operations for the
//! eight outputs. A band's decoding (two rows a register, then a transpose
//! of 32-bit lanes by unpacks) is shared by all activation rows, which go
//! up to eight at a time so each quarter is loaded once for them.

use std::arch::x86_64::*;

use super::x86::{self, Block};
use super::{Job, Scratch};
use crate::quant::format::QuantType;

/// Weight rows decoded together: one 32-bit lane each.
const BAND: usize = 8;

/// Whether [`rows`] takes `qtype`.
pub(super) fn covers(qtype: QuantType) -> bool {
    // Q8_0 too since the twenty-second session: its one row streamed from
    // memory 1.4-1.6x slower here than in the eight-lane kernels until the
    // band was prefetched as the contiguous bytes it is
    // ([`prefetch_slice`]); now one row is as fast and eight rows 1.45x.
    matches!(
        qtype,
        QuantType::Q8_0
            | QuantType::Q4_0
            | QuantType::Q4_1
            | QuantType::Q5_0
            | QuantType::Q5_1
            | QuantType::IQ4NL
            | QuantType::MXFP4
    )
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
            QuantType::Q8_0 => rows_of::<x86::Q8_0>(job, lo, hi, out, s),
            QuantType::Q4_0 => rows_of::<x86::Q4_0>(job, lo, hi, out, s),
            QuantType::Q4_1 => rows_of::<x86::Q4_1>(job, lo, hi, out, s),
            QuantType::Q5_0 => rows_of::<x86::Q5_0>(job, lo, hi, out, s),
            QuantType::Q5_1 => rows_of::<x86::Q5_1>(job, lo, hi, out, s),
            QuantType::IQ4NL => rows_of::<x86::Iq4Nl>(job, lo, hi, out, s),
            QuantType::MXFP4 => rows_of::<x86::Mxfp4>(job, lo, hi, out, s),
            other => unreachable!("{} has no AVX2 block totals", other.name()),
        }
    }
}

/// A 32-value-block format read as quarters.
trait Quads: Block {
    /// Unsigned codes: how many quarters' pair sums add up in int16 (codes
    /// below 16: 8, below 32: 4). Signed codes: 1 (unused).
    const RUN: usize;
    /// Batches of up to this many activation rows take [`single`] (weight
    /// blocks read in place, up to four activation rows at a time) instead
    /// of the band's quarters; one row always does. Measured in one
    /// process, the two routes alternated (1536 x 576, weights from
    /// memory): Q8_0's `single` wins at every batch size (n=2 110 -> 73
    /// us, n=3 129 -> 83, n=4 148 -> 128, n=8 245 -> 229 with three rows a
    /// pass), IQ4_NL's up to four rows (n=2 94 -> 79, n=3 161 -> 148, n=4
    /// 118 -> 110 with four a pass; n=8 191 vs 221); the unsigned formats
    /// keep the band from two rows (Q4_0 n=2 66 vs 67, n=4 79 vs 93, n=8
    /// 128 vs 188).
    const FEW: usize = 1;
    /// Activation rows a pass over the band takes at most (8 or 4; the
    /// rest go 4, or 3 then what is left). Alternated, 1536 x 576 from
    /// memory, n=8 as one pass of eight against two of four: Q4_0 134 ->
    /// 124 us, Q4_1 127 -> 124, IQ4_NL 199 -> 174; Q5_0's int16 runs of
    /// four make eight rows slower (139 -> 151), so it keeps four. Three
    /// rows as one pass, not 2 + 1: Q4_0 71 -> 66, Q5_0 96 -> 91; n=5 and
    /// n=6 as 3 + 2 and 3 + 3: Q4_0 97 -> 92, 110 -> 103.
    const GROUP: usize = if Self::SIGNED || Self::RUN == 8 { 8 } else { 4 };

    /// The codes of rows `a` and `e` (blocks at those addresses): codes
    /// 0..16 of both (`a` in the low 128 bits), then codes 16..32.
    ///
    /// # Safety
    /// AVX2 present; `BYTES` readable bytes at `a` and at `e`.
    #[inline(always)]
    unsafe fn pair(a: *const u8, e: *const u8) -> (__m256i, __m256i) {
        // SAFETY: forwarded.
        unsafe {
            let (a, e) = (Self::stored(a), Self::stored(e));
            (
                _mm256_permute2x128_si256::<0x20>(a, e),
                _mm256_permute2x128_si256::<0x31>(a, e),
            )
        }
    }
}

/// Rows `a` and `e`'s 16 bytes at `off` as nibbles: low ones of both, high
/// ones of both.
#[inline(always)]
unsafe fn nibble_pair(a: *const u8, e: *const u8, off: usize) -> (__m256i, __m256i) {
    // SAFETY: 16 readable bytes at a + off and e + off (caller); AVX2 present.
    unsafe {
        let v = _mm256_loadu2_m128i(e.add(off).cast(), a.add(off).cast());
        let m = _mm256_set1_epi8(15);
        (
            _mm256_and_si256(v, m),
            _mm256_and_si256(_mm256_srli_epi16::<4>(v), m),
        )
    }
}

impl Quads for x86::Q8_0 {
    const RUN: usize = 1;
    const FEW: usize = usize::MAX;
    #[inline(always)]
    unsafe fn pair(a: *const u8, e: *const u8) -> (__m256i, __m256i) {
        // SAFETY: forwarded; the 32 codes follow `d`.
        unsafe {
            (
                _mm256_loadu2_m128i(e.add(2).cast(), a.add(2).cast()),
                _mm256_loadu2_m128i(e.add(18).cast(), a.add(18).cast()),
            )
        }
    }
}

impl Quads for x86::Q4_0 {
    const RUN: usize = 8;
    #[inline(always)]
    unsafe fn pair(a: *const u8, e: *const u8) -> (__m256i, __m256i) {
        // SAFETY: forwarded; nibbles after `d`.
        unsafe { nibble_pair(a, e, 2) }
    }
}

impl Quads for x86::Q4_1 {
    const RUN: usize = 8;
    #[inline(always)]
    unsafe fn pair(a: *const u8, e: *const u8) -> (__m256i, __m256i) {
        // SAFETY: forwarded; nibbles after `d` and `m`.
        unsafe { nibble_pair(a, e, 4) }
    }
}

impl Quads for x86::Q5_0 {
    const RUN: usize = 4;
}

impl Quads for x86::Q5_1 {
    const RUN: usize = 4;
}

/// [`nibble_pair`] of blocks whose nibbles (from byte `at`) index a
/// signed code book (IQ4_NL's, MXFP4's), looked up into int8 codes.
///
/// # Safety
/// As [`nibble_pair`]; AVX2 present.
#[inline(always)]
unsafe fn book_pair(a: *const u8, e: *const u8, at: usize, book: &[i8; 16]) -> (__m256i, __m256i) {
    // SAFETY: forwarded; 16 readable bytes in `book`.
    unsafe {
        let t = _mm256_broadcastsi128_si256(_mm_loadu_si128(book.as_ptr().cast()));
        let (l, h) = nibble_pair(a, e, at);
        (_mm256_shuffle_epi8(t, l), _mm256_shuffle_epi8(t, h))
    }
}

impl Quads for x86::Iq4Nl {
    const RUN: usize = 1;
    const FEW: usize = 4;
    #[inline(always)]
    unsafe fn pair(a: *const u8, e: *const u8) -> (__m256i, __m256i) {
        // SAFETY: forwarded; nibbles after `d`.
        unsafe { book_pair(a, e, 2, &crate::quant::unpack::IQ4_VALUES) }
    }
}

/// IQ4_NL's route (its `FEW`, measured; the same decoding but for the
/// book and the scale).
impl Quads for x86::Mxfp4 {
    const RUN: usize = 1;
    const FEW: usize = 4;
    #[inline(always)]
    unsafe fn pair(a: *const u8, e: *const u8) -> (__m256i, __m256i) {
        // SAFETY: forwarded; nibbles after `e`.
        unsafe { book_pair(a, e, 1, &crate::quant::unpack::MXFP4_VALUES) }
    }
}

/// [`rows`] for the format `L`.
#[inline(always)]
unsafe fn rows_of<L: Quads>(job: &Job<'_>, lo: usize, hi: usize, out: *mut f32, s: &mut Scratch) {
    let (k, n) = (job.cols, job.n);
    let chunks = k / 32;
    // `bias * sum x` of every activation row's blocks (stored biases).
    s.bx.clear();
    if !L::SIGNED && L::BIAS != 0 {
        s.bx.extend(
            job.acts.codes[..n * k]
                .chunks_exact(32)
                .map(|b| i32::from(L::BIAS) * b.iter().map(|&q| i32::from(q)).sum::<i32>()),
        );
    }
    // The band: quarter q of block c at 8c + q (signed codes: the codes at
    // 2(8c + q), their magnitudes after them); block c's eight scales
    // (offsets) at 8c.
    if n <= L::FEW.max(1) {
        // Four activation rows a pass: each weight block's load and
        // magnitude, and each block's scales, serve more rows than three
        // (alternated, Q8_0 1536 x 576 from memory: n=4 106-114 -> 89-95
        // us, n=7 187 -> 168, n=8 194-208 -> 176-184, n=16 402 -> 367; n=5
        // and n=6 the same either way); five or more spill the sums (n=8
        // as 6 + 2: 256 us).
        let mut t = 0;
        while t < n {
            let nt = (n - t).min(4);
            // SAFETY: forwarded; rows t..t + nt exist.
            unsafe {
                match nt {
                    4 => single::<L, 4>(job, t, lo, hi, out, s),
                    3 => single::<L, 3>(job, t, lo, hi, out, s),
                    2 => single::<L, 2>(job, t, lo, hi, out, s),
                    _ => single::<L, 1>(job, t, lo, hi, out, s),
                }
            }
            t += nt;
        }
        return;
    }
    let per = if L::SIGNED { 2 } else { 1 };
    s.quads.clear();
    s.quads.resize(chunks * 8 * per, Quad::default());
    s.sband.clear();
    s.sband.resize(chunks * BAND, 0.0);
    s.oband.clear();
    s.oband
        .resize(if L::OFFSET { chunks * BAND } else { 0 }, 0.0);
    let mut r = lo;
    while r < hi {
        let live = (hi - r).min(BAND);
        // SAFETY: rows r..r + live of `raw` hold `chunks` blocks of
        // L::BYTES (missing rows repeat row r + live - 1); the band's
        // buffers are sized above; AVX2, FMA, F16C present (caller).
        unsafe {
            decode::<L>(job, r, live, s);
            let mut t = 0;
            while t < n {
                let nt = match n - t {
                    r if r >= L::GROUP => L::GROUP,
                    4 => 4,
                    r if r >= 3 => 3,
                    r => r,
                };
                match nt {
                    8 => group::<L, 8>(job, s, r, live, t, out),
                    3 => group::<L, 3>(job, s, r, live, t, out),
                    4 => group::<L, 4>(job, s, r, live, t, out),
                    2 => group::<L, 2>(job, s, r, live, t, out),
                    _ => group::<L, 1>(job, s, r, live, t, out),
                }
                t += nt;
            }
        }
        r += live;
    }
}

/// The eight rows' `d` (lanes 0..8) from their blocks at `base + at[j]`,
/// and `m` after it (MXFP4: the scales of their `e`, and nothing).
///
/// # Safety
/// AVX2 and F16C present; four readable bytes at each block.
#[inline(always)]
unsafe fn heads<L: Block>(base: *const u8, at: __m256i) -> (__m256, __m256) {
    // SAFETY: forwarded.
    unsafe {
        let head = _mm256_i32gather_epi32::<1>(base.cast(), at);
        if L::E8M0 {
            return (x86::e8m0_8(head), _mm256_setzero_ps());
        }
        let low = _mm256_setr_epi8(
            0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1, 0, 1, 4, 5, 8, 9, 12, 13, -1,
            -1, -1, -1, -1, -1, -1, -1,
        );
        let halves = |v: __m256i| {
            let v = _mm256_permute4x64_epi64::<0b1000>(_mm256_shuffle_epi8(v, low));
            _mm256_cvtph_ps(_mm256_castsi256_si128(v))
        };
        (halves(head), halves(_mm256_srli_epi32::<16>(head)))
    }
}

/// Bands ahead that [`prefetch_slice`] reads.
const PF: usize = 1;

/// Block `c`'s share of the `bytes` contiguous bytes at `ahead` (a band,
/// `chunks` blocks a row) into the cache: the band's rows lie back to back,
/// so one slice of it a block walks it in order. One prefetch a row and
/// block instead (eight streams, each line touched about twice) streamed
/// Q8_0's one row from memory 1.4-1.8x slower than one row at a time.
#[inline(always)]
unsafe fn prefetch_slice(ahead: *const u8, bytes: usize, chunks: usize, c: usize) {
    let span = bytes.div_ceil(chunks);
    let from = ahead.wrapping_add(c * span);
    let mut o = 0;
    while o < span + 63 {
        // SAFETY: a prefetch never faults; the address may lie past the rows.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(from.wrapping_add(o).cast()) };
        o += 64;
    }
}

/// Lane `j` = the sum of `p[j]`'s eight lanes.
///
/// # Safety
/// AVX2 present.
#[inline(always)]
unsafe fn reduce(p: [__m256i; BAND]) -> __m256i {
    // SAFETY: AVX2 present (caller).
    unsafe {
        let h01 = _mm256_hadd_epi32(p[0], p[1]);
        let h23 = _mm256_hadd_epi32(p[2], p[3]);
        let h45 = _mm256_hadd_epi32(p[4], p[5]);
        let h67 = _mm256_hadd_epi32(p[6], p[7]);
        let h03 = _mm256_hadd_epi32(h01, h23);
        let h47 = _mm256_hadd_epi32(h45, h67);
        _mm256_add_epi32(
            _mm256_permute2x128_si256::<0x20>(h03, h47),
            _mm256_permute2x128_si256::<0x31>(h03, h47),
        )
    }
}

/// `T` activation rows (`t0..t0 + T`, one to four): rows `lo..hi` read
/// block by block, each weight row's eight lanes of a block summed across
/// rows by [`reduce`] (no band decoding), each weight block loaded once
/// for the `T` rows; the same totals and float operations as [`group`].
///
/// # Safety
/// As [`rows`], `t0 + T <= job.n`, `s.bx` filled.
#[inline(always)]
unsafe fn single<L: Quads, const T: usize>(
    job: &Job<'_>,
    t0: usize,
    lo: usize,
    hi: usize,
    out: *mut f32,
    s: &Scratch,
) {
    let (rb, chunks, rows) = (job.row_bytes, job.cols / 32, job.rows);
    // SAFETY (whole body): rows lo..hi of `raw` hold `chunks` blocks of
    // L::BYTES (missing rows of a band repeat its last one); activation
    // rows t0..t0 + T; AVX2, FMA, F16C present (caller).
    unsafe {
        let xq = job.acts.codes.as_ptr().add(t0 * job.cols);
        let xd = job.acts.scales.as_ptr().add(t0 * chunks);
        let ones = _mm256_set1_epi16(1);
        let mut r = lo;
        while r < hi {
            let live = (hi - r).min(BAND);
            let row = |j: usize| job.raw.as_ptr().add((r + j.min(live - 1)) * rb);
            let ahead = job.raw.as_ptr().wrapping_add((r + PF * BAND) * rb);
            let mut acc = [_mm256_setzero_ps(); T];
            let mut off = [_mm256_setzero_ps(); T];
            for c in 0..chunks {
                let mut x = [_mm256_setzero_si256(); T];
                for (t, x) in x.iter_mut().enumerate() {
                    *x = _mm256_loadu_si256(xq.add(t * job.cols + 32 * c).cast());
                }
                let mut p = [[_mm256_setzero_si256(); BAND]; T];
                prefetch_slice(ahead, BAND * rb, chunks, c);
                for j in 0..BAND {
                    let b = row(j).add(c * L::BYTES);
                    let w = L::stored(b);
                    let aw = if L::SIGNED { _mm256_sign_epi8(w, w) } else { w };
                    for (p, x) in p.iter_mut().zip(&x) {
                        p[j] = if L::SIGNED {
                            let sx = _mm256_sign_epi8(*x, w);
                            _mm256_madd_epi16(_mm256_maddubs_epi16(aw, sx), ones)
                        } else {
                            _mm256_madd_epi16(_mm256_maddubs_epi16(w, *x), ones)
                        };
                    }
                }
                // The eight rows' `d` (and `m`) by scalar loads: a gather
                // measured 10-15% slower here.
                let mut h = [0u16; 2 * BAND];
                for j in 0..BAND {
                    if L::E8M0 {
                        break;
                    }
                    let b = row(j).add(c * L::BYTES).cast::<u16>();
                    h[j] = b.read_unaligned();
                    if L::OFFSET {
                        h[BAND + j] = b.add(1).read_unaligned();
                    }
                }
                let h = _mm256_loadu_si256(h.as_ptr().cast());
                let sc = if L::E8M0 {
                    // MXFP4: the eight scales looked up in `unpack.rs`'s
                    // table the same way (one row, 2880 x 2880: 0.98x
                    // IQ4_NL; decoding the bytes in lanes, `e8m0_8`, 0.90x;
                    // gathered bytes 0.89x; the table's floats inserted lane
                    // by lane 0.95x).
                    let mut f = [0.0f32; BAND];
                    for (j, f) in f.iter_mut().enumerate() {
                        let e = *row(j).add(c * L::BYTES);
                        *f = crate::quant::unpack::E8M0_HALF[usize::from(e)];
                    }
                    _mm256_loadu_ps(f.as_ptr())
                } else {
                    _mm256_cvtph_ps(_mm256_castsi256_si128(h))
                };
                for t in 0..T {
                    let mut tot = reduce(p[t]);
                    if !L::SIGNED && L::BIAS != 0 {
                        let b = *s.bx.get_unchecked((t0 + t) * chunks + c);
                        tot = _mm256_sub_epi32(tot, _mm256_set1_epi32(b));
                    }
                    let coef = _mm256_mul_ps(sc, _mm256_set1_ps(*xd.add(t * chunks + c)));
                    acc[t] = _mm256_add_ps(acc[t], _mm256_mul_ps(coef, _mm256_cvtepi32_ps(tot)));
                }
                if L::OFFSET {
                    // offset = -m
                    let m = _mm256_cvtph_ps(_mm256_extracti128_si256::<1>(h));
                    let o = _mm256_xor_ps(m, _mm256_set1_ps(-0.0));
                    for (t, off) in off.iter_mut().enumerate() {
                        let q = *job.qsum.as_ptr().add((t0 + t) * chunks + c);
                        *off = _mm256_add_ps(*off, _mm256_mul_ps(o, _mm256_set1_ps(q)));
                    }
                }
            }
            for t in 0..T {
                let a = if L::OFFSET {
                    _mm256_sub_ps(acc[t], off[t])
                } else {
                    acc[t]
                };
                let mut v = [0.0f32; BAND];
                _mm256_storeu_ps(v.as_mut_ptr(), a);
                for (j, &v) in v.iter().enumerate().take(live) {
                    *out.add((t0 + t) * rows + r + j) = v;
                }
            }
            r += live;
        }
    }
}

/// A quarter in the band buffer.
#[derive(Clone, Copy)]
#[repr(C, align(32))]
pub(super) struct Quad(__m256i);

impl Default for Quad {
    fn default() -> Self {
        // SAFETY: AVX is baseline for every caller of this module; zeroing
        // a register needs nothing more than SSE2 on x86_64 anyway.
        Quad(unsafe { std::mem::zeroed() })
    }
}

/// Decodes the band `r..r + live` into `s.quads`, its scales into
/// `s.sband` and its offsets into `s.oband`; prefetches the band after the
/// next one.
///
/// # Safety
/// As [`rows_of`]'s body.
#[inline(always)]
unsafe fn decode<L: Quads>(job: &Job<'_>, r: usize, live: usize, s: &mut Scratch) {
    let (rb, chunks) = (job.row_bytes, job.cols / 32);
    // SAFETY (whole body): see the caller.
    unsafe {
        let row = |j: usize| job.raw.as_ptr().add((r + j.min(live - 1)) * rb);
        let ahead = job.raw.as_ptr().wrapping_add((r + PF * BAND) * rb);
        let mut at = [0i32; BAND];
        for (j, at) in at.iter_mut().enumerate() {
            *at = (j.min(live - 1) * rb) as i32;
        }
        let at = _mm256_loadu_si256(at.as_ptr().cast());
        let q = s.quads.as_mut_ptr();
        let per = if L::SIGNED { 2 } else { 1 };
        for c in 0..chunks {
            let p = |j: usize| row(j).add(c * L::BYTES);
            prefetch_slice(ahead, BAND * rb, chunks, c);
            let (mut lo, mut hi) = ([_mm256_setzero_si256(); 4], [_mm256_setzero_si256(); 4]);
            for j in 0..4 {
                (lo[j], hi[j]) = L::pair(p(j), p(j + 4));
            }
            // Rows (j, j + 4) in lanes (0..4, 4..8) of each 128 bits:
            // transpose the 32-bit lanes so quarter q has row j in lane j.
            for (h, v) in [lo, hi].iter().enumerate() {
                let u0 = _mm256_unpacklo_epi32(v[0], v[1]);
                let u1 = _mm256_unpacklo_epi32(v[2], v[3]);
                let v0 = _mm256_unpackhi_epi32(v[0], v[1]);
                let v1 = _mm256_unpackhi_epi32(v[2], v[3]);
                let four = [
                    _mm256_unpacklo_epi64(u0, u1),
                    _mm256_unpackhi_epi64(u0, u1),
                    _mm256_unpacklo_epi64(v0, v1),
                    _mm256_unpackhi_epi64(v0, v1),
                ];
                for (i, &w) in four.iter().enumerate() {
                    let at = (c * 8 + 4 * h + i) * per;
                    (*q.add(at)).0 = w;
                    if L::SIGNED {
                        (*q.add(at + 1)).0 = _mm256_sign_epi8(w, w);
                    }
                }
            }
            // The eight rows' `d` (and `m`; offset = -m).
            let (sc, m) = heads::<L>(row(0).add(c * L::BYTES), at);
            _mm256_storeu_ps(s.sband.as_mut_ptr().add(c * BAND), sc);
            if L::OFFSET {
                let o = _mm256_xor_ps(m, _mm256_set1_ps(-0.0));
                _mm256_storeu_ps(s.oband.as_mut_ptr().add(c * BAND), o);
            }
        }
    }
}

/// Activation rows `t..t + T` times the decoded band `r..r + live`.
///
/// # Safety
/// As [`rows_of`]'s body, with the band decoded.
#[inline(always)]
unsafe fn group<L: Quads, const T: usize>(
    job: &Job<'_>,
    s: &Scratch,
    r: usize,
    live: usize,
    t: usize,
    out: *mut f32,
) {
    let (k, rows) = (job.cols, job.rows);
    let chunks = k / 32;
    // SAFETY (whole body): activation rows t..t + T exist (caller); the
    // band's buffers hold `chunks` blocks.
    unsafe {
        let xq = job.acts.codes.as_ptr().add(t * k);
        let xd = job.acts.scales.as_ptr().add(t * chunks);
        let q = s.quads.as_ptr();
        let ones = _mm256_set1_epi16(1);
        let bcast = |i: usize, c: usize, quarter: usize| {
            _mm256_set1_epi32(
                xq.add(i * k + 32 * c + 4 * quarter)
                    .cast::<i32>()
                    .read_unaligned(),
            )
        };
        let mut acc = [_mm256_setzero_ps(); T];
        for c in 0..chunks {
            let mut tot = [_mm256_setzero_si256(); T];
            if L::SIGNED {
                for quarter in 0..8 {
                    let w = (*q.add(2 * (8 * c + quarter))).0;
                    let aw = (*q.add(2 * (8 * c + quarter) + 1)).0;
                    for (i, tot) in tot.iter_mut().enumerate() {
                        let sx = _mm256_sign_epi8(bcast(i, c, quarter), w);
                        let p = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, sx), ones);
                        *tot = _mm256_add_epi32(*tot, p);
                    }
                }
            } else {
                for run in 0..8 / L::RUN {
                    let mut s16 = [_mm256_setzero_si256(); T];
                    for quarter in run * L::RUN..(run + 1) * L::RUN {
                        let w = (*q.add(8 * c + quarter)).0;
                        for (i, s16) in s16.iter_mut().enumerate() {
                            let p = _mm256_maddubs_epi16(w, bcast(i, c, quarter));
                            *s16 = _mm256_add_epi16(*s16, p);
                        }
                    }
                    for (tot, s16) in tot.iter_mut().zip(s16) {
                        *tot = _mm256_add_epi32(*tot, _mm256_madd_epi16(s16, ones));
                    }
                }
                if L::BIAS != 0 {
                    for (i, tot) in tot.iter_mut().enumerate() {
                        let b = *s.bx.get_unchecked((t + i) * chunks + c);
                        *tot = _mm256_sub_epi32(*tot, _mm256_set1_epi32(b));
                    }
                }
            }
            let sc = _mm256_loadu_ps(s.sband.as_ptr().add(c * BAND));
            for (i, (acc, tot)) in acc.iter_mut().zip(tot).enumerate() {
                let coef = _mm256_mul_ps(sc, _mm256_set1_ps(*xd.add(i * chunks + c)));
                *acc = _mm256_add_ps(*acc, _mm256_mul_ps(coef, _mm256_cvtepi32_ps(tot)));
            }
        }
        if L::OFFSET {
            for (i, acc) in acc.iter_mut().enumerate() {
                let qs = job.qsum.as_ptr().add((t + i) * chunks);
                let mut off = _mm256_setzero_ps();
                for c in 0..chunks {
                    let o = _mm256_loadu_ps(s.oband.as_ptr().add(c * BAND));
                    off = _mm256_add_ps(off, _mm256_mul_ps(o, _mm256_set1_ps(*qs.add(c))));
                }
                *acc = _mm256_sub_ps(*acc, off);
            }
        }
        let mut v = [0.0f32; BAND];
        for (i, acc) in acc.iter().enumerate() {
            _mm256_storeu_ps(v.as_mut_ptr(), *acc);
            for (j, &v) in v.iter().enumerate().take(live) {
                *out.add((t + i) * rows + r + j) = v;
            }
        }
    }
}
