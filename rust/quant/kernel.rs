//! The fused dequantise-and-dot kernels, written once over [`Lanes`].
//!
//! A band of weight rows is unpacked (a few rows at a time, into a small
//! per-thread buffer of int8 codes and per-group scales that stays in L1),
//! then multiplied by tiles of activation rows. A weight is
//! `scale_g * code - offset_g`, so a row's dot product is
//! `sum_g scale_g * (sum_{c in g} code_c * x_c) - sum_g offset_g * X_g` with
//! `X_g` the activations' sum over group `g` (computed once per call).
//!
//! **Fixed order** (the group-sum order; `row1` and `multirow` keep it too).
//! Every output element `(t, r)` is accumulated the same way whatever the
//! tile, the batch size, the row's position in the batch or the thread that
//! runs it: per group in column order a fresh eight-lane dot of the codes
//! (as floats, exact) and the activations, `s = q_0 * x_0`, then
//! `s = fma(q_c, x_c, s)` chunk by chunk ([`dot_step`]), scaled once into
//! the row's one accumulator, `acc = fma(scale_g, s, acc)`;
//! `off += offset_g * X_g` in group order; finally `hsum(acc) - off`
//! ([`Lanes::hsum`]).
//! Float formats: one accumulator `acc = fma(w_c, x_c, acc)` over the
//! chunks with `w_c` the stored values, then the columns past the last whole
//! chunk one by one.
//!
//! (Until 2026-12-02 the block formats used the scale-folded order, `w_c =
//! code_c * scale_g` then `acc = fma(w_c, x_c, acc)`: one multiply per
//! eight weights more in the one-row path. Both are within the same
//! float32 bound: gguf's weight `code * scale` is exact in float32 for
//! every format, at most 11 + 7 + 5 significant bits, so the only roundings
//! are the sums', `G/8 + K/G + 4` for a value at most, never more than the
//! old `K/8 + 5`; see `tests::bound`.)

use super::format::QuantType;
use super::simd::Lanes;
use super::unpack::{float_at, q8_0_scales, unpack_row};

/// One matmul: `out[t * rows + r] = sum_c W[r, c] * x[t * cols + c]`.
pub(crate) struct Job<'a> {
    pub qtype: QuantType,
    pub raw: &'a [u8],
    pub row_bytes: usize,
    pub rows: usize,
    pub cols: usize,
    pub x: &'a [f32],
    pub n: usize,
    /// Formats with offsets: each activation row's sums over each group
    /// (`n` x `cols / group_values`), see [`group_sums`].
    pub xsum: &'a [f32],
}

/// The sums of each activation row over each group of `group` columns, in
/// column order (one fixed order, so results do not depend on the batch).
pub(crate) fn group_sums(x: &[f32], group: usize) -> Vec<f32> {
    x.chunks_exact(group)
        .map(|c| c.iter().fold(0.0f32, |s, &v| s + v))
        .collect()
}

/// What a [`Job`]'s `xsum` holds for `qtype`: the group sums of `x` for
/// formats with offsets, nothing for the others.
pub(crate) fn offset_sums(qtype: QuantType, x: &[f32]) -> Vec<f32> {
    if qtype.has_offsets() {
        group_sums(x, qtype.group_values())
    } else {
        Vec::new()
    }
}

/// A prefetch of the line at `p` into every cache level.
#[inline(always)]
fn prefetch(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch never faults, whatever the address.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast())
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Per-thread buffers for unpacked rows (grown once, then reused).
#[derive(Default)]
pub(crate) struct Scratch {
    codes: Vec<i8>,
    scale: Vec<f32>,
    offset: Vec<f32>,
}

/// Weight rows unpacked per step (the widest row tile).
const ROW_TILE: usize = 4;

/// Where a tile's weight rows come from.
#[derive(Clone, Copy)]
enum Src {
    /// Codes `stride` bytes a row, group `g`'s `group` codes at `g * gstride`,
    /// and `groups` scales (offsets) a row.
    Codes {
        codes: *const i8,
        scale: *const f32,
        offset: *const f32,
        stride: usize,
        gstride: usize,
        groups: usize,
        group: usize,
    },
    /// Float rows in place, `stride` bytes apart.
    Float { raw: *const u8, stride: usize },
}

