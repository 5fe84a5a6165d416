//! GGUF weights used in place: products of float32 activations with matrices
//! stored in ggml's block formats (and F32/F16/BF16), dequantised on the fly
//! inside the dot products, never as a whole float32 matrix.
//!
//! - [`format`]: the formats by ggml id and their block geometry;
//! - `unpack`: each block layout as int8 codes and per-group scales;
//! - `simd`: eight float lanes as AVX2+FMA (chosen at run time), NEON or
//!   portable Rust;
//! - `kernel`: the fused dequantise-and-dot tiles;
//! - `multirow`: the same with several activation rows (batched decode,
//!   prefill);
//! - `avx512`: the AVX-512 build's sixteen-lane kernels for the 32-value
//!   block formats (its own order, one row and batched alike).
//!
//! **Exact.** Activations stay float32 and the kernels use gguf's own
//! float32 scales and offsets (`gguf.quants.dequantize`'s weights are
//! `scale * code - offset`): results differ from a float64 product over
//! gguf's dequantised weights only by float32 rounding of the sums (see
//! `kernel` for the order; the bound is tested). **Deterministic.** One output element is always computed
//! by the same operations in the same order: it does not depend on the
//! number of activation rows, the row's place among them, or the threads
//! (work is split over weight rows, never over the reduction).
//!
//! Threads: the work runs in the rayon pool the caller is in (the engine
//! installs its own, sized by its `threads` setting).

#[cfg(target_arch = "x86_64")]
mod avx512;
pub mod format;
mod kernel;
mod multirow;
pub mod q8;
mod simd;
#[cfg(test)]
mod tests;
mod unpack;

use std::cell::RefCell;

use rayon::prelude::*;

use crate::error::{CoreError, CoreResult};
pub use format::QuantType;
use kernel::{Job, Scratch};
pub use unpack::dequantize_row;

/// Matrices smaller than this many weight bytes (times the activation row
/// tiles) run on the calling thread: waking a second thread costs more.
pub(crate) const PARALLEL_BYTES: usize = 96 * 1024;

/// Row chunks per thread: enough for work stealing to even out two threads.
pub(crate) const CHUNKS_PER_THREAD: usize = 4;

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// A build of the kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Build {
    /// AVX-512 F/BW/VL (+ AVX2, FMA, F16C): its own sixteen-lane order for
    /// the formats `avx512::covers` takes, the AVX2 kernels for the rest.
    #[cfg(target_arch = "x86_64")]
    Avx512,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    #[cfg(target_arch = "aarch64")]
    Neon,
    Portable,
}

/// The build every product of this process runs: the widest this CPU
/// has, or a narrower one named by `RLX_SIMD` (`avx2` or `portable`; for
/// A/B measurements and tests), read once.
pub(crate) fn best_build() -> Build {
    static BUILD: std::sync::OnceLock<Build> = std::sync::OnceLock::new();
    *BUILD.get_or_init(|| {
        let widest = widest_build();
        match std::env::var("RLX_SIMD").as_deref() {
            #[cfg(target_arch = "x86_64")]
            Ok("avx2") if has_avx2() => Build::Avx2,
            Ok("portable") => Build::Portable,
            _ => widest,
        }
    })
}

/// The widest build this CPU runs.
pub(crate) fn widest_build() -> Build {
    #[cfg(target_arch = "x86_64")]
    {
        if has_avx512() {
            return Build::Avx512;
        }
        if has_avx2() {
            return Build::Avx2;
        }
    }
    #[cfg(target_arch = "aarch64")]
    {
        return Build::Neon;
    }
    #[allow(unreachable_code)]
    Build::Portable
}

/// Which kernel build runs on this CPU: `"avx512"`, `"avx2"`, `"neon"` or
/// `"portable"`.
pub fn simd_name() -> &'static str {
    match best_build() {
        #[cfg(target_arch = "x86_64")]
        Build::Avx512 => "avx512",
        #[cfg(target_arch = "x86_64")]
        Build::Avx2 => "avx2",
        #[cfg(target_arch = "aarch64")]
        Build::Neon => "neon",
        Build::Portable => "portable",
    }
}

#[cfg(target_arch = "x86_64")]
fn has_avx2() -> bool {
    std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("fma")
        && std::arch::is_x86_feature_detected!("f16c")
}

