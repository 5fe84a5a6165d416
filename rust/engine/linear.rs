//! Products with stored weights: every format goes to `crate::quant`'s
//! kernels (F32/F16/BF16 and the block formats alike).

use crate::quant::{self, QuantType};
use crate::{CoreError, CoreResult};

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

/// One of several products with the same activations ([`matmul_many`]):
/// `W` = `rows` x `cols` stored as `kind` in `raw`, into `out` (`n` x `rows`).
pub struct Part<'a> {
    pub kind: Kind,
    pub raw: &'a [u8],
    pub rows: usize,
    pub cols: usize,
    pub out: &'a mut [f32],
}

/// `x @ W.T` for every part (as [`matmul`] each, the same bits), the weight
/// rows of all of them split in chunks over the current rayon pool as **one**
/// parallel loop: q, k and v of a block, or gate and up, cost one hand-off
/// to the pool's threads instead of one each (a hand-off wakes a thread,
/// tens of microseconds on a virtual machine).
pub fn matmul_many(mode: Activations, x: &[f32], parts: &mut [Part<'_>]) -> CoreResult<()> {
    let mut each: Vec<(usize, &mut Part<'_>)> = parts.iter_mut().map(|p| (0, p)).collect();
    matmul_each(mode, &[x], &mut each)
}

/// [`matmul_many`] with activations of their own: part `(i, p)` is
/// `xs[i] @ p.W.T` (the same bits as [`matmul`]), every activation set
/// prepared once for all parts that share it, all parts' weight rows one
/// parallel loop (a mixture's experts, each over the rows that picked it).
pub fn matmul_each(
    mode: Activations,
    xs: &[&[f32]],
    parts: &mut [(usize, &mut Part<'_>)],
) -> CoreResult<()> {
    use rayon::prelude::*;
    let mut preps: Vec<RowPrep<'_>> = xs.iter().map(|x| RowPrep::new(mode, x)).collect();
    let mut work = 0usize;
    let mut total = 0usize;
    for (i, p) in parts.iter() {
        let (prep, x) = match (preps.get_mut(*i), xs.get(*i)) {
            (Some(prep), Some(x)) => (prep, *x),
            _ => {
                return Err(CoreError::Shape(format!(
                    "a product names activation set #{i} of {}",
                    xs.len()
                )))
            }
        };
        let n = x.len().checked_div(p.cols).unwrap_or(0);
        if p.cols == 0 || n * p.cols != x.len() || n.checked_mul(p.rows) != Some(p.out.len()) {
            return Err(CoreError::Shape(format!(
                "activations of {} values and an output of {} values do not fit a {} x {} weight",
                x.len(),
                p.out.len(),
                p.rows,
                p.cols
            )));
        }
        prep.prepare(p.kind, p.cols)?;
        work = work.saturating_add(p.raw.len().saturating_mul(n.div_ceil(8)));
        if n > 0 {
            total += p.rows;
        }
    }
    if total == 0 {
        return Ok(());
    }
    let preps = &preps;
    let threads = rayon::current_num_threads();
    if threads <= 1 || work < quant::PARALLEL_BYTES {
        for (i, p) in parts.iter_mut() {
            if xs[*i].is_empty() {
                continue;
            }
            // SAFETY: `out` is n x rows, borrowed mutably here.
            unsafe {
                preps[*i].rows_ready(
                    p.kind,
                    p.raw,
                    p.rows,
                    p.cols,
                    0,
                    p.rows,
                    p.out.as_mut_ptr(),
                )?
            };
        }
        return Ok(());
    }
    // Chunks of about the same number of weight rows, a multiple of 4 (the
    // kernels' band), none across two parts.
    let per = total
        .div_ceil(threads * quant::CHUNKS_PER_THREAD)
        .next_multiple_of(4);
    let mut chunks = Vec::new();
    for (j, (i, p)) in parts.iter().enumerate() {
        if xs[*i].is_empty() {
            continue;
        }
        let mut lo = 0;
        while lo < p.rows {
            let hi = (lo + per).min(p.rows);
            chunks.push((j, lo, hi));
            lo = hi;
        }
    }
    let targets: Vec<Target<'_>> = parts
        .iter_mut()
        .map(|(i, p)| Target {
            prep: *i,
            out: SharedOut(p.out.as_mut_ptr()),
            kind: p.kind,
            raw: p.raw,
            rows: p.rows,
            cols: p.cols,
        })
        .collect();
    chunks.par_iter().try_for_each(|&(j, lo, hi)| {
        let t = &targets[j];
        // SAFETY: part j's out is n x rows; chunks of a part cover disjoint
        // row ranges, so they write disjoint elements.
        unsafe { preps[t.prep].rows_ready(t.kind, t.raw, t.rows, t.cols, lo, hi, t.out.get()) }
    })
}

/// What the chunks of [`matmul_each`] need of a part, its output as a
/// pointer they share.
struct Target<'a> {
    prep: usize,
    out: SharedOut,
    kind: Kind,
    raw: &'a [u8],
    rows: usize,
    cols: usize,
}

/// An output the chunks of [`matmul_many`] share; each writes its own
/// elements only.
#[derive(Clone, Copy)]
struct SharedOut(*mut f32);

impl SharedOut {
    /// The pointer (a method, so closures capture the whole `Sync` wrapper).
    fn get(self) -> *mut f32 {
        self.0
    }
}

// SAFETY: chunks write disjoint elements (see `matmul_many`).
unsafe impl Send for SharedOut {}
// SAFETY: as above.
unsafe impl Sync for SharedOut {}

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

/// Activation rows (one, for a decode step; several, for a batch),
/// prepared once for products with any number of weights (quantised per
/// activation block size in the fast mode, their group sums per group
/// size), then multiplied row range by row range: what a member of a
/// [`crate::engine::team::Team`] computes of a step. Every range gets the
/// bits [`matmul`] gives the same rows.
pub struct RowPrep<'a> {
    mode: Activations,
    x: &'a [f32],
    q8: Vec<quant::q8::QActs>,
    /// `(block or 0 for float activations, group, sums)`.
    sums: Vec<(usize, usize, Vec<f32>)>,
}

impl<'a> RowPrep<'a> {
    /// Prepare `x` (whole rows) for products in `mode`.
    pub fn new(mode: Activations, x: &'a [f32]) -> Self {
        Self {
            mode,
            x,
            q8: Vec::new(),
            sums: Vec::new(),
        }
    }

    /// The activation block and weight group of products with `kind`.
    fn keys(&self, kind: Kind) -> (Option<usize>, usize) {
        let block = match self.mode {
            Activations::Q8 => quant::q8::act_block(kind),
            Activations::Exact => None,
        };
        let group = if kind.has_offsets() {
            kind.group_values()
        } else {
            0
        };
        (block, group)
    }

    /// Compute what products with `kind` weights of `cols` columns need
    /// (then [`RowPrep::rows_ready`] takes `&self`, so team members can
    /// share one preparation).
    pub fn prepare(&mut self, kind: Kind, cols: usize) -> CoreResult<()> {
        let (block, group) = self.keys(kind);
        if let Some(block) = block {
            self.acts_for(block, cols)?;
        }
        self.sums_for(block.unwrap_or(0), group, cols)?;
        Ok(())
    }

    /// Rows `lo..hi` of `x @ W.T` (`W` = `rows` x `cols` stored as `kind` in
    /// `raw`) into columns `lo..hi` of `out` (`n` x `rows` for `n` rows of `x`).
    ///
    /// # Safety
    /// `out` points to `n * rows` writable floats; nobody else reads or
    /// writes columns `lo..hi` of it meanwhile.
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
        self.prepare(kind, cols)?;
        // SAFETY: forwarded.
        unsafe { self.rows_ready(kind, raw, rows, cols, lo, hi, out) }
    }

    /// [`RowPrep::rows`] after [`RowPrep::prepare`]`(kind, cols)`.
    ///
    /// # Safety
    /// As [`RowPrep::rows`].
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn rows_ready(
        &self,
        kind: Kind,
        raw: &[u8],
        rows: usize,
        cols: usize,
        lo: usize,
        hi: usize,
        out: *mut f32,
    ) -> CoreResult<()> {
        let (block, group) = self.keys(kind);
        let unprepared = || {
            crate::CoreError::Internal(format!(
                "activations not prepared for {} weights of {cols} columns",
                kind.name()
            ))
        };
        let sums = if group == 0 {
            &[][..]
        } else {
            let b = block.unwrap_or(0);
            &self
                .sums
                .iter()
                .find(|s| s.0 == b && s.1 == group)
                .ok_or_else(unprepared)?
                .2
        };
        let Some(block) = block else {
            // SAFETY: forwarded.
            return unsafe { quant::rows_into(kind, raw, rows, cols, self.x, sums, lo, hi, out) };
        };
        let acts = self
            .q8
            .iter()
            .find(|a| a.block == block && a.cols == cols)
            .ok_or_else(unprepared)?;
        // SAFETY: forwarded.
        unsafe { quant::q8::rows_into(kind, raw, rows, acts, sums, lo, hi, out) }
    }

    fn acts_for(&mut self, block: usize, cols: usize) -> CoreResult<usize> {
        if let Some(i) = self
            .q8
            .iter()
            .position(|a| a.block == block && a.cols == cols)
        {
            return Ok(i);
        }
        self.q8.push(quant::q8::quantize(self.x, cols, block)?);
        Ok(self.q8.len() - 1)
    }

    /// The sums for `(block, group)` are ready (none for `group == 0`).
    fn sums_for(&mut self, block: usize, group: usize, cols: usize) -> CoreResult<()> {
        if group == 0 || self.sums.iter().any(|s| s.0 == block && s.1 == group) {
            return Ok(());
        }
        let sums = if block == 0 {
            quant::group_sums(self.x, group)
        } else {
            let qi = self.acts_for(block, cols)?;
            quant::q8::group_qsums(&self.q8[qi], group)
        };
        self.sums.push((block, group, sums));
        Ok(())
    }
}