/// Rows `lo..hi` of `job` into `out` (`n` x `rows`, row-major).
///
/// # Safety
/// `out` must be valid for writes of `job.n * job.rows` floats, and no
/// other thread may write the columns `lo..hi` meanwhile. `S` must be
/// usable on this CPU.
#[inline(always)]
pub(crate) unsafe fn run_rows<S: Lanes>(
    job: &Job<'_>,
    lo: usize,
    hi: usize,
    out: *mut f32,
    scratch: &mut Scratch,
) {
    let (k, qtype) = (job.cols, job.qtype);
    let float = qtype.is_float();
    let (group, offsets) = (qtype.group_values(), qtype.has_offsets());
    let groups = k / group;
    // Q8_0's codes are read in place; only its scales are unpacked.
    let in_place = qtype == QuantType::Q8_0;
    // Decode (one activation row) of Q6_K: prefetch the rows ahead.
    let ahead_rows = job.n == 1 && qtype == QuantType::Q6K;
    if !float {
        scratch
            .codes
            .resize(if in_place { 0 } else { ROW_TILE * k }, 0);
        scratch.scale.resize(ROW_TILE * groups, 0.0);
        scratch.offset.resize(ROW_TILE * groups, 0.0);
    }
    let mut r = lo;
    while r < hi {
        let rt = if hi - r >= ROW_TILE { ROW_TILE } else { 1 };
        if in_place {
            for i in 0..rt {
                let row = &job.raw[(r + i) * job.row_bytes..(r + i + 1) * job.row_bytes];
                q8_0_scales::<S>(row, &mut scratch.scale[i * groups..(i + 1) * groups]);
            }
        } else if !float {
            for i in 0..rt {
                if ahead_rows {
                    // Two tiles ahead, the whole row: Q6_K's unpacking waits on
                    // its loads (exact_cold_probe 1536x2048, one row, same run:
                    // cold 1.05-1.12x, hot 0.92-0.95x; Q5_0 cold 1.01-1.03x, so
                    // only Q6_K, in every K-quant file).
                    let ahead = job
                        .raw
                        .as_ptr()
                        .wrapping_add((r + i + 2 * ROW_TILE) * job.row_bytes);
                    let mut l = 0;
                    while l < job.row_bytes {
                        prefetch(ahead.wrapping_add(l));
                        l += 64;
                    }
                }
                let row = &job.raw[(r + i) * job.row_bytes..(r + i + 1) * job.row_bytes];
                unpack_row::<S>(
                    qtype,
                    row,
                    &mut scratch.codes[i * k..(i + 1) * k],
                    &mut scratch.scale[i * groups..(i + 1) * groups],
                    &mut scratch.offset[i * groups..(i + 1) * groups],
                );
            }
        }
        let mut t = 0;
        while t < job.n {
            // Float formats take eight activation rows a tile; codes need
            // registers for the group sums too, so four.
            let nt = match job.n - t {
                8.. if float => 8,
                4.. => 4,
                2..=3 => 2,
                _ => 1,
            };
            let rs = match nt {
                1 | 2 => 4,
                4 => 2,
                _ => 1,
            }
            .min(rt);
            for i in (0..rt).step_by(rs) {
                let src = if float {
                    Src::Float {
                        // SAFETY: row r + i < rows, inside `raw`.
                        raw: unsafe { job.raw.as_ptr().add((r + i) * job.row_bytes) },
                        stride: job.row_bytes,
                    }
                } else {
                    // SAFETY: i < rt <= ROW_TILE rows of the scratch, and
                    // row r + i of `raw` for Q8_0 (codes after each scale).
                    unsafe {
                        let (codes, stride, gstride) = if in_place {
                            let p = job.raw.as_ptr().add((r + i) * job.row_bytes + 2);
                            (p.cast::<i8>(), job.row_bytes, 34)
                        } else {
                            (scratch.codes.as_ptr().add(i * k), k, group)
                        };
                        Src::Codes {
                            codes,
                            scale: scratch.scale.as_ptr().add(i * groups),
                            offset: scratch.offset.as_ptr().add(i * groups),
                            stride,
                            gstride,
                            groups,
                            group,
                        }
                    }
                };
                // SAFETY: x holds n rows of k; out is n x rows (caller).
                unsafe {
                    let x = job.x.as_ptr().add(t * k);
                    let o = out.add(t * job.rows + r + i);
                    let xsum = job.xsum.as_ptr().add(if offsets { t * groups } else { 0 });
                    tile::<S>(qtype, offsets, src, rs, nt, (x, xsum), k, o, job.rows);
                }
            }
            t += nt;
        }
        r += rt;
    }
}

/// One `rs` x `nt` tile (weight rows x activation rows).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn tile<S: Lanes>(
    qtype: QuantType,
    offsets: bool,
    src: Src,
    rs: usize,
    nt: usize,
    (x, xsum): (*const f32, *const f32),
    k: usize,
    out: *mut f32,
    out_stride: usize,
) {
    macro_rules! go {
        ($r:literal, $n:literal) => {{
            // SAFETY: forwarded from the caller.
            let res: [[f32; $n]; $r] = unsafe {
                match src {
                    Src::Codes {
                        codes,
                        scale,
                        offset,
                        stride,
                        gstride,
                        groups,
                        group,
                    } => {
                        let layout = (stride, gstride, groups, group);
                        let xs = (x, xsum, k);
                        match (offsets, group) {
                            (true, 32) => {
                                codes_tile::<S, $r, $n, true, 4>(codes, scale, offset, layout, xs)
                            }
                            (true, _) => {
                                codes_tile::<S, $r, $n, true, 2>(codes, scale, offset, layout, xs)
                            }
                            (false, 32) => {
                                codes_tile::<S, $r, $n, false, 4>(codes, scale, offset, layout, xs)
                            }
                            (false, _) => {
                                codes_tile::<S, $r, $n, false, 2>(codes, scale, offset, layout, xs)
                            }
                        }
                    }
                    Src::Float { raw, stride } => match qtype {
                        QuantType::F32 => float_tile::<S, $r, $n, 0>(raw, stride, x, k),
                        QuantType::F16 => float_tile::<S, $r, $n, 1>(raw, stride, x, k),
                        _ => float_tile::<S, $r, $n, 2>(raw, stride, x, k),
                    },
                }
            };
            for (i, row) in res.iter().enumerate() {
                for (t, &v) in row.iter().enumerate() {
                    // SAFETY: (t, i) inside the output (caller).
                    unsafe { *out.add(t * out_stride + i) = v };
                }
            }
        }};
    }
    match (rs, nt) {
        (4, 1) => go!(4, 1),
        (4, 2) => go!(4, 2),
        (2, 4) => go!(2, 4),
        (1, 8) => go!(1, 8),
        (1, 4) => go!(1, 4),
        (1, 2) => go!(1, 2),
        _ => go!(1, 1),
    }
}

/// `R` unpacked weight rows times `N` activation rows (`x`, `k` apart,
/// with their group sums `xsum`, `groups` apart, for formats with offsets).
#[inline(always)]
unsafe fn codes_tile<
    S: Lanes,
    const R: usize,
    const N: usize,
    const OFFSETS: bool,
    const C: usize,
