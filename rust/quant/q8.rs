//! The fast mode: activations quantised to 8 bits as llama.cpp quantises
//! them, then integer dot products with the weight codes.
//!
//! Each activation row is cut into blocks and every block stored as int8
//! codes `q` and one float32 scale `d` (value `d * q`):
//!
//! - **Q8_0** blocks of 32 (weights Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL,
//!   MXFP4):
//!   `d = max|x| / 127`, `q = round(x / d)` (halves away from zero), as
//!   ggml's `quantize_row_q8_0_ref`;
//! - **Q8_K** blocks of 256 (the K-quants and IQ4_XS): `m` the value of
//!   largest magnitude, `q = min(127, round_even(-127 / m * x))`,
//!   `d = 1 / (-127 / m)`, as `quantize_row_q8_K_ref`.
//!
//! Unlike ggml, scales stay float32 (ggml rounds Q8_0's to float16), which
//! only removes error. The **portable build** unpacks a weight row into
//! int8 codes with its float32 group scales and offsets (`unpack.rs`, the
//! exact mode's own unpacking; Q8_0's codes are read in place), totals
//! each group's products exactly in an int32 and runs, group by group,
//!
//! ```text
//! acc = acc + (scale_g * d_b) * float(total_g)
//! off = off + offset_g * (d_b * sum_{j in g} q_j)
//! result = acc - off
//! ```
//!
//! so the result equals a float64 product of the dequantised weights with
//! the dequantised activations up to float32 rounding. As in the exact
//! mode, an element's operations do not depend on the batch, its place in
//! it or the threads. The SIMD kernels total in integers too:
//!
//! - **AVX-512 VNNI and VL** (chosen at run time, [`has_vnni`]), every
//!   format (the K-quants and IQ4_XS as eight blocks of 32 with the scales
//!   and offsets `unpack.rs` gives them, Q2_K's, Q3_K's and Q6_K's in
//!   halves of 16): `sums`, the portable build's float operations in its
//!   order, so the **portable bits** in one row and every batch. A batch's
//!   512-bit lanes are 16 outputs (two weight rows x eight activation
//!   rows), so 64 byte products cost one `vpdpbusd` and a quarter of a
//!   float operation; one row totals 16 rows' lanes with a tree of shuffles.
//! - **AVX2 without VNNI**, the 32-value-block formats Q8_0, Q4_0, Q4_1,
//!   Q5_0, Q5_1, IQ4_NL and MXFP4: `totals` (`vpmaddubsw` on a band of eight
//!   weight rows decoded into 32-bit lanes, quarters of the activation block
//!   broadcast), the portable bits too.
//! - **AVX2 without VNNI**, the K-quants and IQ4_XS: `ktotals`, each
//!   256-value super-block totalled with its group scales in integers
//!   (`vpmaddwd` by the int16 scales, one float multiply-add a super-block,
//!   as llama.cpp): this build's own bits, the same in one row and every
//!   batch.
//!
//! Until the twenty-second session the AVX2 build also had eight-lane
//! kernels (every four byte products converted and multiply-added in float,
//! six operations a weight row, activation row and block); Q8_0 was the last
//! format on them, and they were removed when it moved to `totals`.
//!
//! Float formats (F32, F16, BF16) have no codes and run the exact kernels.

use std::cell::RefCell;

use rayon::prelude::*;

use super::format::QuantType;
use super::simd::{Lanes, Portable};
use super::unpack::{scales_only, unpack_row};
use super::{best_build, check, Build, OutPtr, CHUNKS_PER_THREAD, PARALLEL_BYTES};
use crate::error::{CoreError, CoreResult};

#[cfg(target_arch = "x86_64")]
mod amx;
#[cfg(target_arch = "x86_64")]
mod ktotals;
#[cfg(target_arch = "x86_64")]
mod sums;
#[cfg(target_arch = "x86_64")]
mod totals;

/// Values per activation block for weights of `qtype` (32: Q8_0, 256:
/// Q8_K), or `None` for the float formats, which have no fast kernel.
pub fn act_block(qtype: QuantType) -> Option<usize> {
    match qtype {
        QuantType::F32 | QuantType::F16 | QuantType::BF16 => None,
        QuantType::Q2K
        | QuantType::Q3K
        | QuantType::Q4K
        | QuantType::Q5K
        | QuantType::Q6K
        | QuantType::IQ4XS => Some(256),
        _ => Some(32),
    }
}

/// Activation rows quantised in blocks of `block`: codes `n x cols`,
/// scales `n x cols / block`.
#[derive(Debug, Clone, PartialEq)]
pub struct QActs {
    pub block: usize,
    pub cols: usize,
    pub codes: Vec<i8>,
    pub scales: Vec<f32>,
    /// The block-total kernels' slab tables of these rows, built by the
    /// first product that needs them and shared by every later one (a
    /// decode step's matrices and their chunks on every thread).
    pub(crate) slabs: SlabCache,
}

/// 64 bytes on a cache line.
#[derive(Clone, Copy, Default, Debug, PartialEq)]
#[repr(C, align(64))]
pub(crate) struct Line(pub [i32; 16]);

