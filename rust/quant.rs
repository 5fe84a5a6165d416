//! GGUF block-quantised weights used in place: rows dequantised into a small
//! buffer one at a time and multiplied at once, so a quantised model runs
//! without ever holding its float32 weights.
//!
//! Formats (ggml's layouts; `d`, `dmin` are float16):
//! - `Q4_0`: 32 values in 18 bytes: `d`, then 16 bytes of 4-bit `q`;
//!   `x = d * (q - 8)`, low nibbles first.
//! - `Q8_0`: 32 values in 34 bytes: `d`, then 32 int8 `q`; `x = d * q`.
//! - `Q4_K`: 256 values in 144 bytes: `d`, `dmin`, 12 bytes of 6-bit scales
//!   and mins for eight sub-blocks of 32, 128 bytes of 4-bit `q`;
//!   `x = d * sc * q - dmin * m`.
//! - `Q6_K`: 256 values in 210 bytes: 128 bytes of low 4 bits, 64 of high 2
//!   bits, 16 int8 scales, `d`; `x = d * sc * (q - 32)`.

use crate::error::{CoreError, CoreResult};
use crate::kv::f16_to_f32;

/// A supported block format, by its ggml type id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QuantType {
    Q4_0,
    Q8_0,
    Q4K,
    Q6K,
}

impl QuantType {
    /// The format of ggml type id `id` (as `gguf.GGMLQuantizationType`).
    pub fn from_ggml(id: u32) -> CoreResult<Self> {
        match id {
            2 => Ok(QuantType::Q4_0),
            8 => Ok(QuantType::Q8_0),
            12 => Ok(QuantType::Q4K),
            14 => Ok(QuantType::Q6K),
            _ => Err(CoreError::option(
                "qtype",
                format!("ggml type {id} is not a supported block format (Q4_0, Q8_0, Q4_K, Q6_K)"),
            )),
        }
    }

    /// Values per block.
    pub fn block_values(self) -> usize {
        match self {
            QuantType::Q4_0 | QuantType::Q8_0 => 32,
            QuantType::Q4K | QuantType::Q6K => 256,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            QuantType::Q4_0 => 18,
            QuantType::Q8_0 => 34,
            QuantType::Q4K => 144,
            QuantType::Q6K => 210,
        }
    }

    /// Bytes of one row of `cols` values, or an error when `cols` is not a
    /// whole number of blocks.
    pub fn row_bytes(self, cols: usize) -> CoreResult<usize> {
        if cols == 0 || !cols.is_multiple_of(self.block_values()) {
            return Err(CoreError::Shape(format!(
                "{cols} columns is not a whole number of {:?} blocks of {}",
                self,
                self.block_values()
            )));
        }
        Ok(cols / self.block_values() * self.block_bytes())
    }
}

#[inline(always)]
fn half(b: &[u8], at: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[at], b[at + 1]]))
}

#[inline(always)]
fn dequantize_q4_0(block: &[u8], out: &mut [f32]) {
    let d = half(block, 0);
    let qs = &block[2..18];
    for j in 0..16 {
        out[j] = d * ((qs[j] & 0x0f) as i32 - 8) as f32;
        out[j + 16] = d * ((qs[j] >> 4) as i32 - 8) as f32;
    }
}

#[inline(always)]
fn dequantize_q8_0(block: &[u8], out: &mut [f32]) {
    let d = half(block, 0);
    for (o, &q) in out.iter_mut().zip(&block[2..34]) {
        *o = d * (q as i8) as f32;
    }
}

/// Scale and min of sub-block `j` from Q4_K's 12 packed bytes.
#[inline(always)]
fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

#[inline(always)]
fn dequantize_q4_k(block: &[u8], out: &mut [f32]) {
    let d = half(block, 0);
    let dmin = half(block, 2);
    let scales = &block[4..16];
    let qs = &block[16..144];
    for (g, (q, y)) in qs
        .chunks_exact(32)
        .zip(out.chunks_exact_mut(64))
        .enumerate()
    {
        let (sc1, m1) = scale_min_k4(2 * g, scales);
        let (sc2, m2) = scale_min_k4(2 * g + 1, scales);
        let (d1, m1) = (d * sc1 as f32, dmin * m1 as f32);
        let (d2, m2) = (d * sc2 as f32, dmin * m2 as f32);
        for l in 0..32 {
            y[l] = d1 * (q[l] & 0x0f) as f32 - m1;
            y[32 + l] = d2 * (q[l] >> 4) as f32 - m2;
        }
    }
}

#[inline(always)]
fn dequantize_q6_k(block: &[u8], out: &mut [f32]) {
    let d = half(block, 208);
    for half_block in 0..2 {
        let ql = &block[64 * half_block..64 * half_block + 64];
        let qh = &block[128 + 32 * half_block..128 + 32 * half_block + 32];
        let sc = &block[192 + 8 * half_block..192 + 8 * half_block + 8];
        let y = &mut out[128 * half_block..128 * half_block + 128];
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 0x0f) | ((qh[l] & 3) << 4)) as i32 - 32;
            let q2 = ((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
            y[l] = d * (sc[is] as i8) as f32 * q1 as f32;
            y[l + 32] = d * (sc[is + 2] as i8) as f32 * q2 as f32;
            y[l + 64] = d * (sc[is + 4] as i8) as f32 * q3 as f32;
            y[l + 96] = d * (sc[is + 6] as i8) as f32 * q4 as f32;
        }
    }
}

