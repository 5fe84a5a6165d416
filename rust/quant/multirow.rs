//! Matrix-matrix products (batched decode, prefill): each weight row is
//! unpacked **once per call** into float32 (block formats: its codes as
//! floats, exact, with its group scales; float formats: its values), then
//! multiplied into every activation row in register-blocked tiles, so the
//! unpacking is shared by the whole batch.
//!
//! **The same bits as the matrix-vector path.** Every output element `(t, r)`
//! is accumulated by exactly the operations of `kernel`'s (group-sum) order:
//! per group a fresh dot of the codes with the activations
//! (`kernel::dot_step`), `acc = fma(scale_g, s, acc)` in one eight-lane
//! accumulator, then `hsum(acc) - off` with `off = sum_g offset_g * X_g` in
//! group order; float formats `acc = fma(w_c, x_c, acc)`, `hsum`, then the
//! tail columns one by one. So a row gives the same bits alone
//! (matrix-vector) or in any batch, and the tests check it. The AVX-512
//! build's own formats (`avx512::covers`) unpack a row into its weights,
//! `scale * code`, and run `avx512::weights_tile` in that build's order;
//! batches of up to [`FUSED_MAX_N`] rows of its 32-value formats skip the
//! unpacking and decode each block inside the tile
//! (`avx512::blocks_tile`, the same weights and order): the band's decode
//! into floats cost a fixed 55-100 us per 1536 x 576 product whatever the
//! batch, more than the tiles' own FMAs at 2-4 rows. The AVX2 build does
//! the same for the same formats (`kernel::row1::blocks_tile`, its order).
//!
//! Block formats: tiles of [`CR`] weight rows x [`CN`] activation rows
//! (`codes_dot`): a group's dots for the whole tile live in registers (one
//! per output element, plus its accumulator), each chunk of codes is loaded
//! once for the tile's activation rows and each activation chunk once for
//! its weight rows. Float formats: tiles of [`R_TILE`] x [`N_TILE`], one
//! FMA per eight weights per activation row.
//!
//! The offset terms `sum_g offset_g * X_g` (formats with offsets) are
//! summed outside the tiles, per band, vectorised over the activation rows
//! (the same per-element operations), and subtracted as each tile is written.
//!
//! Loop nest, per chunk of weight rows a thread owns: bands of [`R_TILE`]
//! rows are unpacked into a per-thread buffer (in L1), then tiles over the
//! whole row.

use std::cell::RefCell;

use super::format::QuantType;
use super::kernel::{dot_step, Job};
use super::simd::Lanes;
use super::unpack::{float_at, q8_0_scales, unpack_row};

/// Register tile of the float formats: weight rows x activation rows. Each
/// output element holds one accumulator, so 4 x 3 of them, plus three
/// activation chunks and a weight chunk, fill AVX2's sixteen registers.
const R_TILE: usize = 4;
const N_TILE: usize = 3;

/// Fewest activation rows for which this path beats `kernel`'s tiles.
pub(crate) const MIN_ROWS: usize = 2;

/// Per-thread buffers (grown once, then reused).
#[derive(Default)]
pub(crate) struct Wide {
    codes: Vec<i8>,
    w: Vec<f32>,
    scale: Vec<f32>,
    offset: Vec<f32>,
    /// The activations' group sums, group-major (`groups` x `n`).
    xt: Vec<f32>,
    /// A band's offset terms, `sum_g offset_g * X_g` (`R_TILE` x `n`).
    offs: Vec<f32>,
}

thread_local! {
    static WIDE: RefCell<Wide> = RefCell::new(Wide::default());
}

/// `f` with this thread's buffers (a fresh set if they are in use).
pub(crate) fn with_scratch<R>(f: impl FnOnce(&mut Wide) -> R) -> R {
    WIDE.with(|cell| match cell.try_borrow_mut() {
        Ok(mut w) => f(&mut w),
        Err(_) => f(&mut Wide::default()),
    })
}

/// Storing eight lanes (the one operation `Lanes` lacks here).
pub(crate) trait Store: Lanes {
    /// Write the eight lanes of `v` at `p` (any alignment).
    unsafe fn store(p: *mut f32, v: Self::V);
}

impl Store for super::simd::Portable {
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: [f32; 8]) {
        // SAFETY: 8 writable floats at `p` (caller).
        unsafe { p.cast::<[f32; 8]>().write_unaligned(v) }
    }
}

