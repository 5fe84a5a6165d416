//! Products with stored weights: every format goes to `crate::quant`'s
//! kernels (F32/F16/BF16 and the block formats alike).

use crate::quant::{self, QuantType};
use crate::CoreResult;

/// How a weight is stored.
pub type Kind = QuantType;

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
    quant::matmul(kind, raw, rows, cols, x, out)
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
    quant::gather_rows(kind, raw, rows, cols, ids, out)
}