/// Dequantise one row (`raw` holds whole blocks) into `out` (as many values
/// as the blocks hold).
#[inline(always)]
pub fn dequantize_row(qtype: QuantType, raw: &[u8], out: &mut [f32]) {
    let (bv, bb) = (qtype.block_values(), qtype.block_bytes());
    for (block, y) in raw.chunks_exact(bb).zip(out.chunks_exact_mut(bv)) {
        match qtype {
            QuantType::Q4_0 => dequantize_q4_0(block, y),
            QuantType::Q8_0 => dequantize_q8_0(block, y),
            QuantType::Q4K => dequantize_q4_k(block, y),
            QuantType::Q6K => dequantize_q6_k(block, y),
        }
    }
}

/// A dot product in 16 independent lanes (vectorises).
#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 16];
    let (ca, cb) = (a.chunks_exact(16), b.chunks_exact(16));
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ca.zip(cb) {
        for i in 0..16 {
            acc[i] += x[i] * y[i];
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// Rows `lo..hi` of a quantised matmul: each row dequantised into `buf`, then
/// dotted with every activation row into `res` (row-major, one row per
/// weight row).
struct Band<'a> {
    qtype: QuantType,
    raw: &'a [u8],
    row_bytes: usize,
    cols: usize,
    x: &'a [f32],
}

impl Band<'_> {
    #[inline(always)]
    fn rows(&self, lo: usize, hi: usize, buf: &mut [f32], res: &mut [f32]) {
        let (rb, n) = (self.row_bytes, self.x.len() / self.cols);
        for r in lo..hi {
            dequantize_row(self.qtype, &self.raw[r * rb..(r + 1) * rb], buf);
            for (t, xt) in self.x.chunks_exact(self.cols).enumerate() {
                res[(r - lo) * n + t] = dot(buf, xt);
            }
        }
    }

    /// [`Band::rows`] in the widest build the CPU runs (AVX-512F, AVX2, or
    /// portable code): the same arithmetic, in more lanes.
    fn run(&self, lo: usize, hi: usize, buf: &mut [f32], res: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                // SAFETY: the CPU supports AVX-512F, checked just above.
                return unsafe { self.rows_avx512(lo, hi, buf, res) };
            }
            if std::arch::is_x86_feature_detected!("avx2") {
                // SAFETY: the CPU supports AVX2, checked just above.
                return unsafe { self.rows_avx2(lo, hi, buf, res) };
            }
        }
        self.rows(lo, hi, buf, res)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn rows_avx2(&self, lo: usize, hi: usize, buf: &mut [f32], res: &mut [f32]) {
        self.rows(lo, hi, buf, res)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx2")]
    unsafe fn rows_avx512(&self, lo: usize, hi: usize, buf: &mut [f32], res: &mut [f32]) {
        self.rows(lo, hi, buf, res)
    }
}

/// Check that `raw` is `rows` rows of `cols` values in `qtype`.
fn check(qtype: QuantType, raw: &[u8], rows: usize, cols: usize) -> CoreResult<usize> {
    let rb = qtype.row_bytes(cols)?;
    if raw.len() != rows * rb {
        return Err(CoreError::Shape(format!(
            "{} bytes of {:?} data do not hold {rows} rows of {cols} values ({rb} bytes a row)",
            raw.len(),
            qtype
        )));
    }
    Ok(rb)
}

/// `x @ W.T` for `W` = `rows` x `cols` quantised rows in `raw` and `x` =
/// `n` x `cols` (row-major), into `out` = `n` x `rows`. Rows are split
/// across rayon's pool when the matrix is big enough to pay for it.
pub fn matmul(
    qtype: QuantType,
    raw: &[u8],
    rows: usize,
    cols: usize,
    x: &[f32],
    out: &mut [f32],
) -> CoreResult<()> {
    let rb = check(qtype, raw, rows, cols)?;
    if !x.len().is_multiple_of(cols) || out.len() != x.len() / cols * rows {
        return Err(CoreError::Shape(format!(
            "activations of {} values and an output of {} values do not fit a {rows} x {cols} weight",
            x.len(),
            out.len()
        )));
    }
    let n = x.len() / cols;
    // Rows of the result are columns of `out`: compute a band of weight rows
    // into a small row-major buffer, then scatter it.
    const BAND: usize = 64;
    let band = |lo: usize, hi: usize, buf: &mut Vec<f32>| -> Vec<f32> {
        let mut res = vec![0.0f32; (hi - lo) * n];
        buf.resize(cols, 0.0);
        let job = Band {
            qtype,
            raw,
            row_bytes: rb,
            cols,
            x,
        };
        job.run(lo, hi, buf, &mut res);
        res
    };
    use rayon::prelude::*;
    let bands: Vec<(usize, Vec<f32>)> = if rows * cols >= 1 << 18 {
        (0..rows.div_ceil(BAND))
            .into_par_iter()
            .map_init(Vec::new, |buf, b| {
                let lo = b * BAND;
                (lo, band(lo, (lo + BAND).min(rows), buf))
            })
            .collect()
    } else {
        let mut buf = Vec::new();
        (0..rows.div_ceil(BAND))
            .map(|b| {
                let lo = b * BAND;
                (lo, band(lo, (lo + BAND).min(rows), &mut buf))
            })
            .collect()
    };
    for (lo, res) in bands {
        let width = res.len() / n.max(1);
        for j in 0..width {
            for t in 0..n {
                out[t * rows + lo + j] = res[j * n + t];
            }
        }
    }
    Ok(())
}