#[cfg(target_arch = "x86_64")]
impl Store for super::simd::Avx2 {
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: std::arch::x86_64::__m256) {
        // SAFETY: 8 writable floats at `p`; AVX present (caller).
        unsafe { std::arch::x86_64::_mm256_storeu_ps(p, v) }
    }
}

#[cfg(target_arch = "aarch64")]
impl Store for super::simd::Neon {
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: Self::V) {
        use std::arch::aarch64::vst1q_f32;
        // SAFETY: 8 writable floats at `p` (caller).
        unsafe {
            vst1q_f32(p, v.0);
            vst1q_f32(p.add(4), v.1);
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn rows_avx2(job: &Job<'_>, lo: usize, hi: usize, out: *mut f32, s: &mut Wide) {
    // SAFETY: forwarded; AVX2, FMA and F16C were checked by the caller.
    unsafe { run_rows::<super::simd::Avx2, false, true>(job, lo, hi, out, s) }
}

/// The AVX-512 build: its own sixteen-lane tiles for the formats
/// `avx512::covers` takes (its order), the AVX2 code for everything else.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
pub(crate) unsafe fn rows_avx512(job: &Job<'_>, lo: usize, hi: usize, out: *mut f32, s: &mut Wide) {
    // SAFETY: forwarded; AVX-512 F/BW/VL, AVX2, FMA and F16C checked by the caller.
    unsafe { run_rows::<super::simd::Avx2, true, true>(job, lo, hi, out, s) }
}

#[cfg(target_arch = "aarch64")]
pub(crate) unsafe fn rows_neon(job: &Job<'_>, lo: usize, hi: usize, out: *mut f32, s: &mut Wide) {
    // SAFETY: forwarded; NEON is part of aarch64.
    unsafe { run_rows::<super::simd::Neon, false, false>(job, lo, hi, out, s) }
}

pub(crate) unsafe fn rows_portable(
    job: &Job<'_>,
    lo: usize,
    hi: usize,
    out: *mut f32,
    s: &mut Wide,
) {
    // SAFETY: forwarded.
    unsafe { run_rows::<super::simd::Portable, false, false>(job, lo, hi, out, s) }
}

/// Weight row `row` of `job` into `w` (`cols` floats): float formats their
/// values, block formats their codes as floats (exact), the group scales
/// into `scale` and the offsets `offset_g` into `offset` (applied outside
/// the tiles).
///
/// # Safety
/// With `avx512`, AVX-512 F/BW/VL must be present.
#[inline(always)]
unsafe fn unpack_float<S: Store>(
    avx512: bool,
    job: &Job<'_>,
    row: usize,
    codes: &mut [i8],
    w: &mut [f32],
    scale: &mut [f32],
    offset: &mut [f32],
) {
    #[cfg(not(target_arch = "x86_64"))]
    let _ = avx512;
    let k = job.cols;
    let raw = &job.raw[row * job.row_bytes..(row + 1) * job.row_bytes];
    let whole = k / 8 * 8;
    match job.qtype {
        QuantType::F32 | QuantType::F16 | QuantType::BF16 => {
            let size = job.qtype.block_bytes();
            let mut c = 0;
            while c < whole {
                // SAFETY: 8 values at column c of the row, 8 floats at w[c].
                unsafe {
                    let p = raw.as_ptr().add(c * size);
                    let v = match job.qtype {
                        QuantType::F32 => S::load(p.cast()),
                        QuantType::F16 => S::load_f16(p),
                        _ => S::load_bf16(p),
                    };
                    S::store(w.as_mut_ptr().add(c), v);
                }
                c += 8;
            }
            for c in whole..k {
                w[c] = float_at(job.qtype, &raw[c * size..(c + 1) * size]);
            }
        }
        #[cfg(target_arch = "x86_64")]
        qtype if avx512 && super::avx512::covers(qtype) => {
            // The AVX-512 build's weights, `scale * code`, decoded straight
            // into floats (its order, avx512.rs); the offsets for the terms
            // (the tiles never read `scale`).
            if qtype.has_offsets() {
                super::unpack::scales_only::<S>(qtype, raw, scale, offset);
            }
            // SAFETY: AVX-512 present (caller); `raw` is one whole row, `w`
            // holds `cols` floats.
            unsafe { super::avx512::weights_as_floats(qtype, raw, w.as_mut_ptr()) };
        }
        QuantType::Q8_0 => {
            q8_0_scales::<S>(raw, scale);
            let (blocks, _) = raw.as_chunks::<34>();
            for (b, w) in blocks.iter().zip(w.chunks_exact_mut(32)) {
                for j in (0..32).step_by(8) {
                    // SAFETY: 8 codes at 2 + j of the block, 8 floats at w[j].
                    unsafe {
                        S::store(
                            w.as_mut_ptr().add(j),
                            S::codes(b.as_ptr().add(2 + j).cast()),
                        )
                    };
                }
            }
        }
        qtype => {
            unpack_row::<S>(qtype, raw, codes, scale, offset);
            for c in (0..k).step_by(8) {
                // SAFETY: rows are whole 8-code chunks; 8 floats at w[c].
                unsafe { S::store(w.as_mut_ptr().add(c), S::codes(codes.as_ptr().add(c))) };
            }
        }
    }
}

/// Rows `lo..hi` of `job` into `out` (`n` x `rows`, row-major); `AVX512`:
/// the AVX-512 build (its own tiles for the formats it covers).
///
/// # Safety
/// `out` must be valid for writes of `job.n * job.rows` floats, and no
/// other thread may write the columns `lo..hi` meanwhile. `S` must be
/// usable on this CPU, and AVX-512 F/BW/VL too when `AVX512`.
#[inline(always)]
pub(crate) unsafe fn run_rows<S: Store, const AVX512: bool, const AVX2: bool>(
    job: &Job<'_>,
    lo: usize,
    hi: usize,
    out: *mut f32,
    scratch: &mut Wide,
) {
    let (k, qtype) = (job.cols, job.qtype);
    let offsets = qtype.has_offsets();
    let groups = if qtype.is_float() {
        0
    } else {
        k / qtype.group_values()
    };
    scratch.codes.resize(k, 0);
    scratch.w.resize(R_TILE * k, 0.0);
    scratch.scale.resize(R_TILE * groups, 0.0);
    scratch.offset.resize(R_TILE * groups, 0.0);
    let n = job.n;
    // Short batches of the AVX-512 build's 32-value formats decode their
    // weights inside the tiles (`avx512::blocks_tile`), not into floats.
    let fused = AVX512 && n <= FUSED_MAX_N && avx512_fuses(qtype);
    // The AVX2 build likewise (`kernel::row1::blocks_tile`, its order).
    let fused2 = AVX2 && !AVX512 && n <= FUSED_MAX_N && row1_fuses(qtype);
    // The offset terms' tables, eight activation rows a register: `ns`
    // lanes a group (zeros past `n`), so every row takes the vector path.
    let ns = n.div_ceil(8) * 8;
    if offsets {
        scratch.xt.clear();
        scratch.xt.resize(groups * ns, 0.0);
        scratch.offs.resize(R_TILE * ns, 0.0);
        for t in 0..n {
            for g in 0..groups {
                scratch.xt[g * ns + t] = job.xsum[t * groups + g];
            }
        }
    }
    let Wide {
        codes,
        w,
        scale,
        offset,
        xt,
        offs,
    } = scratch;
    let mut r = lo;
    while r < hi {
        let rt = (hi - r).min(R_TILE);
        for i in 0..rt {
            if fused || fused2 {
                // Decoded in the tiles; the offsets for their terms.
                if offsets {
                    let raw = &job.raw[(r + i) * job.row_bytes..(r + i + 1) * job.row_bytes];
                    super::unpack::scales_only::<S>(
                        qtype,
                        raw,
                        &mut scale[i * groups..(i + 1) * groups],
                        &mut offset[i * groups..(i + 1) * groups],
                    );
                }
                continue;
            }
            // SAFETY: AVX-512 present when AVX512 (caller).
            unsafe {
                unpack_float::<S>(
                    AVX512,
                    job,
                    r + i,
                    codes,
                    &mut w[i * k..(i + 1) * k],
                    &mut scale[i * groups..(i + 1) * groups],
                    &mut offset[i * groups..(i + 1) * groups],
                );
            }
        }
        if offsets {
            // The offset terms out of the tiles' loop, vectorised over the
            // activation rows: per element `off += offset_g * X_g` in group
            // order, the same operations as `kernel`'s.
            // Eight activation rows a register over the whole group loop
            // (lane t: `o = o + b * X_g[t]`, rounded as the scalar form).
            // A scalar loop for the rows past a multiple of eight was one
            // dependent chain of adds per row (a batch of 2 of Q4_K: a
            // third of its time); the zero lanes cost nothing.
            for i in 0..rt {
                let (b, o) = (
                    &offset[i * groups..(i + 1) * groups],
                    &mut offs[i * ns..(i + 1) * ns],
                );
                let mut t = 0;
                while t < ns {
                    // SAFETY: xt holds groups x ns floats, o holds ns; S is usable.
                    unsafe {
                        let mut acc = S::zero();
                        for (g, &b) in b.iter().enumerate() {
                            let xs = S::load(xt.as_ptr().add(g * ns + t));
                            acc = S::add(acc, S::mul(S::splat(b), xs));
                        }
                        S::store(o.as_mut_ptr().add(t), acc);
                    }
                    t += 8;
                }
            }
        }
        if fused2 {
            // (Never on other architectures: `row1_fuses` is false there.)
            #[cfg(target_arch = "x86_64")]
            for i in 0..rt {
                let mut t = 0;
                while t < n {
                    let nt = (n - t).min(ROW1_FN);
                    // SAFETY: row r + i of `raw`; x holds rows t..t + nt; out
                    // is n x rows (caller); AVX2, FMA and F16C (AVX2).
                    unsafe {
                        super::kernel::row1::blocks_tile(
                            qtype,
                            nt,
                            job.raw.as_ptr().add((r + i) * job.row_bytes),
                            (job.x.as_ptr().add(t * k), k),
                            offsets.then(|| offs.as_ptr().add(i * ns + t)),
                            out.add(t * job.rows + r + i),
                            job.rows,
                        );
                    }
                    t += nt;
                }
            }
        } else if groups == 0 {
            let mut t = 0;
            while t < n {
                let nt = (n - t).min(N_TILE);
                // SAFETY: rows 0..rt of the band are unpacked; x holds rows
                // t..t + nt; out is n x rows (caller).
                unsafe {
                    let x = job.x.as_ptr().add(t * k);
                    let o = out.add(t * job.rows + r);
                    tile::<S>(w.as_ptr(), rt, nt, (x, k), o, job.rows);
                }
                t += nt;
            }
        } else {
            let chunks = qtype.group_values() / 8;
            let wide = AVX512 && avx512_covers(qtype);
            let (cr, cn) = if fused {
                FUSED_TILE
            } else if wide {
                AVX512_TILE
            } else {
                (CR, CN)
            };
            let mut i = 0;
            while i < rt {
                let ri = if rt - i >= cr { cr } else { 1 };
                let mut t = 0;
                while t < n {
                    let nt = (n - t).min(cn);
                    // SAFETY: rows i..i + ri of the band are unpacked (codes,
                    // scales); x holds rows t..t + nt; out is n x rows (caller).
                    unsafe {
                        let x = job.x.as_ptr().add(t * k);
                        let o = out.add(t * job.rows + r + i);
                        let sub = offsets.then(|| (offs.as_ptr().add(i * ns + t), ns));
                        let row = (w.as_ptr().add(i * k), scale.as_ptr().add(i * groups));
                        if fused {
                            #[cfg(target_arch = "x86_64")]
                            super::avx512::blocks_tile(
                                qtype,
                                (ri, nt),
                                (job.raw.as_ptr().add((r + i) * job.row_bytes), job.row_bytes),
                                (x, k),
                                sub,
                                o,
                                job.rows,
                            );
                        } else if wide {
                            #[cfg(target_arch = "x86_64")]
                            super::avx512::weights_tile((ri, nt), row.0, (x, k), sub, o, job.rows);
                        } else {
                            codes_tile::<S>(
                                (chunks, ri, nt),
                                row,
                                groups,
                                (x, k),
                                sub,
                                o,
                                job.rows,
                            );
                        }
                    }
                    t += nt;
                }
                i += ri;
            }
        }
        r += rt;
    }
}

/// One `rt` x `nt` tile of a float format (weight rows `k` apart at `w`,
/// activation rows), written to `out`.
#[inline(always)]
unsafe fn tile<S: Lanes>(
    w: *const f32,
    rt: usize,
    nt: usize,
    (x, k): (*const f32, usize),
    out: *mut f32,
    out_stride: usize,
) {
    macro_rules! go {
        ($r:literal, $n:literal) => {{
            // SAFETY: forwarded from the caller.
            let res: [[f32; $n]; $r] = unsafe { dot_tile::<S, $r, $n>(w, x, k) };
            for (i, row) in res.iter().enumerate() {
                for (t, &v) in row.iter().enumerate() {
                    // SAFETY: (t, i) inside the output (caller).
                    unsafe { *out.add(t * out_stride + i) = v };
                }
            }
        }};
    }
    match (rt, nt) {
        (4, 3) => go!(4, 3),
        (4, 2) => go!(4, 2),
        (4, _) => go!(4, 1),
        (3, 3) => go!(3, 3),
        (3, 2) => go!(3, 2),
        (3, _) => go!(3, 1),
        (2, 3) => go!(2, 3),
        (2, 2) => go!(2, 2),
        (2, _) => go!(2, 1),
        (_, 3) => go!(1, 3),
        (_, 2) => go!(1, 2),
        _ => go!(1, 1),
    }
}

/// A tile's results `res` (weight row `i`, activation row `t`) less the
/// offset terms `sub` (at `i * stride + t`), written to `out` (activation
/// row `t`, weight row `i` at `t * out_stride + i`).
///
/// # Safety
/// Every `(t, i)` inside the output and the offset terms.
#[inline(always)]
pub(crate) unsafe fn store_tile<const R: usize, const N: usize>(
    res: &[[f32; N]; R],
    sub: Option<(*const f32, usize)>,
    out: *mut f32,
    out_stride: usize,
) {
    for (i, row) in res.iter().enumerate() {
        for (t, &v) in row.iter().enumerate() {
            // SAFETY: (t, i) inside the output and the offset terms (caller).
            unsafe {
                let v = match sub {
                    Some((offs, stride)) => v - *offs.add(i * stride + t),
                    None => v,
                };
                *out.add(t * out_stride + i) = v;
            }
        }
    }
}

/// `rt` weight rows of codes as floats (`w`, `k` apart, with their
/// `groups` group scales a row at `scale`) times `nt` activation rows (`k`
/// apart at `x`), less the offset terms `sub` (row `i`, activation `t` at
/// `i * stride + t`), written to `out` (`out_stride` apart).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn codes_tile<S: Lanes>(
    (chunks, rt, nt): (usize, usize, usize),
    (w, scale): (*const f32, *const f32),
    groups: usize,
    (x, k): (*const f32, usize),
    sub: Option<(*const f32, usize)>,
    out: *mut f32,
    out_stride: usize,
) {
    macro_rules! go {
        ($r:literal, $c:literal, $n:literal) => {{
            // SAFETY: forwarded from the caller.
            let res = unsafe { codes_dot::<S, $r, $c, $n>(w, scale, groups, x, k) };
            // SAFETY: forwarded from the caller.
            unsafe { store_tile(&res, sub, out, out_stride) };
        }};
    }
    macro_rules! shapes {
        ($c:literal) => {
            match (rt, nt) {
                (CR, CN) => go!(2, $c, 3),
                (CR, 2) => go!(2, $c, 2),
                (CR, _) => go!(2, $c, 1),
                (_, CN) => go!(1, $c, 3),
                (_, 2) => go!(1, $c, 2),
                _ => go!(1, $c, 1),
            }
        };
    }
    if chunks == 4 {
        shapes!(4)
    } else {
        shapes!(2)
    }
}

/// The codes tile: weight rows x activation rows (see `codes_dot`): 2 x 3
/// dots and accumulators, three activation chunks and a code chunk fill
/// AVX2's sixteen registers. Measured against 3 x 2 and 2 x 2 (`perf_probe`,
/// 8 and 16 rows, 2026-12-02, load 6-7): 2 x 3 was the fastest of the three.
const CR: usize = 2;
const CN: usize = 3;

/// The AVX-512 build's codes tile, for the formats it covers.
#[cfg(target_arch = "x86_64")]
const AVX512_TILE: (usize, usize) = (super::avx512::CR, super::avx512::CN);
#[cfg(not(target_arch = "x86_64"))]
const AVX512_TILE: (usize, usize) = (CR, CN);

/// The AVX-512 build's fused tile (`avx512::blocks_tile`) and the largest
/// batch that takes it: it decodes every block once per four
/// activation rows, so it gains less as the batch grows (`perf_probe` on
/// an Intel Xeon of the Sapphire Rapids class, best of three alternated
/// runs, against the band path:
/// 1.2-1.4x at 2 and 4 rows, 1.0-1.1x at 8, 0.9-1.04x at 16).
#[cfg(target_arch = "x86_64")]
const FUSED_TILE: (usize, usize) = (super::avx512::FR, super::avx512::FN);
#[cfg(not(target_arch = "x86_64"))]
const FUSED_TILE: (usize, usize) = (CR, CN);
const FUSED_MAX_N: usize = 8;

#[cfg(target_arch = "x86_64")]
const ROW1_FN: usize = super::kernel::row1::FN;

/// Whether the AVX2 build decodes `qtype` inside its batched tiles.
fn row1_fuses(qtype: QuantType) -> bool {
    #[cfg(target_arch = "x86_64")]
    return super::kernel::row1::fuses(qtype);
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = qtype;
        false
    }
}

