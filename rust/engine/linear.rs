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

/// One activation row, prepared once for products with any number of
/// weights (quantised per activation block size in the fast mode, its group
/// sums per group size), then multiplied row range by row range: what a
/// member of a [`crate::engine::team::Team`] computes of a decode step.
/// Every range gets the bits [`matmul`] gives the same rows.
pub struct RowPrep<'a> {
    mode: Activations,
    x: &'a [f32],
    q8: Vec<quant::q8::QActs>,
    /// `(block or 0 for float activations, group, sums)`.
    sums: Vec<(usize, usize, Vec<f32>)>,
}

impl<'a> RowPrep<'a> {
    /// Prepare `x` (one row) for products in `mode`.
    pub fn new(mode: Activations, x: &'a [f32]) -> Self {
        Self {
            mode,
            x,
            q8: Vec::new(),
            sums: Vec::new(),
        }
    }

    /// Rows `lo..hi` of `x @ W.T` (`W` = `rows` x `cols` stored as `kind` in
    /// `raw`) into `out[lo..hi]`.
    ///
    /// # Safety
    /// `out` points to `rows` writable floats; nobody else reads or writes
    /// `out[lo..hi]` meanwhile.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn rows(
        &mut self,
        kind: Kind,
        raw: &[u8],
        rows: usize,
        cols: usize,
        lo: usize,
        hi: usize,
        out: *mut f32,
    ) -> CoreResult<()> {
        let block = match self.mode {
            Activations::Q8 => quant::q8::act_block(kind),
            Activations::Exact => None,
        };
        let group = if kind.has_offsets() {
            kind.group_values()
        } else {
            0
        };
        let Some(block) = block else {
            let si = self.sums_for(0, group)?;
            let sums = si.map_or(&[][..], |i| &self.sums[i].2);
            // SAFETY: forwarded.
            return unsafe { quant::rows_into(kind, raw, rows, cols, self.x, sums, lo, hi, out) };
        };
        let qi = self.acts_for(block)?;
        let si = self.sums_for(block, group)?;
        let sums = si.map_or(&[][..], |i| &self.sums[i].2);
        let acts = &self.q8[qi];
        // SAFETY: forwarded.
        unsafe { quant::q8::rows_into(kind, raw, rows, acts, sums, lo, hi, out) }
    }

    fn acts_for(&mut self, block: usize) -> CoreResult<usize> {
        if let Some(i) = self.q8.iter().position(|a| a.block == block) {
            return Ok(i);
        }
        self.q8
            .push(quant::q8::quantize(self.x, self.x.len(), block)?);
        Ok(self.q8.len() - 1)
    }

    /// The index of the sums for `(block, group)` (none for `group == 0`).
    fn sums_for(&mut self, block: usize, group: usize) -> CoreResult<Option<usize>> {
        if group == 0 {
            return Ok(None);
        }
        let i = match self.sums.iter().position(|s| s.0 == block && s.1 == group) {
            Some(i) => i,
            None => {
                let sums = if block == 0 {
                    quant::group_sums(self.x, group)
                } else {
                    let qi = self.acts_for(block)?;
                    quant::q8::group_qsums(&self.q8[qi], group)
                };
                self.sums.push((block, group, sums));
                self.sums.len() - 1
            }
        };
        Ok(Some(i))
    }
}