/// Activation rows laid out for the block-total kernels (`sums`), slabs of
/// eight rows: row `m`'s values in lanes `2m` and `2m + 1`, zeros past the
/// last row.
#[derive(Debug, Default)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) struct Slabs {
    /// Quarter `q` (four codes) of block `c`, slab `s`: `(s * blocks + c) * 8 + q`.
    pub x: Vec<Line>,
    /// `-sum x` of block `c`, slab `s`: `s * blocks + c`.
    pub negsum: Vec<Line>,
    /// `-sum x` of the halves of block `c` (groups of 16, Q6_K): half `h`
    /// at `(s * blocks + c) * 2 + h`.
    pub negsum16: Vec<Line>,
    /// The block scales, 16 lanes at `(s * blocks + c) * 16`.
    pub d: Vec<f32>,
}

/// The same rows laid out for AMX (built only for a product that runs on it).
#[derive(Debug, Default)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) struct AmxSlabs {
    /// Block `c` of slab `s` in VNNI order (quarter `q` of row `m` at
    /// byte `32 q + 4 m`), four lines at `(s * blocks + c) * 4`.
    pub b: Vec<Line>,
    /// The block scales of row `m` in lanes `m` and `8 + m`, at
    /// `(s * blocks + c) * 16`.
    pub d2: Vec<f32>,
}

/// A cache of [`Slabs`] and [`AmxSlabs`]: never part of the value (equal
/// and cloned empty).
#[derive(Debug, Default)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) struct SlabCache(
    pub std::sync::OnceLock<Slabs>,
    pub std::sync::OnceLock<AmxSlabs>,
);

impl Clone for SlabCache {
    fn clone(&self) -> Self {
        SlabCache::default()
    }
}

impl PartialEq for SlabCache {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

/// Quantise the rows of `x` (`cols` a row) in blocks of `block` (32: Q8_0,
/// 256: Q8_K). `cols` must be a whole number of blocks.
pub fn quantize(x: &[f32], cols: usize, block: usize) -> CoreResult<QActs> {
    if !(block == 32 || block == 256) || cols == 0 || !cols.is_multiple_of(block) {
        return Err(CoreError::Shape(format!(
            "{cols} columns is not a whole number of activation blocks of {block}"
        )));
    }
    if !x.len().is_multiple_of(cols) {
        return Err(CoreError::Shape(format!(
            "{} activations are not whole rows of {cols}",
            x.len()
        )));
    }
    let mut codes = vec![0i8; x.len()];
    let mut scales = vec![0.0f32; x.len() / block];
    #[cfg(target_arch = "x86_64")]
    if matches!(best_build(), Build::Avx2 | Build::Avx512) {
        // SAFETY: AVX2 present (both builds need it); whole blocks.
        unsafe { quantize_avx2(x, &mut codes, &mut scales, block) };
        return Ok(QActs {
            block,
            cols,
            codes,
            scales,
            slabs: SlabCache::default(),
        });
    }
    quantize_blocks(x, &mut codes, &mut scales, block);
    Ok(QActs {
        block,
        cols,
        codes,
        scales,
        slabs: SlabCache::default(),
    })
}

/// The portable quantisers over whole blocks of `x`.
pub(crate) fn quantize_blocks(x: &[f32], codes: &mut [i8], scales: &mut [f32], block: usize) {
    for ((xb, qb), d) in x
        .chunks_exact(block)
        .zip(codes.chunks_exact_mut(block))
        .zip(scales.iter_mut())
    {
        *d = if block == 32 {
            quantize_q8_0(xb, qb)
        } else {
            quantize_q8_k(xb, qb)
        };
    }
}

/// [`quantize_blocks`] with AVX2, the same codes and scales bit for bit:
/// the same float operations (`|x|` maximum ignoring NaN, `amax / 127`,
/// `1 / d`, `x * id`, `-127 / max`), the same roundings (halves away from
/// zero by truncation and the fraction; halves to even), and the codes
/// truncated to their low byte as `as i8` does (only NaN gives a value out
/// of range: 0 both ways).
///
/// # Safety
/// AVX2 present; `x`, `codes` whole blocks of `block`, `scales` one per block.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn quantize_avx2(x: &[f32], codes: &mut [i8], scales: &mut [f32], block: usize) {
    use std::arch::x86_64::*;
    // SAFETY (whole body): every block of `block` values lies in `x` and
    // `codes`, its scale in `scales`.
    unsafe {
        let abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
        let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        let low = _mm256_set1_epi32(0xff);
        for (b, d) in scales.iter_mut().enumerate() {
            let xp = x.as_ptr().add(b * block);
            let qp = codes.as_mut_ptr().add(b * block);
            // max |x|, NaN ignored: `max_ps(a, m)` is m when a is NaN.
            let mut m = _mm256_setzero_ps();
            for j in (0..block).step_by(8) {
                m = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(xp.add(j)), abs), m);
            }
            let mut lanes = [0.0f32; 8];
            _mm256_storeu_ps(lanes.as_mut_ptr(), m);
            let amax = lanes.iter().fold(0.0f32, |a, &v| a.max(v));
            // The multiplier and the rounding of each block kind.
            let (mul, even) = if block == 32 {
                *d = amax / 127.0;
                (if *d != 0.0 { 1.0 / *d } else { 0.0 }, false)
            } else {
                if amax == 0.0 {
                    std::ptr::write_bytes(qp, 0, block);
                    *d = 0.0;
                    continue;
                }
                // The first value of largest magnitude, as the scalar loop finds it.
                let xs = std::slice::from_raw_parts(xp, block);
                let max = xs[xs.iter().position(|v| v.abs() == amax).unwrap_or(0)];
                let iscale = -127.0 / max;
                *d = 1.0 / iscale;
                (iscale, true)
            };
            let mv = _mm256_set1_ps(mul);
            for j in (0..block).step_by(32) {
                let mut q = [_mm256_setzero_si256(); 4];
                for (k, q) in q.iter_mut().enumerate() {
                    let v = _mm256_mul_ps(_mm256_loadu_ps(xp.add(j + 8 * k)), mv);
                    let r = if even {
                        // Halves to even (explicitly, whatever MXCSR says), at most 127.
                        let r = _mm256_cvttps_epi32(_mm256_round_ps::<
                            { _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC },
                        >(v));
                        _mm256_min_epi32(r, _mm256_set1_epi32(127))
                    } else {
                        // Halves away from zero: t + (f >= 0.5) - (f <= -0.5).
                        let t = _mm256_cvttps_epi32(v);
                        let f = _mm256_sub_ps(v, _mm256_cvtepi32_ps(t));
                        let up = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_GE_OQ>(
                            f,
                            _mm256_set1_ps(0.5),
                        ));
                        let down = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_LE_OQ>(
                            f,
                            _mm256_set1_ps(-0.5),
                        ));
                        _mm256_add_epi32(_mm256_sub_epi32(t, up), down)
                    };
                    *q = _mm256_and_si256(r, low);
                }
                let ab = _mm256_packus_epi32(q[0], q[1]);
                let cd = _mm256_packus_epi32(q[2], q[3]);
                let bytes = _mm256_permutevar8x32_epi32(_mm256_packus_epi16(ab, cd), order);
                _mm256_storeu_si256(qp.add(j).cast(), bytes);
            }
        }
    }
}