/// The dequantised rows `ids` of `W` (`rows` x `cols` in `raw`), into `out`
/// (`ids.len()` x `cols`).
pub fn gather_rows(
    qtype: QuantType,
    raw: &[u8],
    rows: usize,
    cols: usize,
    ids: &[i64],
    out: &mut [f32],
) -> CoreResult<()> {
    let rb = check(qtype, raw, rows, cols)?;
    if out.len() != ids.len() * cols {
        return Err(CoreError::Shape(format!(
            "an output of {} values does not hold {} rows of {cols}",
            out.len(),
            ids.len()
        )));
    }
    for (&id, y) in ids.iter().zip(out.chunks_exact_mut(cols)) {
        let r =
            usize::try_from(id)
                .ok()
                .filter(|&r| r < rows)
                .ok_or(CoreError::TokenOutOfRange {
                    token: id,
                    vocab: rows,
                })?;
        dequantize_row(qtype, &raw[r * rb..(r + 1) * rb], y);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q8_0_and_q4_0_blocks_decode_by_hand() {
        // d = 0.5 (f16 0x3800).
        let mut b = vec![0x00, 0x38];
        b.extend((0..32).map(|i| (i as i8 - 16) as u8));
        let mut y = vec![0.0; 32];
        dequantize_row(QuantType::Q8_0, &b, &mut y);
        assert_eq!(y[0], -8.0);
        assert_eq!(y[31], 7.5);
        let mut b = vec![0x00, 0x38];
        b.extend((0..16).map(|i| (i as u8) | (15 - i as u8) << 4));
        dequantize_row(QuantType::Q4_0, &b, &mut y);
        assert_eq!((y[0], y[15], y[16], y[31]), (-4.0, 3.5, 3.5, -4.0));
    }

    #[test]
    fn matmul_matches_dequantise_then_multiply() {
        let mut state = 9u64;
        let mut byte = || {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1);
            (state >> 33) as u8
        };
        for qtype in [
            QuantType::Q4_0,
            QuantType::Q8_0,
            QuantType::Q4K,
            QuantType::Q6K,
        ] {
            let (rows, cols, n) = (70, 512, 3);
            let rb = qtype.row_bytes(cols).unwrap();
            let mut raw: Vec<u8> = (0..rows * rb).map(|_| byte()).collect();
            // Keep the float16 scales small and finite.
            for blk in raw.chunks_exact_mut(qtype.block_bytes()) {
                let at = if qtype == QuantType::Q6K { 208 } else { 0 };
                blk[at] = byte();
                blk[at + 1] = 0x20 | (byte() & 0x03);
                if qtype == QuantType::Q4K {
                    blk[2] = byte();
                    blk[3] = 0x20;
                }
            }
            let x: Vec<f32> = (0..n * cols)
                .map(|i| ((i * 37) % 17) as f32 / 8.0 - 1.0)
                .collect();
            let mut w = vec![0.0f32; rows * cols];
            for r in 0..rows {
                dequantize_row(
                    qtype,
                    &raw[r * rb..(r + 1) * rb],
                    &mut w[r * cols..(r + 1) * cols],
                );
            }
            let mut out = vec![0.0f32; n * rows];
            matmul(qtype, &raw, rows, cols, &x, &mut out).unwrap();
            for t in 0..n {
                for r in 0..rows {
                    let want: f64 = (0..cols)
                        .map(|c| w[r * cols + c] as f64 * x[t * cols + c] as f64)
                        .sum();
                    let got = out[t * rows + r] as f64;
                    assert!(
                        (got - want).abs() <= 1e-4 * (1.0 + want.abs()),
                        "{qtype:?} {t} {r}"
                    );
                }
            }
        }
    }

    #[test]
    fn bad_shapes_and_ids_are_errors() {
        let raw = vec![0u8; 34 * 2];
        let mut out = vec![0.0; 32];
        assert!(matmul(QuantType::Q8_0, &raw, 3, 32, &[0.0; 32], &mut [0.0; 3]).is_err());
        assert!(QuantType::Q4K.row_bytes(100).is_err());
        assert_eq!(
            gather_rows(QuantType::Q8_0, &raw, 2, 32, &[2], &mut out),
            Err(CoreError::TokenOutOfRange { token: 2, vocab: 2 })
        );
        assert!(QuantType::from_ggml(99).is_err());
    }
}
