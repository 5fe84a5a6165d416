//! Products with stored weights: every format goes to `crate::quant`'s
//! kernels (F32/F16/BF16 and the block formats alike).

use crate::quant::{self, QuantType};
use crate::CoreResult;

/// How a weight is stored.
pub type Kind = QuantType;

/// How activations meet the weights.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Activations {
    /// float32 activations times gguf's exact weights (the default).
    #[default]
    Exact,
    /// Activations quantised to 8 bits as llama.cpp does (Q8_0 / Q8_K
    /// blocks), integer dot products (`crate::quant::q8`); float weights
    /// stay exact.
    Q8,
}

impl Activations {
    /// The mode called `name` (`"exact"` or `"q8"`).
    pub fn from_name(name: &str) -> crate::CoreResult<Self> {
        match name {
            "exact" => Ok(Self::Exact),
            "q8" => Ok(Self::Q8),
            _ => Err(crate::CoreError::option(
                "activations",
                format!("must be \"exact\" or \"q8\", got {name:?}"),
            )),
        }
    }

    /// The mode's name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Exact => "exact",
            Self::Q8 => "q8",
        }
    }
}

/// `x @ W.T` for `W` = `rows` x `cols` stored as `kind` in `raw`, `x` =
/// `n` x `cols`, into `out` = `n` x `rows`, with activations as `mode` says.
pub fn matmul(
    mode: Activations,
    kind: Kind,
    raw: &[u8],
    rows: usize,
    cols: usize,
    x: &[f32],
    out: &mut [f32],
) -> CoreResult<()> {
    match mode {
        Activations::Exact => quant::matmul(kind, raw, rows, cols, x, out),
        Activations::Q8 => quant::q8::matmul(kind, raw, rows, cols, x, out),
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
    quant::gather_rows(kind, raw, rows, cols, ids, out)
}
