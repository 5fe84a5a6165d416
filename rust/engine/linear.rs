//! Products with stored weights: every block format goes to
//! `crate::quant`'s kernels; the plain float formats have a portable path
//! here until `crate::quant` covers them (`Kind::from_ggml` prefers the
//! kernels whenever they know the type).

use rayon::prelude::*;

use crate::kv::f16_to_f32;
use crate::quant::{self, QuantType};
use crate::{CoreError, CoreResult};

/// Plain float storage formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Float {
    F32,
    F16,
    BF16,
}

/// How a weight is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A format `crate::quant` multiplies.
    Quant(QuantType),
    /// A float format multiplied here.
    Float(Float),
}

impl Kind {
    /// The storage of ggml type id `id`.
    pub fn from_ggml(id: u32) -> CoreResult<Self> {
        if let Ok(q) = QuantType::from_ggml(id) {
            return Ok(Kind::Quant(q));
        }
        match id {
            0 => Ok(Kind::Float(Float::F32)),
            1 => Ok(Kind::Float(Float::F16)),
            30 => Ok(Kind::Float(Float::BF16)),
            _ => Err(CoreError::option(
                "ggml_type",
                format!("ggml type {id} has no kernel"),
            )),
        }
    }

    /// float32 storage (what tensors dequantised at load are).
    pub fn f32() -> Self {
        Kind::from_ggml(0).expect("F32 is always supported")
    }

    /// Bytes of a row of `cols` values.
    pub fn row_bytes(self, cols: usize) -> CoreResult<usize> {
        match self {
            Kind::Quant(q) => q.row_bytes(cols),
            Kind::Float(Float::F32) => Ok(4 * cols),
            Kind::Float(_) => Ok(2 * cols),
        }
    }
}

#[inline(always)]
fn widen(kind: Float, raw: &[u8], out: &mut [f32]) {
    match kind {
        Float::F32 => {
            for (o, b) in out.iter_mut().zip(raw.chunks_exact(4)) {
                *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        Float::F16 => {
            for (o, b) in out.iter_mut().zip(raw.chunks_exact(2)) {
                *o = f16_to_f32(u16::from_le_bytes([b[0], b[1]]));
            }
        }
        Float::BF16 => {
            for (o, b) in out.iter_mut().zip(raw.chunks_exact(2)) {
                *o = f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16);
            }
        }
    }
}

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

fn float_matmul(kind: Float, raw: &[u8], rows: usize, cols: usize, x: &[f32], out: &mut [f32]) {
    let n = x.len() / cols;
    let rb = raw.len() / rows.max(1);
    const BAND: usize = 16;
    let bands: Vec<(usize, Vec<f32>)> = (0..rows.div_ceil(BAND))
        .into_par_iter()
        .map_init(
            || vec![0.0f32; cols],
            |buf, b| {
                let lo = b * BAND;
                let hi = (lo + BAND).min(rows);
                let mut res = vec![0.0f32; (hi - lo) * n];
                for r in lo..hi {
                    widen(kind, &raw[r * rb..(r + 1) * rb], buf);
                    for (t, xt) in x.chunks_exact(cols).enumerate() {
                        res[(r - lo) * n + t] = dot(buf, xt);
                    }
                }
                (lo, res)
            },
        )
        .collect();
    for (lo, res) in bands {
        for (j, row) in res.chunks_exact(n).enumerate() {
            for (t, &v) in row.iter().enumerate() {
                out[t * rows + lo + j] = v;
            }
        }
    }
}

/// `x @ W.T` for `W` = `rows` x `cols` stored as `kind` in `raw`, `x` =
/// `n` x `cols`, into `out` = `n` x `rows`.
pub fn matmul(
    kind: Kind,
    raw: &[u8],
    rows: usize,
    cols: usize,
    x: &[f32],
    out: &mut [f32],
) -> CoreResult<()> {
    match kind {
        Kind::Quant(q) => quant::matmul(q, raw, rows, cols, x, out),
        Kind::Float(f) => {
            let rb = kind.row_bytes(cols)?;
            if raw.len() != rows * rb
                || !x.len().is_multiple_of(cols)
                || out.len() != x.len() / cols * rows
            {
                return Err(CoreError::Shape(format!(
                    "a {rows} x {cols} {f:?} weight of {} bytes does not fit activations of {} \
                     and an output of {} values",
                    raw.len(),
                    x.len(),
                    out.len()
                )));
            }
            float_matmul(f, raw, rows, cols, x, out);
            Ok(())
        }
    }
}

/// Rows `ids` of `W` as float32 into `out` (`ids.len()` x `cols`).
pub fn gather(
    kind: Kind,
    raw: &[u8],
    rows: usize,
    cols: usize,
    ids: &[i64],
    out: &mut [f32],
) -> CoreResult<()> {
    match kind {
        Kind::Quant(q) => quant::gather_rows(q, raw, rows, cols, ids, out),
        Kind::Float(f) => {
            let rb = kind.row_bytes(cols)?;
            if raw.len() != rows * rb || out.len() != ids.len() * cols {
                return Err(CoreError::Shape(format!(
                    "cannot gather {} rows of {cols} from a {rows}-row weight",
                    ids.len()
                )));
            }
            for (&id, y) in ids.iter().zip(out.chunks_exact_mut(cols)) {
                let r = usize::try_from(id).ok().filter(|&r| r < rows).ok_or(
                    CoreError::TokenOutOfRange {
                        token: id,
                        vocab: rows,
                    },
                )?;
                widen(f, &raw[r * rb..(r + 1) * rb], y);
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float_kinds_multiply_like_their_widened_values() {
        let (rows, cols) = (37, 20);
        let w: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 7) % 13) as f32 - 6.0)
            .collect();
        let x: Vec<f32> = (0..2 * cols).map(|i| (i % 5) as f32 * 0.25).collect();
        let mut want = vec![0.0f32; 2 * rows];
        for t in 0..2 {
            for r in 0..rows {
                want[t * rows + r] = (0..cols).map(|c| w[r * cols + c] * x[t * cols + c]).sum();
            }
        }
        let f32_raw: Vec<u8> = w.iter().flat_map(|v| v.to_le_bytes()).collect();
        let bf16_raw: Vec<u8> = w
            .iter()
            .flat_map(|v| ((v.to_bits() >> 16) as u16).to_le_bytes())
            .collect();
        let f16_raw: Vec<u8> = w
            .iter()
            .flat_map(|&v| crate::kv::f32_to_f16(v).to_le_bytes())
            .collect();
        for (kind, raw) in [
            (Kind::Float(Float::F32), f32_raw),
            (Kind::Float(Float::BF16), bf16_raw),
            (Kind::Float(Float::F16), f16_raw),
        ] {
            let mut out = vec![0.0f32; 2 * rows];
            matmul(kind, &raw, rows, cols, &x, &mut out).unwrap();
            assert_eq!(out, want, "{kind:?}");
            let mut row = vec![0.0f32; cols];
            gather(kind, &raw, rows, cols, &[5], &mut row).unwrap();
            assert_eq!(row, w[5 * cols..6 * cols]);
            assert!(gather(kind, &raw, rows, cols, &[rows as i64], &mut row).is_err());
        }
    }
}