/// AVX-512 F, BW and VL with AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
pub(crate) fn has_avx512() -> bool {
    has_avx2()
        && std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw")
        && std::arch::is_x86_feature_detected!("avx512vl")
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
unsafe fn rows_avx512(job: &Job<'_>, lo: usize, hi: usize, out: *mut f32, s: &mut Scratch) {
    // SAFETY: forwarded; the features were checked by the caller.
    unsafe {
        if job.n == 1 && avx512::covers(job.qtype) {
            // This build's own order: one activation row takes its one-row
            // kernel, several its tiles (`multirow`); the general tiles never
            // see these formats in this build.
            return avx512::rows(job, lo, hi, out);
        }
        rows_avx2(job, lo, hi, out, s)
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rows_avx2(job: &Job<'_>, lo: usize, hi: usize, out: *mut f32, s: &mut Scratch) {
    // SAFETY: forwarded; AVX2, FMA and F16C were checked by the caller.
    unsafe {
        if job.n == 1 && kernel::row1::covers(job.qtype) {
            // One row of a 32-value-block format: codes in registers, same bits.
            return kernel::row1::rows(job, lo, hi, out);
        }
        kernel::run_rows::<simd::Avx2>(job, lo, hi, out, s)
    }
}

#[cfg(target_arch = "aarch64")]
unsafe fn rows_neon(job: &Job<'_>, lo: usize, hi: usize, out: *mut f32, s: &mut Scratch) {
    // SAFETY: forwarded; NEON is part of aarch64.
    unsafe { kernel::run_rows::<simd::Neon>(job, lo, hi, out, s) }
}

unsafe fn rows_portable(job: &Job<'_>, lo: usize, hi: usize, out: *mut f32, s: &mut Scratch) {
    // SAFETY: forwarded.
    unsafe { kernel::run_rows::<simd::Portable>(job, lo, hi, out, s) }
}

/// Rows `lo..hi` of `job` with `build` (one [`best_build`] returned).
///
/// # Safety
/// As [`kernel::run_rows`]: `out` holds `n * rows` floats and nobody else
/// writes columns `lo..hi` meanwhile.
unsafe fn run(build: Build, job: &Job<'_>, lo: usize, hi: usize, out: *mut f32) {
    if job.n >= multirow::MIN_ROWS {
        // Several activation rows: each weight row is unpacked once for all.
        return multirow::with_scratch(|s| {
            // SAFETY: forwarded; each build only where best_build found it.
            unsafe {
                match build {
                    #[cfg(target_arch = "x86_64")]
                    Build::Avx512 => multirow::rows_avx512(job, lo, hi, out, s),
                    #[cfg(target_arch = "x86_64")]
                    Build::Avx2 => multirow::rows_avx2(job, lo, hi, out, s),
                    #[cfg(target_arch = "aarch64")]
                    Build::Neon => multirow::rows_neon(job, lo, hi, out, s),
                    Build::Portable => multirow::rows_portable(job, lo, hi, out, s),
                }
            }
        });
    }
    let go = |s: &mut Scratch| {
        // SAFETY: forwarded; each build only where best_build found it.
        unsafe {
            match build {
                #[cfg(target_arch = "x86_64")]
                Build::Avx512 => rows_avx512(job, lo, hi, out, s),
                #[cfg(target_arch = "x86_64")]
                Build::Avx2 => rows_avx2(job, lo, hi, out, s),
                #[cfg(target_arch = "aarch64")]
                Build::Neon => rows_neon(job, lo, hi, out, s),
                Build::Portable => rows_portable(job, lo, hi, out, s),
            }
        }
    };
    SCRATCH.with(|cell| match cell.try_borrow_mut() {
        Ok(mut s) => go(&mut s),
        Err(_) => go(&mut Scratch::default()),
    })
}

/// A pointer the row chunks share; each writes its own columns only.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
impl OutPtr {
    /// The pointer (a method, so closures capture the whole `Sync` wrapper).
    fn get(self) -> *mut f32 {
        self.0
    }
}

// SAFETY: the chunks write disjoint elements (see `matmul`).
unsafe impl Send for OutPtr {}
// SAFETY: as above.
unsafe impl Sync for OutPtr {}

/// Check that `raw` is `rows` rows of `cols` values in `qtype`; the row size.
fn check(qtype: QuantType, raw: &[u8], rows: usize, cols: usize) -> CoreResult<usize> {
    let rb = qtype.row_bytes(cols)?;
    if rows.checked_mul(rb) != Some(raw.len()) {
        return Err(CoreError::Shape(format!(
            "{} bytes of {} data do not hold {rows} rows of {cols} values ({rb} bytes a row)",
            raw.len(),
            qtype.name()
        )));
    }
    Ok(rb)
}

/// `x @ W.T` for `W` = `rows` x `cols` stored in `raw` (`qtype` rows, back
/// to back) and `x` = `n` x `cols` (row-major), into `out` = `n` x `rows`.
///
/// Weight rows are split in chunks over the current rayon pool when the
/// matrix is big enough to pay for a second thread; every weight block is
/// read once for up to eight activation rows.
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

/// [`matmul`] on the calling thread only, whatever pool it is in (the
/// same results, bit for bit).
pub fn matmul_serial(
    qtype: QuantType,
    raw: &[u8],
    rows: usize,
    cols: usize,
    x: &[f32],
    out: &mut [f32],
) -> CoreResult<()> {
    matmul_with(best_build(), false, qtype, raw, rows, cols, x, out)
}

/// [`matmul`] with a given build (tests compare builds), in parallel when
/// `parallel` and the pool has threads to spare.
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
    let rb = check(qtype, raw, rows, cols)?;
    let n = x.len() / cols;
    if !x.len().is_multiple_of(cols) || n.checked_mul(rows) != Some(out.len()) {
        return Err(CoreError::Shape(format!(
            "activations of {} values and an output of {} values do not fit a {rows} x {cols} weight",
            x.len(),
            out.len()
        )));
    }
    if n == 0 || rows == 0 {
        return Ok(());
    }
    let xsum = kernel::offset_sums(qtype, x);
    let job = Job {
        qtype,
        raw,
        row_bytes: rb,
        rows,
        cols,
        x,
        n,
        xsum: &xsum,
    };
    let ptr = OutPtr(out.as_mut_ptr());
    let threads = rayon::current_num_threads();
    let work = raw.len().saturating_mul(n.div_ceil(8));
    let tiles = rows.div_ceil(4);
    let chunks = if !parallel || threads <= 1 || work < PARALLEL_BYTES {
        1
    } else {
        (threads * CHUNKS_PER_THREAD).min(tiles)
    };
    if chunks == 1 {
        // SAFETY: `out` is n x rows and borrowed mutably here.
        unsafe { run(build, &job, 0, rows, ptr.0) };
        return Ok(());
    }
    let per = tiles.div_ceil(chunks) * 4;
    (0..rows.div_ceil(per)).into_par_iter().for_each(|c| {
        let (lo, hi) = (c * per, ((c + 1) * per).min(rows));
        // SAFETY: chunks cover disjoint row ranges, so they write disjoint
        // elements of `out`, which outlives the parallel loop.
        unsafe { run(build, &job, lo, hi, ptr.get()) };
    });
    Ok(())
}

/// Per-group activation sums for weights with offsets (`group` values a
/// group), as [`rows_into`] takes them.
pub(crate) fn group_sums(x: &[f32], group: usize) -> Vec<f32> {
    kernel::group_sums(x, group)
}

/// Rows `lo..hi` of the product of the activation rows `x` (`n` rows of
/// `cols`) with `W` (as [`matmul`], the same bits), on the calling thread,
/// into columns `lo..hi` of `out` (`n` x `rows`). `xsum` is
/// `group_sums(x, qtype.group_values())` for formats with offsets (else
/// empty).
///
/// # Safety
/// `out` points to `n * rows` writable floats; nobody else reads or writes
/// columns `lo..hi` of it meanwhile.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn rows_into(
    qtype: QuantType,
    raw: &[u8],
    rows: usize,
    cols: usize,
    x: &[f32],
    xsum: &[f32],
    lo: usize,
    hi: usize,
    out: *mut f32,
) -> CoreResult<()> {
    let rb = check(qtype, raw, rows, cols)?;
    let n = x.len() / cols.max(1);
    let groups = if qtype.has_offsets() {
        cols / qtype.group_values()
    } else {
        0
    };
    if n == 0 || n * cols != x.len() || xsum.len() != n * groups || lo > hi || hi > rows {
        return Err(CoreError::Shape(format!(
            "rows {lo}..{hi} of a {rows} x {cols} weight times {} activations ({} group sums)",
            x.len(),
            xsum.len()
        )));
    }
    let job = Job {
        qtype,
        raw,
        row_bytes: rb,
        rows,
        cols,
        x,
        n,
        xsum,
    };
    // SAFETY: forwarded (`out` is n x rows).
    unsafe { run(best_build(), &job, lo, hi, out) };
    Ok(())
}

/// The dequantised rows `ids` of `W` (`rows` x `cols` in `raw`), into `out`
/// (`ids.len()` x `cols`): an embedding lookup, bit for bit gguf's values.
pub fn gather_rows(
    qtype: QuantType,
    raw: &[u8],
    rows: usize,
    cols: usize,
    ids: &[i64],
    out: &mut [f32],
) -> CoreResult<()> {
    let rb = check(qtype, raw, rows, cols)?;
    if ids.len().checked_mul(cols) != Some(out.len()) {
        return Err(CoreError::Shape(format!(
            "an output of {} values does not hold {} rows of {cols}",
            out.len(),
            ids.len()
        )));
    }
    let row_of = |id: i64| {
        usize::try_from(id)
            .ok()
            .filter(|&r| r < rows)
            .ok_or(CoreError::TokenOutOfRange {
                token: id,
                vocab: rows,
            })
    };
    // Refuse before writing anything.
    for &id in ids {
        row_of(id)?;
    }
    for (&id, y) in ids.iter().zip(out.chunks_exact_mut(cols)) {
        let r = row_of(id)?;
        dequantize_row(qtype, &raw[r * rb..(r + 1) * rb], y);
    }
    Ok(())
}