/// ggml's `quantize_row_q8_0_ref` for one block (scale kept float32).
fn quantize_q8_0(x: &[f32], q: &mut [i8]) -> f32 {
    let amax = x.iter().fold(0.0f32, |m, &v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    for (q, &v) in q.iter_mut().zip(x) {
        *q = round_away(v * id) as i8;
    }
    d
}

/// `v.round()` (halves away from zero) for `|v| < 2^31`, without a libm
/// call: the fraction `v - trunc(v)` is exact in float32.
#[inline(always)]
pub(crate) fn round_away(v: f32) -> i32 {
    let t = v as i32;
    let f = v - t as f32;
    t + i32::from(f >= 0.5) - i32::from(f <= -0.5)
}

/// `v.round_ties_even()` for `|v| < 2^31`, without a libm call.
#[inline(always)]
pub(crate) fn round_even(v: f32) -> i32 {
    let t = v as i32;
    let f = v - t as f32;
    let odd = t & 1 != 0;
    t + i32::from(f > 0.5 || (f == 0.5 && odd)) - i32::from(f < -0.5 || (f == -0.5 && odd))
}

/// ggml's `quantize_row_q8_K_ref` for one block.
fn quantize_q8_k(x: &[f32], q: &mut [i8]) -> f32 {
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax == 0.0 {
        q.iter_mut().for_each(|q| *q = 0);
        return 0.0;
    }
    let iscale = -127.0 / max;
    for (q, &v) in q.iter_mut().zip(x) {
        *q = round_even(iscale * v).min(127) as i8;
    }
    1.0 / iscale
}

/// Per-thread buffers for unpacked weight rows.
#[derive(Default)]
struct Scratch {
    codes: Vec<i8>,
    scale: Vec<f32>,
    offset: Vec<f32>,
    /// Formats with offsets: `qsum` transposed, group by group (activation
    /// row `t` of group `g` at `g * ns + t`; VNNI pads `ns` past `n`).
    qsum_t: Vec<f32>,
    /// Block totals (`sums`): qsum in the slabs' lanes; a band's
    /// interleaved codes, its scales and offsets.
    #[cfg(target_arch = "x86_64")]
    sq: Vec<f32>,
    #[cfg(target_arch = "x86_64")]
    sq2: Vec<f32>,
    #[cfg(target_arch = "x86_64")]
    wband: Vec<i64>,
    #[cfg(target_arch = "x86_64")]
    sband: Vec<f32>,
    #[cfg(target_arch = "x86_64")]
    oband: Vec<f32>,
    /// Block totals of a format with unpacked scales: the band's scales
    /// then offsets.
    #[cfg(target_arch = "x86_64")]
    kband: Vec<f32>,
    /// AVX2 block totals (`totals`): a band's quarters, and `bias * sum x`
    /// of each activation row's blocks.
    #[cfg(target_arch = "x86_64")]
    quads: Vec<totals::Quad>,
    #[cfg(target_arch = "x86_64")]
    bx: Vec<i32>,
    /// AVX2 super-block totals (`ktotals`): each activation row's sums of 16 codes.
    #[cfg(target_arch = "x86_64")]
    gsum: Vec<[i16; 16]>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// Weight rows unpacked per step.
const ROW_TILE: usize = 4;

/// One fast product.
struct Job<'a> {
    qtype: QuantType,
    raw: &'a [u8],
    row_bytes: usize,
    rows: usize,
    cols: usize,
    n: usize,
    acts: &'a QActs,
    /// Formats with offsets: `d_b * sum q` over each weight group, `n x groups`.
    qsum: &'a [f32],
    /// Whether the AVX-512 VNNI kernels may run (x86 with AVX2 only; the
    /// same bits as without).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    vnni: bool,
    /// Whether the block-total batches may run on AMX (with `vnni`; the
    /// same bits as without).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    amx: bool,
}

thread_local! {
    /// Tests: products started on this thread leave AMX out.
    #[cfg(all(test, target_arch = "x86_64"))]
    pub(crate) static NO_AMX: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether products of a VNNI job may use AMX here.
fn amx_for(vnni: bool) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        #[cfg(test)]
        if NO_AMX.with(|c| c.get()) {
            return false;
        }
        vnni && amx::available()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = vnni;
        false
    }
}