/// Whether the AVX-512 build decodes `qtype` inside its batched tiles.
fn avx512_fuses(qtype: QuantType) -> bool {
    avx512_covers(qtype) && qtype.block_values() == 32
}

/// Whether the AVX-512 build takes `qtype` with its own tiles.
fn avx512_covers(qtype: QuantType) -> bool {
    #[cfg(target_arch = "x86_64")]
    return super::avx512::covers(qtype);
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = qtype;
        false
    }
}

/// `R` rows of codes as floats (`k` apart at `w`; groups of `C` chunks,
/// `groups` scales a row at `scale`) times `N` activation rows, in
/// `kernel`'s order: per group a fresh dot (`kernel::dot_step`), `acc =
/// fma(scale_g, dot, acc)`, then `hsum`. Each chunk of codes and of
/// activations is loaded once for the whole tile.
#[inline(always)]
unsafe fn codes_dot<S: Lanes, const R: usize, const C: usize, const N: usize>(
    w: *const f32,
    scale: *const f32,
    groups: usize,
    x: *const f32,
    k: usize,
) -> [[f32; N]; R] {
    // SAFETY (whole body): R rows of `groups * C * 8` floats at w (`k`
    // apart), `groups` scales a row at scale, N rows of k at x (caller); S
    // is usable (caller).
    unsafe {
        let mut acc = [[S::zero(); N]; R];
        for g in 0..groups {
            let c = g * C * 8;
            let mut s = [[S::zero(); N]; R];
            for j in 0..C {
                let mut xv = [S::zero(); N];
                for (t, xv) in xv.iter_mut().enumerate() {
                    *xv = S::load(x.add(t * k + c + 8 * j));
                }
                for (i, s) in s.iter_mut().enumerate() {
                    let q = S::load(w.add(i * k + c + 8 * j));
                    for (s, &xv) in s.iter_mut().zip(&xv) {
                        *s = dot_step::<S>(j == 0, q, xv, *s);
                    }
                }
            }
            for (i, (acc, s)) in acc.iter_mut().zip(&s).enumerate() {
                let a = S::splat(*scale.add(i * groups + g));
                for (acc, &s) in acc.iter_mut().zip(s) {
                    *acc = S::fma(a, s, *acc);
                }
            }
        }
        // Loops, not `acc.map(..)`: `map` is a generic function of its own,
        // compiled without this kernel's target features, so the SIMD sums
        // inside its closure became out-of-line calls that spilled the tile.
        let mut sums = [[0.0f32; N]; R];
        for (o, a) in sums.iter_mut().zip(&acc) {
            for (o, &v) in o.iter_mut().zip(a) {
                *o = S::hsum(v);
            }
        }
        sums
    }
}

