//! Matrix-matrix products (batched decode, prefill): each weight row is
//! unpacked and converted to float32 **once per call**, then multiplied into
//! every activation row in register-blocked tiles of 3 weight rows x 2
//! activation rows, so the cost of dequantising is shared by the whole batch
//! and each activation chunk is loaded once for three weight rows.
//!
//! **The same bits as the matrix-vector path.** Every output element `(t, r)`
//! is accumulated by exactly the operations of `kernel`'s order: per group an
//! eight-lane sum over its chunks in column order (`s = fma(code_c, x_c, s)`;
//! a code converted to float32 is exact, so converting it once beforehand
//! changes nothing), then `acc = fma(scale_g, s, acc)` and `off += offset_g *
//! X_g` in group order, finally `hsum(acc) - off`; float formats
//! `acc = fma(w_c, x_c, acc)`, `hsum`, then the tail columns one by one. So a
//! row gives the same bits alone (matrix-vector) or in any batch, and the
//! tests check it.
//!
//! The offset terms `sum_g offset_g * X_g` (formats with offsets) are
//! summed outside the tiles, per band, vectorised over the activation rows
//! (the same per-element operations), and subtracted as each tile is written.
//!
//! Loop nest, per chunk of weight rows a thread owns: bands of [`BAND`] rows
//! are unpacked to float32 into a per-thread buffer (in L1/L2), then for each
//! pair of activation rows, for each three rows of the band, one tile.

use std::cell::RefCell;

use super::format::QuantType;
use super::kernel::Job;
use super::simd::Lanes;
use super::unpack::{float_at, q8_0_scales, unpack_row};

/// Weight rows unpacked to float32 at a time (a multiple of [`R_TILE`]).
const BAND: usize = 12;

/// Register tile: weight rows x activation rows. Each output element holds
/// a group sum and an accumulator (two registers), so 3 x 2 of them, plus
/// two activation chunks and a weight chunk, fill AVX2's sixteen registers.
const R_TILE: usize = 3;
const N_TILE: usize = 2;

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
    /// A band's offset terms, `sum_g offset_g * X_g` (`BAND` x `n`).
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
    unsafe { run_rows::<super::simd::Avx2>(job, lo, hi, out, s) }
}

#[cfg(target_arch = "aarch64")]
pub(crate) unsafe fn rows_neon(job: &Job<'_>, lo: usize, hi: usize, out: *mut f32, s: &mut Wide) {
    // SAFETY: forwarded; NEON is part of aarch64.
    unsafe { run_rows::<super::simd::Neon>(job, lo, hi, out, s) }
}

pub(crate) unsafe fn rows_portable(
    job: &Job<'_>,
    lo: usize,
    hi: usize,
    out: *mut f32,
    s: &mut Wide,
) {
    // SAFETY: forwarded.
    unsafe { run_rows::<super::simd::Portable>(job, lo, hi, out, s) }
}

/// Weight row `row` of `job` as float32 codes (or values, float formats)
/// into `w` (`cols` floats), its group scales and offsets into `scale` and
/// `offset`.
#[inline(always)]
fn unpack_float<S: Store>(
    job: &Job<'_>,
    row: usize,
    codes: &mut [i8],
    w: &mut [f32],
    scale: &mut [f32],
    offset: &mut [f32],
) {
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
        QuantType::Q8_0 => {
            q8_0_scales::<S>(raw, scale);
            let (blocks, _) = raw.as_chunks::<34>();
            for (b, w) in blocks.iter().zip(w.chunks_exact_mut(32)) {
                for j in (0..32).step_by(8) {
                    // SAFETY: 8 codes at 2 + j of the block, 8 floats at w[j].
                    unsafe {
                        let q = S::codes(b.as_ptr().add(2 + j).cast());
                        S::store(w.as_mut_ptr().add(j), q);
                    }
                }
            }
        }
        qtype => {
            unpack_row::<S>(qtype, raw, codes, scale, offset);
            let mut c = 0;
            while c < k {
                // SAFETY: k is a whole number of 8-code chunks (blocks of 32 or 256).
                unsafe {
                    let q = S::codes(codes.as_ptr().add(c));
                    S::store(w.as_mut_ptr().add(c), q);
                }
                c += 8;
            }
        }
    }
}