>(
    codes: *const i8,
    scale: *const f32,
    offset: *const f32,
    (stride, gstride, groups, group): (usize, usize, usize, usize),
    (x, xsum, k): (*const f32, *const f32, usize),
) -> [[f32; N]; R] {
    // SAFETY (whole body): codes/scales of R rows and x (xsum) of N rows
    // are in bounds (caller); S is usable (caller).
    unsafe {
        let mut acc = [[S::zero(); N]; R];
        let mut off = [[0.0f32; N]; R];
        for g in 0..groups {
            for i in 0..R {
                let a = S::splat(*scale.add(i * groups + g));
                // The group's dot of codes and activations, a fresh chain.
                let mut s = [S::zero(); N];
                for j in 0..C {
                    let q = S::codes(codes.add(i * stride + g * gstride + 8 * j));
                    let c = g * group + 8 * j;
                    for (t, s) in s.iter_mut().enumerate() {
                        *s = dot_step::<S>(j == 0, q, S::load(x.add(t * k + c)), *s);
                    }
                }
                // Scaled once per group into the row's accumulator.
                for (acc, &s) in acc[i].iter_mut().zip(&s) {
                    *acc = S::fma(a, s, *acc);
                }
                if OFFSETS {
                    let b = *offset.add(i * groups + g);
                    for (t, off) in off[i].iter_mut().enumerate() {
                        *off += b * *xsum.add(t * groups + g);
                    }
                }
            }
        }
        let mut res = [[0.0f32; N]; R];
        for i in 0..R {
            for t in 0..N {
                res[i][t] = S::hsum(acc[i][t]) - off[i][t];
            }
        }
        res
    }
}

/// One step of a group's dot: `q * x` for its first chunk (`first`),
/// `fma(q, x, s)` after. Every path (this module's tiles, [`row1`],
/// `multirow`) forms a group sum with exactly these operations.
#[inline(always)]
pub(crate) unsafe fn dot_step<S: Lanes>(first: bool, q: S::V, x: S::V, s: S::V) -> S::V {
    // SAFETY: S is usable (caller).
    unsafe {
        if first {
            S::mul(q, x)
        } else {
            S::fma(q, x, s)
        }
    }
}

/// `R` float rows in place (`KIND` 0: F32, 1: F16, 2: BF16) times `N` activation rows.
#[inline(always)]
unsafe fn float_tile<S: Lanes, const R: usize, const N: usize, const KIND: u8>(
    raw: *const u8,
    stride: usize,
    x: *const f32,
    k: usize,
) -> [[f32; N]; R] {
    let size = if KIND == 0 { 4 } else { 2 };
    let whole = k / 8 * 8;
    // SAFETY (whole body): R rows of k values at `raw`, `stride` bytes
    // apart, and N rows of k at `x` (caller); S is usable (caller).
    unsafe {
        let mut acc = [[S::zero(); N]; R];
        let mut c = 0;
        while c < whole {
            for i in 0..R {
                let p = raw.add(i * stride + c * size);
                let w = match KIND {
                    0 => S::load(p.cast()),
                    1 => S::load_f16(p),
                    _ => S::load_bf16(p),
                };
                for (t, acc) in acc[i].iter_mut().enumerate() {
                    *acc = S::fma(w, S::load(x.add(t * k + c)), *acc);
                }
            }
            c += 8;
        }
        // Loops, not `acc.map(..)`: `map` is a generic function of its own,
        // compiled without this kernel's target features, so the SIMD sums
        // inside its closure became out-of-line calls that spilled the tile.
        let mut res = [[0.0f32; N]; R];
        for (o, a) in res.iter_mut().zip(&acc) {
            for (o, &v) in o.iter_mut().zip(a) {
                *o = S::hsum(v);
            }
        }
        let qtype = match KIND {
            0 => QuantType::F32,
            1 => QuantType::F16,
            _ => QuantType::BF16,
        };
        for c in whole..k {
            for (i, res) in res.iter_mut().enumerate() {
                let b = std::slice::from_raw_parts(raw.add(i * stride + c * size), size);
                let w = float_at(qtype, b);
                for (t, res) in res.iter_mut().enumerate() {
                    *res += w * *x.add(t * k + c);
                }
            }
        }
        res
    }
}

/// One activation row of the 32-value-block formats (Q8_0, Q4_0, Q4_1,
/// Q5_0, Q5_1, IQ4_NL, MXFP4) on AVX2, with each block's codes decoded into
/// registers where they lie: no scratch, no unpacking pass.
///
/// **The same bits as [`run_rows`].** Each output is computed by the same
/// operations in the same order: per block a fresh dot of its four
/// eight-code chunks with the activations ([`dot_step`]: `q_0 * x_0`, then
/// fused multiply-adds), `acc = fma(scale, s, acc)` in the row's one
/// accumulator, `off += offset * X_g` block by block, then `hsum(acc) -
/// off`. Only where the codes come from changes (the same int8 codes
/// `unpack.rs` writes), and how many rows share a pass: a tile of
/// [`Block::ROWS`] rows keeps that many accumulator chains in flight.
#[cfg(target_arch = "x86_64")]
pub(crate) mod row1 {
    use super::Job;
    use crate::quant::format::QuantType;
    use crate::quant::simd::{Avx2, Lanes};
    use std::arch::x86_64::*;

    /// Passes of eight rows (when `$wide` is 8), then of four, then single
    /// rows, each by `$tile!(rows)`, which advances `$r`.
    macro_rules! passes {
        ($tile:ident, $wide:expr, $r:ident, $hi:expr) => {
            while $wide == 8 && $hi - $r >= 8 {
                $tile!(8);
            }
            while $hi - $r >= 4 {
                $tile!(4);
            }
            while $r < $hi {
                $tile!(1);
            }
        };
    }

    /// A pass's results: `out[i] = hsum(acc[i]) - off[i]`.
    ///
    /// # Safety
    /// AVX2 present; `N` writable floats at `out`.
    #[inline(always)]
    unsafe fn finish<const N: usize>(out: *mut f32, acc: &[__m256; N], off: &[f32; N]) {
        for i in 0..N {
            // SAFETY: i < N (caller); AVX2 (caller).
            unsafe { *out.add(i) = Avx2::hsum(acc[i]) - off[i] };
        }
    }

    /// Whether [`rows`] takes `qtype`.
    pub(crate) fn covers(qtype: QuantType) -> bool {
        matches!(
            qtype,
            QuantType::Q8_0
                | QuantType::Q4_0
                | QuantType::Q4_1
                | QuantType::IQ4NL
                | QuantType::MXFP4
                | QuantType::Q4K
        )
    }

    /// Whether [`rows_by`] has a kernel for `qtype`: [`covers`]'s formats
    /// and Q5_0 / Q5_1, whose fifth bits cost more in registers than the
    /// general tiles' unpacking (measured slower; kept for the probe).
    #[cfg(test)]
    pub(crate) fn implements(qtype: QuantType) -> bool {
        covers(qtype) || matches!(qtype, QuantType::Q5_0 | QuantType::Q5_1)
    }