/// Whether VNNI CPUs run `qtype`'s fast products on exact block totals
/// with the portable float operations (`sums`), so the portable bits.
#[cfg(all(test, target_arch = "x86_64"))]
pub(crate) fn block_totals(qtype: QuantType) -> bool {
    sums::covers(qtype)
}

/// Whether CPUs without VNNI (the AVX2 build) run `qtype`'s fast products
/// on exact block totals (`totals`), so the portable bits.
#[cfg(all(test, target_arch = "x86_64"))]
pub(crate) fn avx2_block_totals(qtype: QuantType) -> bool {
    totals::covers(qtype)
}

/// Whether this CPU has `vpdpbusd` on 256-bit registers (AVX-512 VNNI and
/// VL), the fast mode's VNNI kernels.
pub fn has_vnni() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vl")
            && std::arch::is_x86_feature_detected!("avx512vnni")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether products of `build` take the VNNI kernels: the AVX-512 build on
/// a CPU with VNNI, so `RLX_SIMD=avx2` measures the AVX2 kernels alone (the
/// bits are the same either way).
fn vnni_for(build: Build) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        build == Build::Avx512 && has_vnni()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = build;
        false
    }
}

/// `x @ W.T` as [`super::matmul`], with the activations quantised (see the
/// module). Float formats run the exact kernels.
pub fn matmul(
    qtype: QuantType,
    raw: &[u8],
    rows: usize,
    cols: usize,
    x: &[f32],
    out: &mut [f32],
) -> CoreResult<()> {
    matmul_with(best_build(), true, qtype, raw, rows, cols, x, out)
}

/// [`matmul`], on the calling thread only unless `parallel` (the same bits).
pub fn matmul_parallel(
    parallel: bool,
    qtype: QuantType,
    raw: &[u8],
    rows: usize,
    cols: usize,
    x: &[f32],
    out: &mut [f32],
) -> CoreResult<()> {
    matmul_with(best_build(), parallel, qtype, raw, rows, cols, x, out)
}

/// [`matmul`] with a given build, in parallel when `parallel`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn matmul_with(
    build: Build,
    parallel: bool,
    qtype: QuantType,
    raw: &[u8],
    rows: usize,
    cols: usize,
    x: &[f32],
    out: &mut [f32],
) -> CoreResult<()> {
    let Some(block) = act_block(qtype) else {
        return super::matmul_with(build, parallel, qtype, raw, rows, cols, x, out);
    };
    check(qtype, raw, rows, cols)?;
    if !x.len().is_multiple_of(cols) || (x.len() / cols).checked_mul(rows) != Some(out.len()) {
        return Err(CoreError::Shape(format!(
            "activations of {} values and an output of {} values do not fit a {rows} x {cols} weight",
            x.len(),
            out.len()
        )));
    }
    let acts = quantize(x, cols, block)?;
    matmul_quantized(build, parallel, qtype, raw, rows, &acts, out)
}

/// The product with activations already quantised (in `act_block(qtype)` blocks).
pub(crate) fn matmul_quantized(
    build: Build,
    parallel: bool,
    qtype: QuantType,
    raw: &[u8],
    rows: usize,
    acts: &QActs,
    out: &mut [f32],
) -> CoreResult<()> {
    matmul_quantized_as(
        build,
        vnni_for(build),
        parallel,
        qtype,
        raw,
        rows,
        acts,
        out,
    )
}

/// [`matmul_with`], the VNNI kernels allowed only if `vnni` (tests: the
/// same bits either way).
#[cfg(all(test, target_arch = "x86_64"))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn matmul_with_vnni(
    build: Build,
    vnni: bool,
    parallel: bool,
    qtype: QuantType,
    raw: &[u8],
    rows: usize,
    cols: usize,
    x: &[f32],
    out: &mut [f32],
) -> CoreResult<()> {
    let block = act_block(qtype).expect("a block format");
    let acts = quantize(x, cols, block)?;
    matmul_quantized_as(
        build,
        vnni && has_vnni(),
        parallel,
        qtype,
        raw,
        rows,
        &acts,
        out,
    )
}