/// `R` float-format rows (`k` apart) times `N` activation rows, in `kernel`'s
/// order (`acc = fma(w, x, acc)`, `hsum`, the tail columns one by one).
#[inline(always)]
unsafe fn dot_tile<S: Lanes, const R: usize, const N: usize>(
    w: *const f32,
    x: *const f32,
    k: usize,
) -> [[f32; N]; R] {
    let whole = k / 8 * 8;
    // SAFETY (whole body): R rows of k floats at w, N rows of k at x (caller).
    unsafe {
        let mut acc = [[S::zero(); N]; R];
        let mut c = 0;
        while c < whole {
            let mut xv = [S::zero(); N];
            for (t, xv) in xv.iter_mut().enumerate() {
                *xv = S::load(x.add(t * k + c));
            }
            for (i, acc) in acc.iter_mut().enumerate() {
                let wv = S::load(w.add(i * k + c));
                for (acc, &xv) in acc.iter_mut().zip(&xv) {
                    *acc = S::fma(wv, xv, *acc);
                }
            }
            c += 8;
        }
        let mut res = [[0.0f32; N]; R];
        for i in 0..R {
            for t in 0..N {
                res[i][t] = S::hsum(acc[i][t]);
            }
        }
        for c in whole..k {
            for (i, res) in res.iter_mut().enumerate() {
                let wv = *w.add(i * k + c);
                for (t, res) in res.iter_mut().enumerate() {
                    *res += wv * *x.add(t * k + c);
                }
            }
        }
        res
    }
}