/// Rows `lo..hi` of `job` into `out` (`n` x `rows`, row-major).
///
/// # Safety
/// `out` must be valid for writes of `job.n * job.rows` floats, and no
/// other thread may write the columns `lo..hi` meanwhile. `S` must be
/// usable on this CPU.
#[inline(always)]
pub(crate) unsafe fn run_rows<S: Store>(
    job: &Job<'_>,
    lo: usize,
    hi: usize,
    out: *mut f32,
    scratch: &mut Wide,
) {
    let (k, qtype) = (job.cols, job.qtype);
    let float = qtype.is_float();
    let offsets = qtype.has_offsets();
    let group = if float { 8 } else { qtype.group_values() };
    let groups = if float { 0 } else { k / group };
    scratch.codes.resize(k, 0);
    scratch.w.resize(BAND * k, 0.0);
    scratch.scale.resize(BAND * groups, 0.0);
    scratch.offset.resize(BAND * groups, 0.0);
    let n = job.n;
    if offsets {
        scratch.xt.resize(groups * n, 0.0);
        scratch.offs.resize(BAND * n, 0.0);
        for t in 0..n {
            for g in 0..groups {
                scratch.xt[g * n + t] = job.xsum[t * groups + g];
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
        let rb = (hi - r).min(BAND);
        for i in 0..rb {
            unpack_float::<S>(
                job,
                r + i,
                codes,
                &mut w[i * k..(i + 1) * k],
                &mut scale[i * groups..(i + 1) * groups],
                &mut offset[i * groups..(i + 1) * groups],
            );
        }
        if offsets {
            // The offset terms out of the tiles' loop, vectorised over the
            // activation rows: per element `off += offset_g * X_g` in group
            // order, the same operations as `kernel`'s.
            for i in 0..rb {
                let o = &mut offs[i * n..(i + 1) * n];
                o.fill(0.0);
                for g in 0..groups {
                    let b = offset[i * groups + g];
                    for (o, &xs) in o.iter_mut().zip(&xt[g * n..(g + 1) * n]) {
                        *o += b * xs;
                    }
                }
            }
        }
        let mut t = 0;
        while t < job.n {
            let nt = (job.n - t).min(N_TILE);
            let mut i = 0;
            while i < rb {
                let rt = (rb - i).min(R_TILE);
                // SAFETY: rows i..i + rt of the band are unpacked; x holds
                // rows t..t + nt; out is n x rows (caller).
                unsafe {
                    let src = Band {
                        w: w.as_ptr().add(i * k),
                        scale: scale.as_ptr().add(i * groups),
                        groups,
                        group,
                    };
                    let x = job.x.as_ptr().add(t * k);
                    let o = out.add(t * job.rows + r + i);
                    let sub = offsets.then(|| (offs.as_ptr().add(i * n + t), n));
                    tile::<S>(float, sub, src, rt, nt, (x, k), o, job.rows);
                }
                i += rt;
            }
            t += nt;
        }
        r += rb;
    }
}

/// Unpacked weight rows: float32 rows `k` apart, `groups` scales (offsets) a row.
#[derive(Clone, Copy)]
struct Band {
    w: *const f32,
    scale: *const f32,
    groups: usize,
    group: usize,
}

/// One `rt` x `nt` tile (weight rows x activation rows), written to `out`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn tile<S: Lanes>(
    float: bool,
    sub: Option<(*const f32, usize)>,
    src: Band,
    rt: usize,
    nt: usize,
    (x, k): (*const f32, usize),
    out: *mut f32,
    out_stride: usize,
) {
    macro_rules! go {
        ($r:literal, $n:literal) => {{
            // SAFETY: forwarded from the caller.
            let res: [[f32; $n]; $r] = unsafe {
                match (float, src.group) {
                    (true, _) => float_tile::<S, $r, $n>(src.w, x, k),
                    (_, 16) => codes_tile::<S, $r, $n, 16>(src, (x, k)),
                    _ => codes_tile::<S, $r, $n, 32>(src, (x, k)),
                }
            };
            for (i, row) in res.iter().enumerate() {
                for (t, &v) in row.iter().enumerate() {
                    // SAFETY: (t, i) inside the output and the offset terms (caller).
                    unsafe {
                        let v = match sub {
                            Some((offs, stride)) => v - *offs.add(i * stride + t),
                            None => v,
                        };
                        *out.add(t * out_stride + i) = v
                    };
                }
            }
        }};
    }
    match (rt, nt) {
        (3, 2) => go!(3, 2),
        (3, _) => go!(3, 1),
        (2, 2) => go!(2, 2),
        (2, _) => go!(2, 1),
        (_, 2) => go!(1, 2),
        _ => go!(1, 1),
    }
}

/// `R` unpacked rows times `N` activation rows (`k` apart), in `kernel`'s
/// order, before the offset terms (the caller subtracts them).
#[inline(always)]
unsafe fn codes_tile<S: Lanes, const R: usize, const N: usize, const G: usize>(
    src: Band,
    (x, k): (*const f32, usize),
) -> [[f32; N]; R] {
    let groups = src.groups;
    // SAFETY (whole body): R rows of k floats at src.w and their scales, N
    // rows of k at x are in bounds (caller).
    unsafe {
        let mut acc = [[S::zero(); N]; R];
        for g in 0..groups {
            let mut s = [[S::zero(); N]; R];
            for j in 0..G / 8 {
                let c = g * G + 8 * j;
                let mut xv = [S::zero(); N];
                for (t, xv) in xv.iter_mut().enumerate() {
                    *xv = S::load(x.add(t * k + c));
                }
                for (i, s) in s.iter_mut().enumerate() {
                    let wv = S::load(src.w.add(i * k + c));
                    for (s, &xv) in s.iter_mut().zip(&xv) {
                        *s = S::fma(wv, xv, *s);
                    }
                }
            }
            for i in 0..R {
                let a = S::splat(*src.scale.add(i * groups + g));
                for (acc, &s) in acc[i].iter_mut().zip(&s[i]) {
                    *acc = S::fma(a, s, *acc);
                }
            }
        }
        let mut res = [[0.0f32; N]; R];
        for i in 0..R {
            for t in 0..N {
                // `kernel` subtracts a zero offset sum here: `v - 0.0` is `v`.
                res[i][t] = S::hsum(acc[i][t]);
            }
        }
        res
    }
}

/// `R` float rows (`k` apart) times `N` activation rows, in `kernel`'s order.
#[inline(always)]
unsafe fn float_tile<S: Lanes, const R: usize, const N: usize>(
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