/// [`matmul_quantized`], the VNNI kernels allowed only if `vnni`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn matmul_quantized_as(
    build: Build,
    vnni: bool,
    parallel: bool,
    qtype: QuantType,
    raw: &[u8],
    rows: usize,
    acts: &QActs,
    out: &mut [f32],
) -> CoreResult<()> {
    let cols = acts.cols;
    let rb = check(qtype, raw, rows, cols)?;
    if act_block(qtype) != Some(acts.block) {
        return Err(CoreError::Shape(format!(
            "{} weights need activation blocks of {:?}, got {}",
            qtype.name(),
            act_block(qtype),
            acts.block
        )));
    }
    let n = acts.codes.len() / cols;
    if n.checked_mul(rows) != Some(out.len()) {
        return Err(CoreError::Shape(format!(
            "an output of {} values does not fit {n} rows of a {rows} x {cols} weight",
            out.len()
        )));
    }
    if n == 0 || rows == 0 {
        return Ok(());
    }
    let qsum = if qtype.has_offsets() {
        group_qsums(acts, qtype.group_values())
    } else {
        Vec::new()
    };
    let job = Job {
        qtype,
        raw,
        row_bytes: rb,
        rows,
        cols,
        n,
        acts,
        qsum: &qsum,
        vnni,
        amx: amx_for(vnni),
    };
    let ptr = OutPtr(out.as_mut_ptr());
    let threads = rayon::current_num_threads();
    // Integer products cost about a third of the exact ones per weight.
    let work = raw.len().saturating_mul(n.div_ceil(8)) / 2;
    let tiles = rows.div_ceil(ROW_TILE);
    let chunks = if !parallel || threads <= 1 || work < PARALLEL_BYTES {
        1
    } else {
        (threads * CHUNKS_PER_THREAD).min(tiles)
    };
    if chunks == 1 {
        // SAFETY: `out` is n x rows and borrowed mutably here.
        unsafe { run(build, &job, 0, rows, ptr.get()) };
        return Ok(());
    }
    let per = tiles.div_ceil(chunks) * ROW_TILE;
    (0..rows.div_ceil(per)).into_par_iter().for_each(|c| {
        let (lo, hi) = (c * per, ((c + 1) * per).min(rows));
        // SAFETY: disjoint row ranges write disjoint elements of `out`.
        unsafe { run(build, &job, lo, hi, ptr.get()) };
    });
    Ok(())
}

/// Rows `lo..hi` of the product of the quantised activation rows `acts`
/// with `W` (as [`matmul_quantized`], the same bits), on the calling
/// thread, into columns `lo..hi` of `out` (`n` x `rows`). `qsum` is
/// `group_qsums(acts, qtype.group_values())` for formats with offsets
/// (else empty).
///
/// # Safety
/// `out` points to `n * rows` writable floats; nobody else reads or writes
/// columns `lo..hi` of it meanwhile.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn rows_into(
    qtype: QuantType,
    raw: &[u8],
    rows: usize,
    acts: &QActs,
    qsum: &[f32],
    lo: usize,
    hi: usize,
    out: *mut f32,
) -> CoreResult<()> {
    let cols = acts.cols;
    let rb = check(qtype, raw, rows, cols)?;
    let n = acts.codes.len() / cols.max(1);
    let groups = if qtype.has_offsets() {
        cols / qtype.group_values()
    } else {
        0
    };
    if act_block(qtype) != Some(acts.block)
        || n == 0
        || n * cols != acts.codes.len()
        || qsum.len() != n * groups
        || lo > hi
        || hi > rows
    {
        return Err(CoreError::Shape(format!(
            "rows {lo}..{hi} of a {rows} x {cols} {} weight times {} activations in blocks of {}",
            qtype.name(),
            acts.codes.len(),
            acts.block
        )));
    }
    let job = Job {
        qtype,
        raw,
        row_bytes: rb,
        rows,
        cols,
        n,
        acts,
        qsum,
        vnni: vnni_for(best_build()),
        amx: amx_for(vnni_for(best_build())),
    };
    // SAFETY: forwarded (`out` is n x rows).
    unsafe { run(best_build(), &job, lo, hi, out) };
    Ok(())
}

/// `d_b * sum q` over each group of `group` values of every row.
pub(crate) fn group_qsums(acts: &QActs, group: usize) -> Vec<f32> {
    acts.codes
        .chunks_exact(group)
        .enumerate()
        .map(|(g, c)| {
            let s: i32 = c.iter().map(|&q| i32::from(q)).sum();
            acts.scales[g * group / acts.block] * s as f32
        })
        .collect()
}