    /// Rows `lo..hi` of `job` (one activation row, a format [`covers`]
    /// takes) into `out[lo..hi]`.
    ///
    /// # Safety
    /// AVX2, FMA and F16C present; `job.n == 1`; `out` holds `job.rows`
    /// floats and nobody else writes `out[lo..hi]` meanwhile.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn rows(job: &Job<'_>, lo: usize, hi: usize, out: *mut f32) {
        // SAFETY: forwarded.
        unsafe { rows_by(job, lo, hi, out, 0) }
    }

    /// [`rows`] with passes of `wide` rows (8 or 4; 0: the format's own),
    /// for any format [`implements`] takes.
    ///
    /// # Safety
    /// As [`rows`].
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn rows_by(job: &Job<'_>, lo: usize, hi: usize, out: *mut f32, wide: usize) {
        if job.qtype == QuantType::Q4K {
            // SAFETY: forwarded.
            return unsafe {
                // Passes of eight rows by default (cold 1.04x four).
                match wide {
                    4 => go_q4k::<4>(job, lo, hi, out),
                    _ => go_q4k::<8>(job, lo, hi, out),
                }
            };
        }
        macro_rules! each {
            ($($t:ident => $l:ident),*) => {
                match job.qtype {
                    $(QuantType::$t => {
                        let wide = if wide == 0 { $l::ROWS } else { wide };
                        if wide == 8 { go::<$l, 8>(job, lo, hi, out) } else { go::<$l, 4>(job, lo, hi, out) }
                    })*
                    other => unreachable!("{} has no one-row kernel", other.name()),
                }
            };
        }
        // SAFETY: forwarded.
        unsafe {
            each!(
                Q8_0 => Q8_0,
                Q4_0 => Q4_0,
                Q4_1 => Q4_1,
                Q5_0 => Q5_0,
                Q5_1 => Q5_1,
                IQ4NL => Iq4Nl,
                MXFP4 => Mxfp4
            )
        }
    }

    #[inline(always)]
    unsafe fn go<L: Block, const WIDE: usize>(job: &Job<'_>, lo: usize, hi: usize, out: *mut f32) {
        let blocks = job.cols / 32;
        let rb = job.row_bytes;
        let (x, xsum) = (job.x.as_ptr(), job.xsum.as_ptr());
        let mut r = lo;
        // SAFETY (whole body): rows lo..hi of `raw` hold `blocks` blocks of
        // L::BYTES; `x` one row of `cols` floats and `xsum` (offsets only)
        // one sum per block; `out[lo..hi]` is ours (caller).
        unsafe {
            macro_rules! tile {
                ($rt:literal) => {{
                    let base = job.raw.as_ptr().add(r * rb);
                    let mut acc = [_mm256_setzero_ps(); $rt];
                    let mut off = [0.0f32; $rt];
                    // A decode step's weights come from memory: the next
                    // pass's rows, as the contiguous bytes they are, a slice
                    // of them a block. (One prefetch a row and block two
                    // passes ahead, eight streams with each line touched
                    // about twice, read Q8_0's rows cold at 8-9 GB/s:
                    // exact_batch_cold_probe 1536 x 576, one row, 104-121
                    // -> 79-82 us; Q4_0, Q4_1 the same.)
                    let ahead = base.wrapping_add(WIDE * rb);
                    let span = ($rt * rb).div_ceil(blocks);
                    for c in 0..blocks {
                        let xp = x.add(c * 32);
                        let from = ahead.wrapping_add(c * span);
                        let mut o = 0;
                        while o < span + 63 {
                            _mm_prefetch::<_MM_HINT_T0>(from.wrapping_add(o).cast());
                            o += 64;
                        }
                        for i in 0..$rt {
                            let b = base.add(i * rb + c * L::BYTES);
                            let q = L::chunks(b);
                            // The block's dot (`dot_step`'s operations), then
                            // scaled once into the row's accumulator.
                            let mut s = _mm256_mul_ps(q[0], _mm256_loadu_ps(xp));
                            for (j, &q) in q.iter().enumerate().skip(1) {
                                s = _mm256_fmadd_ps(q, _mm256_loadu_ps(xp.add(8 * j)), s);
                            }
                            acc[i] = _mm256_fmadd_ps(L::splat_scale(b), s, acc[i]);
                            if L::OFFSET {
                                off[i] += L::offset(b) * *xsum.add(c);
                            }
                        }
                    }
                    finish(out.add(r), &acc, &off);
                    r += $rt;
                }};
            }
            passes!(tile, WIDE, r, hi);
        }
    }

    /// Q4_K's super-blocks decoded in registers, passes of `WIDE` rows:
    /// each row's eight group scales and offsets as `unpack.rs`'s
    /// `k4_scales` gives them (the tiles' floats; [`k4_scales8`] decodes
    /// them eight lanes at a time), each 32-byte
    /// quarter of codes widened from memory four times and split into its
    /// two groups (low nibbles, then high) by mask and shift. Per group
    /// the tiles' operations in their order: a fresh dot of its four
    /// chunks, `acc = fma(scale_g, s, acc)`, `off += offset_g * X_g`; then
    /// `hsum(acc) - off`. So the same bits as the tiles, without their
    /// unpacking pass through scratch.
    #[inline(always)]
    unsafe fn go_q4k<const WIDE: usize>(job: &Job<'_>, lo: usize, hi: usize, out: *mut f32) {
        let supers = job.cols / 256;
        let rb = job.row_bytes;
        let (x, xsum) = (job.x.as_ptr(), job.xsum.as_ptr());
        let mut r = lo;
        // SAFETY (whole body): rows lo..hi of `raw` hold `supers`
        // super-blocks of 144 bytes; `x` one row of `cols` floats and
        // `xsum` one sum per 32 values; `out[lo..hi]` is ours (caller).
        unsafe {
            let m = _mm256_set1_epi32(15);
            macro_rules! tile {
                ($rt:literal) => {{
                    let base = job.raw.as_ptr().add(r * rb);
                    let mut acc = [_mm256_setzero_ps(); $rt];
                    let mut off = [0.0f32; $rt];
                    for c in 0..supers {
                        for i in 0..$rt {
                            let b = base.add(i * rb + c * 144);
                            // Two passes ahead, every line of the super-block
                            // (a contiguous slice of the next pass a
                            // super-block, as `go` does, measured the same:
                            // Q4_K's one row is bound by its arithmetic).
                            let ahead = b.wrapping_add(2 * WIDE * rb);
                            for line in [0, 64, 128, 143] {
                                _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(line).cast());
                            }
                            let (sc, mn) = k4_scales8(b);
                            for j in 0..4 {
                                let q = b.add(16 + 32 * j);
                                let v = [0, 1, 2, 3].map(|h| {
                                    _mm256_cvtepu8_epi32(_mm_loadl_epi64(q.add(8 * h).cast()))
                                });
                                for part in 0..2 {
                                    let g = 8 * c + 2 * j + part;
                                    let xp = x.add(32 * g);
                                    let code = |h: usize| {
                                        _mm256_cvtepi32_ps(if part == 0 {
                                            _mm256_and_si256(v[h], m)
                                        } else {
                                            _mm256_srli_epi32::<4>(v[h])
                                        })
                                    };
                                    let mut s = _mm256_mul_ps(code(0), _mm256_loadu_ps(xp));
                                    for h in 1..4 {
                                        s = _mm256_fmadd_ps(
                                            code(h),
                                            _mm256_loadu_ps(xp.add(8 * h)),
                                            s,
                                        );
                                    }
                                    acc[i] = _mm256_fmadd_ps(
                                        _mm256_set1_ps(sc[2 * j + part]),
                                        s,
                                        acc[i],
                                    );
                                    off[i] += mn[2 * j + part] * *xsum.add(g);
                                }
                            }
                        }
                    }
                    finish(out.add(r), &acc, &off);
                    r += $rt;
                }};
            }
            passes!(tile, WIDE, r, hi);
        }
    }

    /// A Q4_K super-block's eight group scales `d * sc_j` and offsets
    /// `dmin * m_j`, the floats `unpack.rs::k4_scales` gives (the six-bit
    /// fields as exact integers, one multiply each), decoded eight lanes at
    /// a time: the scalar decode was about a third of the one-row kernel's
    /// operations.
    #[inline(always)]
    unsafe fn k4_scales8(b: *const u8) -> ([f32; 8], [f32; 8]) {
        // SAFETY: forwarded (caller).
        unsafe {
            let (sv, mv) = k4_scales8v(b);
            let (mut s, mut m) = ([0.0f32; 8], [0.0f32; 8]);
            _mm256_storeu_ps(s.as_mut_ptr(), sv);
            _mm256_storeu_ps(m.as_mut_ptr(), mv);
            (s, m)
        }
    }

    /// [`k4_scales8`] in registers: the eight scales, the eight offsets.
    ///
    /// # Safety
    /// 144 readable bytes at `b`; AVX2 and F16C present.
    #[inline(always)]
    pub(crate) unsafe fn k4_scales8v(b: *const u8) -> (__m256, __m256) {
        // SAFETY: 144 readable bytes at b (caller); AVX2, F16C (caller).
        unsafe {
            let q = b.add(4);
            // Lane j: a = q[j], c = q[4 + j], w = q[j % 4].
            let a = _mm256_cvtepu8_epi32(_mm_loadl_epi64(q.cast()));
            let c = _mm256_cvtepu8_epi32(_mm_loadl_epi64(q.add(4).cast()));
            let w = _mm256_cvtepu8_epi32(_mm_set1_epi32(q.cast::<i32>().read_unaligned()));
            let (m63, m15) = (_mm256_set1_epi32(63), _mm256_set1_epi32(15));
            // j < 4: scale q[j] & 63, min q[j + 4] & 63; j >= 4: scale
            // q[j + 4] & 15 | (q[j - 4] >> 6) << 4, min q[j + 4] >> 4 |
            // (q[j] >> 6) << 4.
            let top = |v: __m256i| _mm256_slli_epi32::<4>(_mm256_srli_epi32::<6>(v));
            let sc = _mm256_blend_epi32::<0xF0>(
                _mm256_and_si256(a, m63),
                _mm256_or_si256(_mm256_and_si256(c, m15), top(w)),
            );
            let mn = _mm256_blend_epi32::<0xF0>(
                _mm256_and_si256(c, m63),
                _mm256_or_si256(_mm256_srli_epi32::<4>(c), top(a)),
            );
            let half = |at: usize| {
                _mm256_cvtph_ps(_mm_set1_epi16(b.add(at).cast::<i16>().read_unaligned()))
            };
            (
                _mm256_mul_ps(half(0), _mm256_cvtepi32_ps(sc)),
                _mm256_mul_ps(half(2), _mm256_cvtepi32_ps(mn)),
            )
        }
    }

    /// Whether [`blocks_tile`] takes `qtype`.
    pub(crate) fn fuses(qtype: QuantType) -> bool {
        covers(qtype) || matches!(qtype, QuantType::Q5_0 | QuantType::Q5_1)
    }

    /// Activation rows of a fused tile ([`blocks_tile`]): one weight row,
    /// eight accumulators, its four code chunks, the scale and the dot fill
    /// fourteen of AVX2's sixteen registers.
    pub(crate) const FN: usize = 8;

    /// `multirow`'s tile for short batches on AVX2: weight row `raw` (whole
    /// blocks of `qtype`, a format [`fuses`] takes) decoded block by block
    /// in registers, as [`rows`] does, times `nt` activation rows (`k`
    /// apart at `x`), less the offset terms `sub` (activation `t` at `t`),
    /// into `out` (`out_stride` apart). Each block's dot with each
    /// activation row, its scaling and the sum are [`rows`]'s operations
    /// in its order, so the same bits; the row is not unpacked into codes
    /// first. `nt` at most [`FN`].
    ///
    /// # Safety
    /// AVX2, FMA and F16C present; the row, activations, offset terms and
    /// outputs in bounds.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn blocks_tile(
        qtype: QuantType,
        nt: usize,
        raw: *const u8,
        (x, k): (*const f32, usize),
        sub: Option<*const f32>,
        out: *mut f32,
        out_stride: usize,
    ) {
        /// One weight row's dot with `N` activation rows, by format.
        trait RowDot {
            /// # Safety
            /// As [`blocks_dot`].
            unsafe fn dot<const N: usize>(raw: *const u8, x: *const f32, k: usize) -> [f32; N];
        }
        /// Q4_K's super-blocks ([`q4k_dot`]).
        struct SuperQ4K;
        impl RowDot for SuperQ4K {
            #[inline(always)]
            unsafe fn dot<const N: usize>(raw: *const u8, x: *const f32, k: usize) -> [f32; N] {
                // SAFETY: forwarded.
                unsafe { q4k_dot::<N>(raw, x, k) }
            }
        }
        /// A 32-value-block format ([`blocks_dot`]).
        struct Blocks<L>(std::marker::PhantomData<L>);
        impl<L: Block> RowDot for Blocks<L> {
            #[inline(always)]
            unsafe fn dot<const N: usize>(raw: *const u8, x: *const f32, k: usize) -> [f32; N] {
                // SAFETY: forwarded.
                unsafe { blocks_dot::<L, N>(raw, x, k) }
            }
        }
        #[inline(always)]
        unsafe fn each<D: RowDot>(
            nt: usize,
            raw: *const u8,
            (x, k): (*const f32, usize),
            sub: Option<*const f32>,
            out: *mut f32,
            out_stride: usize,
        ) {
            macro_rules! go {
                ($n:literal) => {{
                    // SAFETY: forwarded from the caller.
                    let res = unsafe { D::dot::<$n>(raw, x, k) };
                    for (t, &v) in res.iter().enumerate() {
                        // SAFETY: t inside the output and the offset terms (caller).
                        unsafe {
                            let v = match sub {
                                Some(offs) => v - *offs.add(t),
                                None => v,
                            };
                            *out.add(t * out_stride) = v;
                        }
                    }
                }};
            }
            match nt {
                1 => go!(1),
                2 => go!(2),
                3 => go!(3),
                4 => go!(4),
                5 => go!(5),
                6 => go!(6),
                7 => go!(7),
                _ => go!(8),
            }
        }
        // SAFETY: forwarded.
        unsafe {
            match qtype {
                QuantType::Q4K => each::<SuperQ4K>(nt, raw, (x, k), sub, out, out_stride),
                QuantType::Q8_0 => each::<Blocks<Q8_0>>(nt, raw, (x, k), sub, out, out_stride),
                QuantType::Q4_0 => each::<Blocks<Q4_0>>(nt, raw, (x, k), sub, out, out_stride),
                QuantType::Q4_1 => each::<Blocks<Q4_1>>(nt, raw, (x, k), sub, out, out_stride),
                QuantType::Q5_0 => each::<Blocks<Q5_0>>(nt, raw, (x, k), sub, out, out_stride),
                QuantType::Q5_1 => each::<Blocks<Q5_1>>(nt, raw, (x, k), sub, out, out_stride),
                QuantType::IQ4NL => each::<Blocks<Iq4Nl>>(nt, raw, (x, k), sub, out, out_stride),
                QuantType::MXFP4 => each::<Blocks<Mxfp4>>(nt, raw, (x, k), sub, out, out_stride),
                other => unreachable!("{} has no fused AVX2 tile", other.name()),
            }
        }
    }

    /// One Q4_K weight row times `N` activation rows in [`go_q4k`]'s order
    /// (so the tiles' bits): per group a fresh dot of its four eight-code
    /// chunks with each activation row, `acc = fma(scale_g, s, acc)`, then
    /// `hsum`; the offsets are the caller's. Each super-block's scales and
    /// codes are decoded once for the `N` rows.
    #[inline(always)]
    unsafe fn q4k_dot<const N: usize>(raw: *const u8, x: *const f32, k: usize) -> [f32; N] {
        // SAFETY (whole body): k / 256 super-blocks of 144 bytes at raw, N
        // rows of k floats at x (caller); AVX2, FMA and F16C present (caller).
        unsafe {
            let m = _mm256_set1_epi32(15);
            let mut acc = [_mm256_setzero_ps(); N];
            for c in 0..k / 256 {
                let b = raw.add(c * 144);
                let (sc, _) = k4_scales8(b);
                for j in 0..4 {
                    let q = b.add(16 + 32 * j);
                    let v = [0, 1, 2, 3]
                        .map(|h| _mm256_cvtepu8_epi32(_mm_loadl_epi64(q.add(8 * h).cast())));
                    for part in 0..2 {
                        let g = 8 * c + 2 * j + part;
                        let codes = v.map(|v| {
                            _mm256_cvtepi32_ps(if part == 0 {
                                _mm256_and_si256(v, m)
                            } else {
                                _mm256_srli_epi32::<4>(v)
                            })
                        });
                        let a = _mm256_set1_ps(sc[2 * j + part]);
                        for (t, acc) in acc.iter_mut().enumerate() {
                            let xp = x.add(t * k + 32 * g);
                            let mut s = _mm256_mul_ps(codes[0], _mm256_loadu_ps(xp));
                            for (h, &code) in codes.iter().enumerate().skip(1) {
                                s = _mm256_fmadd_ps(code, _mm256_loadu_ps(xp.add(8 * h)), s);
                            }
                            *acc = _mm256_fmadd_ps(a, s, *acc);
                        }
                    }
                }
            }
            let mut sums = [0.0f32; N];
            for (o, &a) in sums.iter_mut().zip(&acc) {
                *o = Avx2::hsum(a);
            }
            sums
        }
    }

    /// One weight row of `L` times `N` activation rows in [`rows`]'s order:
    /// per block a fresh dot of its four code chunks with each activation
    /// row, `acc = fma(scale, s, acc)`, then `hsum`.
    #[inline(always)]
    unsafe fn blocks_dot<L: Block, const N: usize>(
        raw: *const u8,
        x: *const f32,
        k: usize,
    ) -> [f32; N] {
        // SAFETY (whole body): k / 32 blocks at raw, N rows of k floats at
        // x (caller); AVX2, FMA and F16C present (caller).
        unsafe {
            let mut acc = [_mm256_setzero_ps(); N];
            for c in 0..k / 32 {
                let b = raw.add(c * L::BYTES);
                let q = L::chunks(b);
                let a = L::splat_scale(b);
                for (t, acc) in acc.iter_mut().enumerate() {
                    let xp = x.add(t * k + c * 32);
                    let mut s = _mm256_mul_ps(q[0], _mm256_loadu_ps(xp));
                    for (j, &q) in q.iter().enumerate().skip(1) {
                        s = _mm256_fmadd_ps(q, _mm256_loadu_ps(xp.add(8 * j)), s);
                    }
                    *acc = _mm256_fmadd_ps(a, s, *acc);
                }
            }
            let mut sums = [0.0f32; N];
            for (o, &a) in sums.iter_mut().zip(&acc) {
                *o = Avx2::hsum(a);
            }
            sums
        }
    }

    /// A format of 32-value blocks: the codes, scale and offset of the
    /// block at `b`, as `unpack.rs` gives them.
    trait Block {
        const BYTES: usize;
        /// Whether blocks have an offset (`weight = scale * code - offset`).
        const OFFSET: bool = false;
        /// Weight rows a pass (4 or 8).
        const ROWS: usize = 4;
        /// Codes 0..16 and 16..32, int8.
        ///
        /// # Safety
        /// AVX2 present; `BYTES` readable bytes at `b`.
        unsafe fn codes(b: *const u8) -> (__m128i, __m128i);
        /// The four eight-code chunks as floats.
        ///
        /// # Safety
        /// As [`Block::codes`].
        #[inline(always)]
        unsafe fn chunks(b: *const u8) -> [__m256; 4] {
            // SAFETY: forwarded.
            unsafe {
                let (l, h) = Self::codes(b);
                let f = |v: __m128i| _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v));
                [
                    f(l),
                    f(_mm_unpackhi_epi64(l, l)),
                    f(h),
                    f(_mm_unpackhi_epi64(h, h)),
                ]
            }
        }
        /// The block's scale `d` in every lane: broadcast from `unpack.rs`'s
        /// table of every float16 (one load; the F16C conversion of the
        /// broadcast float16 was measurably slower, see `avx512.rs`).
        ///
        /// # Safety
        /// As [`Block::codes`].
        #[inline(always)]
        unsafe fn splat_scale(b: *const u8) -> __m256 {
            // SAFETY: forwarded; every format's `d` comes first.
            unsafe {
                let h = b.cast::<u16>().read_unaligned();
                _mm256_set1_ps(*crate::quant::unpack::F16_TABLE.get_unchecked(usize::from(h)))
            }
        }
        /// # Safety
        /// As [`Block::codes`].
        #[inline(always)]
        unsafe fn offset(_: *const u8) -> f32 {
            0.0
        }
    }

    /// The float16 at `p`, exactly (F16C).
    #[inline(always)]
    unsafe fn half(p: *const u8) -> f32 {
        // SAFETY: 2 readable bytes at p; F16C present (caller).
        unsafe { Avx2::half(p.cast::<u16>().read_unaligned()) }
    }

    /// The 16 bytes at `p` as nibbles: the low ones, the high ones.
    #[inline(always)]
    unsafe fn nibbles(p: *const u8) -> (__m128i, __m128i) {
        // SAFETY: 16 readable bytes at p (caller).
        unsafe {
            let v = _mm_loadu_si128(p.cast());
            let m = _mm_set1_epi8(15);
            (
                _mm_and_si128(v, m),
                _mm_and_si128(_mm_srli_epi16::<4>(v), m),
            )
        }
    }

    /// `0x10` in byte `j` (of 32) where bit `j` of the u32 at `p` is set.
    #[inline(always)]
    unsafe fn fifth(p: *const u8) -> (__m128i, __m128i) {
        // SAFETY: 4 readable bytes at p (caller).
        unsafe {
            let qh = p.cast::<u32>().read_unaligned();
            let spread = _mm256_setr_epi8(
                0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3,
                3, 3, 3, 3,
            );
            let b = _mm256_shuffle_epi8(_mm256_set1_epi32(qh as i32), spread);
            let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201_u64 as i64);
            let set = _mm256_cmpeq_epi8(_mm256_and_si256(b, bit), bit);
            let v = _mm256_and_si256(set, _mm256_set1_epi8(0x10));
            (_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v))
        }
    }

    /// `(l - bias, h - bias)` bytewise.
    #[inline(always)]
    unsafe fn less((l, h): (__m128i, __m128i), bias: i8) -> (__m128i, __m128i) {
        // SAFETY: AVX2 present (caller).
        unsafe {
            let b = _mm_set1_epi8(bias);
            (_mm_sub_epi8(l, b), _mm_sub_epi8(h, b))
        }
    }

    struct Q8_0;
    impl Block for Q8_0 {
        const BYTES: usize = 34;
        // Its conversion is the cheapest, so its chains of multiply-adds
        // bind: eight rows (about 1.4x four, hot).
        const ROWS: usize = 8;
        #[inline(always)]
        unsafe fn codes(b: *const u8) -> (__m128i, __m128i) {
            // SAFETY: forwarded; the codes follow `d`.
            unsafe {
                (
                    _mm_loadu_si128(b.add(2).cast()),
                    _mm_loadu_si128(b.add(18).cast()),
                )
            }
        }
        #[inline(always)]
        unsafe fn chunks(b: *const u8) -> [__m256; 4] {
            // SAFETY: forwarded; eight codes at 2 + 8j.
            unsafe {
                let f = |j: usize| {
                    let v = _mm_loadl_epi64(b.add(2 + 8 * j).cast());
                    _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v))
                };
                [f(0), f(1), f(2), f(3)]
            }
        }
    }

    /// The four eight-code chunks of the sixteen nibble bytes at `p` as
    /// 32-bit integers: each half of the bytes widened once to 32-bit lanes
    /// straight from memory (`vpmovzxbd`), then its low nibbles by a mask
    /// and its high ones by a shift. Chunk `j < 2` is the low nibbles of
    /// bytes `8j..8j + 8` (codes `8j..8j + 8`), chunk `j + 2` their high
    /// nibbles (codes `16 + 8j..`). Two widenings a block instead of two
    /// byte splits, two lane moves and four widenings from registers:
    /// 1.3x the one-row kernel's speed on Zen 3 (its shuffles bound it).
    #[inline(always)]
    unsafe fn nibble_ints(p: *const u8) -> [__m256i; 4] {
        // SAFETY: 16 readable bytes at p (caller); AVX2 present (caller).
        unsafe {
            let a = _mm256_cvtepu8_epi32(_mm_loadl_epi64(p.cast()));
            let c = _mm256_cvtepu8_epi32(_mm_loadl_epi64(p.add(8).cast()));
            let m = _mm256_set1_epi32(15);
            [
                _mm256_and_si256(a, m),
                _mm256_and_si256(c, m),
                _mm256_srli_epi32::<4>(a),
                _mm256_srli_epi32::<4>(c),
            ]
        }
    }

    /// [`nibble_ints`] less `bias`, as floats.
    #[inline(always)]
    unsafe fn nibble_chunks<const BIAS: i32>(p: *const u8) -> [__m256; 4] {
        // SAFETY: forwarded (caller).
        unsafe {
            nibble_ints(p).map(|v| {
                let v = if BIAS == 0 {
                    v
                } else {
                    _mm256_sub_epi32(v, _mm256_set1_epi32(BIAS))
                };
                _mm256_cvtepi32_ps(v)
            })
        }
    }

    struct Q4_0;
    impl Block for Q4_0 {
        const BYTES: usize = 18;
        #[inline(always)]
        unsafe fn codes(b: *const u8) -> (__m128i, __m128i) {
            // SAFETY: forwarded; nibbles after `d`.
            unsafe { less(nibbles(b.add(2)), 8) }
        }
        #[inline(always)]
        unsafe fn chunks(b: *const u8) -> [__m256; 4] {
            // SAFETY: forwarded; nibbles after `d`.
            unsafe { nibble_chunks::<8>(b.add(2)) }
        }
    }

    struct Q4_1;
    impl Block for Q4_1 {
        const BYTES: usize = 20;
        const OFFSET: bool = true;
        #[inline(always)]
        unsafe fn codes(b: *const u8) -> (__m128i, __m128i) {
            // SAFETY: forwarded; nibbles after `d`, `m`.
            unsafe { nibbles(b.add(4)) }
        }
        #[inline(always)]
        unsafe fn chunks(b: *const u8) -> [__m256; 4] {
            // SAFETY: forwarded; nibbles after `d`, `m`.
            unsafe { nibble_chunks::<0>(b.add(4)) }
        }
        #[inline(always)]
        unsafe fn offset(b: *const u8) -> f32 {
            // SAFETY: forwarded; gguf adds `m`, we subtract `-m`.
            -unsafe { half(b.add(2)) }
        }
    }

    /// Q5's codes: nibbles at `qs` with fifth bits from the u32 at `qh`.
    #[inline(always)]
    unsafe fn five(qh: *const u8, qs: *const u8) -> (__m128i, __m128i) {
        // SAFETY: forwarded (caller).
        unsafe {
            let (l, h) = nibbles(qs);
            let (fl, fh) = fifth(qh);
            (_mm_or_si128(l, fl), _mm_or_si128(h, fh))
        }
    }

    struct Q5_0;
    impl Block for Q5_0 {
        const BYTES: usize = 22;
        #[inline(always)]
        unsafe fn codes(b: *const u8) -> (__m128i, __m128i) {
            // SAFETY: forwarded; `d`, qh, nibbles.
            unsafe { less(five(b.add(2), b.add(6)), 16) }
        }
    }

    struct Q5_1;
    impl Block for Q5_1 {
        const BYTES: usize = 24;
        const OFFSET: bool = true;
        #[inline(always)]
        unsafe fn codes(b: *const u8) -> (__m128i, __m128i) {
            // SAFETY: forwarded; `d`, `m`, qh, nibbles.
            unsafe { five(b.add(4), b.add(8)) }
        }
        #[inline(always)]
        unsafe fn offset(b: *const u8) -> f32 {
            // SAFETY: forwarded.
            -unsafe { half(b.add(2)) }
        }
    }

    struct Iq4Nl;
    impl Block for Iq4Nl {
        const BYTES: usize = 18;
        #[inline(always)]
        unsafe fn codes(b: *const u8) -> (__m128i, __m128i) {
            // SAFETY: forwarded; nibbles after `d` index the code book.
            unsafe {
                let t = _mm_loadu_si128(crate::quant::unpack::IQ4_VALUES.as_ptr().cast());
                let (l, h) = nibbles(b.add(2));
                (_mm_shuffle_epi8(t, l), _mm_shuffle_epi8(t, h))
            }
        }
    }

    /// IQ4_NL's layout with MXFP4's book and its E8M0 byte `e` for `d`.
    struct Mxfp4;
    impl Block for Mxfp4 {
        const BYTES: usize = 17;
        #[inline(always)]
        unsafe fn codes(b: *const u8) -> (__m128i, __m128i) {
            // SAFETY: forwarded; nibbles after `e` index the code book.
            unsafe {
                let t = _mm_loadu_si128(crate::quant::unpack::MXFP4_VALUES.as_ptr().cast());
                let (l, h) = nibbles(b.add(1));
                (_mm_shuffle_epi8(t, l), _mm_shuffle_epi8(t, h))
            }
        }
        /// `2^(e - 128)` broadcast from the table (`unpack.rs`'s scale).
        #[inline(always)]
        unsafe fn splat_scale(b: *const u8) -> __m256 {
            // SAFETY: forwarded; `e` is the block's first byte.
            unsafe { _mm256_broadcast_ss(&crate::quant::unpack::E8M0_HALF[usize::from(*b)]) }
        }
    }
}
