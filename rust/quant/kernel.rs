//! The fused dequantise-and-dot kernels, written once over [`Lanes`].
//!
//! A band of weight rows is unpacked (a few rows at a time, into a small
//! per-thread buffer of int8 codes and per-group scales that stays in L1),
//! then multiplied by tiles of activation rows: each eight-code chunk is
//! converted to floats and scaled once (`w = scale_g * code`) and fused into
//! the accumulators of every activation row of the tile. A weight is
//! `scale_g * code - offset_g`, so a row's dot product is
//! `sum_c w_c * x_c - sum_g offset_g * X_g` with `X_g` the activations' sum
//! over group `g` (computed once per call).
//!
//! **Fixed order** (the scale-folded order; `multirow` keeps it too).
//! Every output element `(t, r)` is accumulated the same way whatever the
//! tile, the batch size, the row's position in the batch or the thread that
//! runs it: one eight-lane accumulator over the chunks in column order,
//! `acc = fma(w_c, x_c, acc)` with `w_c = code_c * scale_g` rounded once,
//! and `off += offset_g * X_g` in group order, finally `hsum(acc) - off`
//! ([`Lanes::hsum`]). Float formats: the same with `w_c` the stored values,
//! then the columns past the last whole chunk one by one.

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
                        if offsets {
                            codes_tile::<S, $r, $n, true>(codes, scale, offset, layout, xs)
                        } else {
                            codes_tile::<S, $r, $n, false>(codes, scale, offset, layout, xs)
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
unsafe fn codes_tile<S: Lanes, const R: usize, const N: usize, const OFFSETS: bool>(
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
                let mut j = 0;
                while j < group {
                    // gguf's weight (before the offset): code times scale.
                    let w = S::mul(S::codes(codes.add(i * stride + g * gstride + j)), a);
                    let c = g * group + j;
                    for (t, acc) in acc[i].iter_mut().enumerate() {
                        *acc = S::fma(w, S::load(x.add(t * k + c)), *acc);
                    }
                    j += 8;
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
        let mut res = acc.map(|row| row.map(|v| S::hsum(v)));
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