/// Rows `lo..hi` of `job` with `build`.
///
/// # Safety
/// `out` holds `n * rows` floats and nobody else writes rows `lo..hi`.
unsafe fn run(build: Build, job: &Job<'_>, lo: usize, hi: usize, out: *mut f32) {
    let go = |s: &mut Scratch| {
        // SAFETY: forwarded; each build only where best_build found it.
        unsafe {
            match build {
                #[cfg(target_arch = "x86_64")]
                Build::Avx2 | Build::Avx512 => rows_avx2(job, lo, hi, out, s),
                #[cfg(target_arch = "aarch64")]
                Build::Neon => rows::<Portable>(job, lo, hi, out, s),
                Build::Portable => rows::<Portable>(job, lo, hi, out, s),
            }
        }
    };
    SCRATCH.with(|cell| match cell.try_borrow_mut() {
        Ok(mut s) => go(&mut s),
        Err(_) => go(&mut Scratch::default()),
    })
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rows_avx2(job: &Job<'_>, lo: usize, hi: usize, out: *mut f32, s: &mut Scratch) {
    if job.vnni && sums::covers(job.qtype) {
        // SAFETY: forwarded; `job.vnni` only where `has_vnni` found VNNI.
        unsafe {
            // One to three activation rows (four for the K-quants): the
            // one-row kernel, each band decoded once for all of them (two or
            // three rows cost the batch tiles about what eight do); the same
            // bits either way. Four rows: Q4_K 1.9-2.4x, Q6_K 1.2x, Q5_K
            // 1.6x, IQ4_XS 1.2x the tiles, Q3_K about the same; Q4_0
            // 0.8-0.9x, so the 32-value formats keep the tiles.
            let k_quant = act_block(job.qtype) == Some(256);
            match job.n {
                1 => sums::row1(job, 0, lo, hi, out),
                2 => sums::row2(job, 0, lo, hi, out),
                3 => sums::row3(job, 0, lo, hi, out),
                4 if k_quant => sums::row4(job, 0, lo, hi, out),
                _ => sums::rows(job, lo, hi, out, s),
            }
        }
        return;
    }
    if totals::covers(job.qtype) {
        // The 32-value-block formats: exact block totals, every batch size
        // (one row included, so a row's bits do not depend on its batch).
        // SAFETY: forwarded; AVX2, FMA and F16C were checked by the caller.
        unsafe { totals::rows(job, lo, hi, out, s) };
        return;
    }
    if ktotals::covers(job.qtype) {
        // Q4_K, Q5_K, Q6_K: exact super-block totals, every batch size.
        // SAFETY: forwarded; AVX2, FMA and F16C were checked by the caller.
        unsafe { ktotals::rows(job, lo, hi, out, s) };
        return;
    }
    // Every quantised format has a kernel above; anything else takes the
    // portable route (its bits, correct, not fast).
    // SAFETY: forwarded.
    unsafe { rows::<Portable>(job, lo, hi, out, s) }
}

/// Where a band of unpacked rows lives: int8 codes, row `i`, chunk `c`
/// (32 codes) at `codes + i * stride + c * cstride` (unpacked rows, or
/// Q8_0's stored codes).
#[derive(Clone, Copy)]
struct Band {
    codes: *const i8,
    stride: usize,
    cstride: usize,
    /// Scales (offsets) of row `i`, group `g` at `i * groups + g`.
    scale: *const f32,
    offset: *const f32,
    groups: usize,
    /// Formats with offsets: the activation rows' `qsum` of group `g`
    /// from the tile's first activation row, at `qsum_t + g * qsum_stride`.
    qsum_t: *const f32,
    qsum_stride: usize,
}

/// Rows `lo..hi`, unpacked with `S` and multiplied with the integer kernel
/// of `S`'s build.
#[inline(always)]
unsafe fn rows<S: Lanes + Dot>(
    job: &Job<'_>,
    lo: usize,
    hi: usize,
    out: *mut f32,
    s: &mut Scratch,
) {
    let (k, qtype) = (job.cols, job.qtype);
    let group = qtype.group_values();
    let groups = k / group;
    let in_place = qtype == QuantType::Q8_0;
    s.codes.resize(if in_place { 0 } else { ROW_TILE * k }, 0);
    s.scale.resize(ROW_TILE * groups, 0.0);
    s.offset.resize(ROW_TILE * groups, 0.0);
    // The offsets' activation sums group-major, so a tile's offset terms
    // run over its activation rows side by side.
    s.qsum_t.clear();
    if qtype.has_offsets() {
        s.qsum_t.resize(groups * job.n, 0.0);
        for (t, q) in job.qsum.chunks_exact(groups).enumerate() {
            for (g, &q) in q.iter().enumerate() {
                s.qsum_t[g * job.n + t] = q;
            }
        }
    }
    let mut r = lo;
    while r < hi {
        let rt = if hi - r >= ROW_TILE { ROW_TILE } else { 1 };
        for i in 0..rt {
            let row = &job.raw[(r + i) * job.row_bytes..(r + i + 1) * job.row_bytes];
            let (sc, of) = (
                &mut s.scale[i * groups..(i + 1) * groups],
                &mut s.offset[i * groups..(i + 1) * groups],
            );
            if in_place {
                scales_only::<S>(qtype, row, sc, of);
            } else {
                unpack_row::<S>(qtype, row, &mut s.codes[i * k..(i + 1) * k], sc, of);
            }
        }
        let mut t = 0;
        while t < job.n {
            let nt = match job.n - t {
                4.. => 4,
                2..=3 => 2,
                _ => 1,
            };
            let rs = if nt == 4 { 2 } else { 4 }.min(rt);
            for i in (0..rt).step_by(rs) {
                // SAFETY: rows r + i.. of the scratch (or of `raw` for Q8_0).
                let band = unsafe {
                    let (codes, stride, cstride) = if in_place {
                        let p = job.raw.as_ptr().add((r + i) * job.row_bytes + 2);
                        (p.cast::<i8>(), job.row_bytes, 34)
                    } else {
                        (s.codes.as_ptr().add(i * k), k, 32)
                    };
                    Band {
                        codes,
                        stride,
                        cstride,
                        scale: s.scale.as_ptr().add(i * groups),
                        offset: s.offset.as_ptr().add(i * groups),
                        groups,
                        qsum_t: s.qsum_t.as_ptr().wrapping_add(t),
                        qsum_stride: job.n,
                    }
                };
                // SAFETY: t + nt <= n activation rows; out is n x rows.
                unsafe { tile::<S>(job, band, group, rs, nt, t, out.add(t * job.rows + r + i)) };
            }
            t += nt;
        }
        r += rt;
    }
}

/// One `rs` x `nt` tile: weight rows of `band` times activation rows `t..`.
#[inline(always)]
unsafe fn tile<S: Dot>(
    job: &Job<'_>,
    band: Band,
    group: usize,
    rs: usize,
    nt: usize,
    t: usize,
    out: *mut f32,
) {
    let acts = job.acts;
    let k = job.cols;
    let nb = k / acts.block;
    // SAFETY: rows t..t + nt of the activations (caller).
    let (xq, xd) = unsafe {
        (
            acts.codes.as_ptr().add(t * k),
            acts.scales.as_ptr().add(t * nb),
        )
    };
    let shift = if acts.block == 256 { 3 } else { 0 };
    let g16 = group == 16;
    macro_rules! go {
        ($r:literal, $n:literal) => {{
            // SAFETY: forwarded from the caller.
            let mut res: [[f32; $n]; $r] =
                unsafe { S::dots::<$r, $n>(band, g16, xq, xd, shift, k) };
            if job.qtype.has_offsets() {
                // Each output's `sum_g offset_g * qsum_g` from zero, group by
                // group (the one-row order), the tile's outputs side by side.
                let mut off = [[0.0f32; $n]; $r];
                for g in 0..band.groups {
                    // SAFETY: group g of rows 0..$r and of activation rows
                    // t..t + $n (qsum_t is groups x n).
                    unsafe {
                        let q = band.qsum_t.add(g * band.qsum_stride);
                        for (i, off) in off.iter_mut().enumerate() {
                            let o = *band.offset.add(i * band.groups + g);
                            for (tt, off) in off.iter_mut().enumerate() {
                                *off += o * *q.add(tt);
                            }
                        }
                    }
                }
                for (row, off) in res.iter_mut().zip(&off) {
                    for (v, off) in row.iter_mut().zip(off) {
                        *v -= off;
                    }
                }
            }
            for (i, row) in res.iter().enumerate() {
                for (tt, &v) in row.iter().enumerate() {
                    // SAFETY: (tt, i) inside the output (caller).
                    unsafe { *out.add(tt * job.rows + i) = v };
                }
            }
        }};
    }
    match (rs, nt) {
        (4, 1) => go!(4, 1),
        (4, 2) => go!(4, 2),
        (2, 4) => go!(2, 4),
        (1, 4) => go!(1, 4),
        (1, 2) => go!(1, 2),
        _ => go!(1, 1),
    }
}

/// The integer dot products of one build.
trait Dot {
    /// `R` weight rows of `band` times `N` activation rows (codes `xq`, `k`
    /// apart; scales `xd`, `k >> 5 >> shift` apart, block of chunk `c` is
    /// `c >> shift`): `sum_c hsum(scale_c * d * int_dot_c)` without offsets.
    /// `g16`: groups of 16 (two scales a chunk).
    unsafe fn dots<const R: usize, const N: usize>(
        band: Band,
        g16: bool,
        xq: *const i8,
        xd: *const f32,
        shift: usize,
        k: usize,
    ) -> [[f32; N]; R];
}

impl Dot for Portable {
    #[inline(always)]
    unsafe fn dots<const R: usize, const N: usize>(
        band: Band,
        g16: bool,
        xq: *const i8,
        xd: *const f32,
        shift: usize,
        k: usize,
    ) -> [[f32; N]; R] {
        let chunks = k / 32;
        let nb = chunks >> shift;
        let mut res = [[0.0f32; N]; R];
        // SAFETY (whole body): in bounds per the caller.
        unsafe {
            for (i, res) in res.iter_mut().enumerate() {
                for (t, res) in res.iter_mut().enumerate() {
                    let mut acc = 0.0f32;
                    for c in 0..chunks {
                        let w = band.codes.add(i * band.stride + c * band.cstride);
                        let x = xq.add(t * k + c * 32);
                        let d = *xd.add(t * nb + (c >> shift));
                        let halves = if g16 { 2 } else { 1 };
                        let per = 32 / halves;
                        for h in 0..halves {
                            let mut s = 0i32;
                            for j in h * per..(h + 1) * per {
                                s += i32::from(*w.add(j)) * i32::from(*x.add(j));
                            }
                            let g = c * halves + h;
                            acc += *band.scale.add(i * band.groups + g) * d * s as f32;
                        }
                    }
                    *res = acc;
                }
            }
        }
        res
    }
}

/// The AVX2 code readers: 32 int8 codes of row `i`, chunk `c` of a band,
/// the same codes `unpack.rs` writes.
#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// The 16 bytes at `p` as 32 nibbles: low ones, then high ones.
    #[inline(always)]
    unsafe fn nibbles(p: *const u8) -> __m256i {
        // SAFETY: 16 readable bytes at p (caller).
        unsafe {
            let v = _mm_loadu_si128(p.cast());
            let m = _mm_set1_epi8(15);
            _mm256_set_m128i(
                _mm_and_si128(_mm_srli_epi16::<4>(v), m),
                _mm_and_si128(v, m),
            )
        }
    }

    /// 0xff in byte `j` where bit `j` of the little-endian u32 at `p` is set.
    #[inline(always)]
    unsafe fn bits(p: *const u8) -> __m256i {
        // SAFETY: 4 readable bytes at p (caller).
        unsafe {
            let qh = p.cast::<u32>().read_unaligned();
            let spread = _mm256_setr_epi8(
                0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3,
                3, 3, 3, 3,
            );
            let b = _mm256_shuffle_epi8(_mm256_set1_epi32(qh as i32), spread);
            let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201_u64 as i64);
            _mm256_cmpeq_epi8(_mm256_and_si256(b, bit), bit)
        }
    }

    /// A format of 32-value blocks read whole: codes, scale and offset of
    /// the block at `b`, as `unpack.rs` gives them.
    pub(super) trait Block {
        const BYTES: usize;
        /// Whether blocks have an offset (`weight = scale * code - offset`).
        const OFFSET: bool = false;
        /// Whether [`Block::stored`] gives signed codes; else unsigned ones
        /// (below 32), the code being `stored - BIAS`.
        const SIGNED: bool = false;
        const BIAS: i8 = 0;
        /// Whether the scale is an E8M0 byte first (MXFP4: `2^(e - 128)`,
        /// [`e8m0_8`]) rather than a float16 `d` first.
        const E8M0: bool = false;
        /// The 32 codes as stored (see [`Block::SIGNED`]).
        ///
        /// # Safety
        /// AVX2 present; `BYTES` readable bytes at `b`.
        unsafe fn stored(b: *const u8) -> __m256i;
        /// The 32 codes, int8.
        ///
        /// # Safety
        /// As [`Block::stored`].
        #[inline(always)]
        unsafe fn codes(b: *const u8) -> __m256i {
            // SAFETY: forwarded.
            let v = unsafe { Self::stored(b) };
            if Self::BIAS != 0 {
                // SAFETY: AVX2 present (caller).
                unsafe { _mm256_sub_epi8(v, _mm256_set1_epi8(Self::BIAS)) }
            } else {
                v
            }
        }
    }

    impl Block for Q8_0 {
        const BYTES: usize = 34;
        const SIGNED: bool = true;
        #[inline(always)]
        unsafe fn stored(b: *const u8) -> __m256i {
            // SAFETY: forwarded; the codes follow `d`.
            unsafe { _mm256_loadu_si256(b.add(2).cast()) }
        }
    }

    impl Block for Q4_0 {
        const BYTES: usize = 18;
        const BIAS: i8 = 8;
        #[inline(always)]
        unsafe fn stored(b: *const u8) -> __m256i {
            // SAFETY: forwarded; nibbles after `d`.
            unsafe { nibbles(b.add(2)) }
        }
    }

    impl Block for Q4_1 {
        const BYTES: usize = 20;
        const OFFSET: bool = true;
        #[inline(always)]
        unsafe fn stored(b: *const u8) -> __m256i {
            // SAFETY: forwarded; nibbles after `d`, `m`.
            unsafe { nibbles(b.add(4)) }
        }
    }

    impl Block for Q5_0 {
        const BYTES: usize = 22;
        const BIAS: i8 = 16;
        #[inline(always)]
        unsafe fn stored(b: *const u8) -> __m256i {
            // SAFETY: forwarded; `d`, qh, nibbles.
            unsafe {
                let high = _mm256_and_si256(bits(b.add(2)), _mm256_set1_epi8(0x10));
                _mm256_or_si256(nibbles(b.add(6)), high)
            }
        }
    }

    impl Block for Q5_1 {
        const BYTES: usize = 24;
        const OFFSET: bool = true;
        #[inline(always)]
        unsafe fn stored(b: *const u8) -> __m256i {
            // SAFETY: forwarded; `d`, `m`, qh, nibbles.
            unsafe {
                let high = _mm256_and_si256(bits(b.add(4)), _mm256_set1_epi8(0x10));
                _mm256_or_si256(nibbles(b.add(8)), high)
            }
        }
    }

    impl Block for Iq4Nl {
        const BYTES: usize = 18;
        const SIGNED: bool = true;
        #[inline(always)]
        unsafe fn stored(b: *const u8) -> __m256i {
            // SAFETY: forwarded; nibbles after `d`.
            unsafe {
                let t = _mm256_broadcastsi128_si256(_mm_loadu_si128(
                    super::super::unpack::IQ4_VALUES.as_ptr().cast(),
                ));
                _mm256_shuffle_epi8(t, nibbles(b.add(2)))
            }
        }
    }

    impl Block for Mxfp4 {
        const BYTES: usize = 17;
        const SIGNED: bool = true;
        const E8M0: bool = true;
        #[inline(always)]
        unsafe fn stored(b: *const u8) -> __m256i {
            // SAFETY: forwarded; nibbles after `e`.
            unsafe {
                let t = _mm256_broadcastsi128_si256(_mm_loadu_si128(
                    super::super::unpack::MXFP4_VALUES.as_ptr().cast(),
                ));
                _mm256_shuffle_epi8(t, nibbles(b.add(1)))
            }
        }
    }

    /// MXFP4's scales `2^(e - 128)` of the E8M0 bytes in the low byte of
    /// each 32-bit lane of `v` (the other bytes ignored): `unpack.rs`'s
    /// `e8m0_half` eight lanes at a time, the same floats (`(e - 1) << 23`
    /// from e = 2, the subnormal `0x00200000 << e` below).
    ///
    /// # Safety
    /// AVX2 present.
    #[inline(always)]
    pub(super) unsafe fn e8m0_8(v: __m256i) -> __m256 {
        // SAFETY: AVX2 present (caller).
        unsafe {
            let e = _mm256_and_si256(v, _mm256_set1_epi32(0xff));
            let one = _mm256_set1_epi32(1);
            let normal = _mm256_slli_epi32::<23>(_mm256_sub_epi32(e, one));
            let tiny = _mm256_sllv_epi32(_mm256_set1_epi32(0x0020_0000), e);
            let big = _mm256_cmpgt_epi32(e, one);
            _mm256_castsi256_ps(_mm256_blendv_epi8(tiny, normal, big))
        }
    }

    /// The formats' markers.
    pub(super) struct Q8_0;
    pub(super) struct Q4_0;
    pub(super) struct Q4_1;
    pub(super) struct Q5_0;
    pub(super) struct Q5_1;
    pub(super) struct Iq4Nl;
    pub(super) struct Mxfp4;
}
