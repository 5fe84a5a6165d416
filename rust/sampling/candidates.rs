//! The sparse candidate set the stages pass along, and the working state of
//! one sampling call: either the whole row (dense, not yet gathered) or the
//! surviving candidates (sparse).

use std::cmp::Ordering;

use super::dense::{self, Gathered};
use crate::error::{CoreError, CoreResult};

/// One surviving token and its current logit (never NaN, never `-inf`).
/// `repr(C)`: the AVX-512 gather writes `(id, logit)` pairs directly.
#[derive(Clone, Copy, Debug, PartialEq)]
#[repr(C)]
pub struct Cand {
    pub id: u32,
    pub logit: f32,
}

/// What is known about the order of a candidate list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    /// Ascending token id.
    Id,
    /// Descending logit, ties by ascending id.
    Desc,
    /// No particular order.
    Any,
}

/// Descending logit, then ascending id: the one ranking every stage uses.
///
/// `-0.0` and `+0.0` are equal here, as in the argmax (`>`), so a tie between
/// them goes to the lower id on every path (`+ 0.0` turns `-0.0` into `+0.0`;
/// logits are never NaN).
#[inline]
pub fn by_rank(a: &Cand, b: &Cand) -> Ordering {
    (b.logit + 0.0)
        .total_cmp(&(a.logit + 0.0))
        .then(a.id.cmp(&b.id))
}

/// Restore rank order (see [`by_rank`]) in candidates whose logits are still
/// non-increasing but were scaled after they were ranked: a multiplication
/// can round two neighbouring logits to one value (or both to +inf), and a
/// tie ranks by id. Only runs of equal logits move; O(n) when there are none.
pub fn reorder_ties(cands: &mut [Cand]) {
    let mut start = 0;
    while start < cands.len() {
        let key = cands[start].logit + 0.0;
        let mut end = start + 1;
        while end < cands.len() && cands[end].logit + 0.0 == key {
            end += 1;
        }
        if end - start > 1 {
            cands[start..end].sort_unstable_by_key(|c| c.id);
        }
        start = end;
    }
}

/// The row before any truncation: every finite entry is a candidate with
/// logit `row[i] * scale` (a temperature is applied lazily through `scale`).
#[derive(Debug)]
pub struct Dense<'a> {
    pub row: RowRef<'a>,
    pub scale: f32,
    /// Largest raw value of `row` (finite).
    pub max: f32,
    /// First position holding `max`.
    pub argmax: usize,
    /// `max` may be out of date after an edit lowered it.
    pub stale: bool,
}

/// `l + d` for a logit edit: a finite result never overflows to `+-inf`
/// (it saturates at the float32 range), so only a `-inf` bias or a `-inf`
/// logit bans a token, and no edit makes a `+inf` logit.
#[inline]
pub fn edit_add(l: f32, d: f32) -> f32 {
    let v = l + d;
    if v.is_infinite() && l.is_finite() && d.is_finite() {
        v.clamp(f32::MIN, f32::MAX)
    } else {
        v
    }
}

/// In-place edits of a dense row that keep its maximum up to date.
pub struct Patcher<'w> {
    row: &'w mut [f32],
    /// The row's pending scale: edits are made on `raw * scale`.
    pub scale: f32,
    max: &'w mut f32,
    argmax: &'w mut usize,
    stale: &'w mut bool,
}

impl Patcher<'_> {
    /// The current (scaled) logit of token `t`.
    #[inline]
    pub fn get(&self, t: usize) -> f32 {
        self.row[t] * self.scale
    }

    /// Set token `t`'s scaled logit to `v`.
    #[inline]
    pub fn set(&mut self, t: usize, v: f32) {
        let raw = v / self.scale;
        let old = self.row[t];
        self.row[t] = raw;
        if t == *self.argmax {
            if raw < old {
                *self.stale = true;
            } else {
                *self.max = raw;
            }
        } else if raw > *self.max || (raw == *self.max && t < *self.argmax) {
            *self.max = raw;
            *self.argmax = t;
        }
    }
}

/// The dense row: the caller's borrowed logits, or a patched copy.
#[derive(Debug)]
pub enum RowRef<'a> {
    Borrowed(&'a [f32]),
    Owned(Vec<f32>),
}

impl RowRef<'_> {
    pub fn as_slice(&self) -> &[f32] {
        match self {
            RowRef::Borrowed(s) => s,
            RowRef::Owned(v) => v,
        }
    }
}

/// The reusable buffers a [`Work`] hands back at the end of a call.
pub struct Buffers {
    pub cands: Vec<Cand>,
    pub row: Option<Vec<f32>>,
    pub cands2: Vec<Cand>,
    pub floats: Vec<f32>,
    pub gathered: Gathered,
}

/// The state one sampling call threads through the stages.
#[derive(Debug)]
pub struct Work<'a> {
    /// `Some` until the first stage that has to gather candidates.
    pub dense: Option<Dense<'a>>,
    /// The candidates once `dense` is `None`.
    pub cands: Vec<Cand>,
    pub order: Order,
    /// A patched row copy no longer in use, handed back to the scratch.
    pub spare_row: Option<Vec<f32>>,
    /// A second candidate buffer for stages that need a working copy.
    pub spare_cands: Vec<Cand>,
    /// A float buffer for stages that need one.
    pub spare_f32: Vec<f32>,
    /// A two-array candidate buffer for whole-row gathers.
    pub spare_gathered: Gathered,
}

impl<'a> Work<'a> {
    /// Start from a whole row whose first maximum `max` (finite) is at `argmax`.
    pub fn from_row(row: RowRef<'a>, argmax: usize, max: f32, cands: Vec<Cand>) -> Self {
        Work {
            dense: Some(Dense {
                row,
                scale: 1.0,
                max,
                argmax,
                stale: false,
            }),
            cands,
            order: Order::Id,
            spare_row: None,
            spare_cands: Vec::new(),
            spare_f32: Vec::new(),
            spare_gathered: Gathered::default(),
        }
    }

    /// Gather every finite entry of a dense row into the candidate list (id order).
    pub fn materialize(&mut self) {
        if let Some(d) = &self.dense {
            self.cands.clear();
            dense::gather_ge(d.row.as_slice(), d.scale, f32::MIN, &mut self.cands);
            self.order = Order::Id;
            self.release_dense();
        }
    }

    /// Drop the dense row once `cands` holds the set (a patched copy goes
    /// back to the spare slot for reuse).
    pub fn release_dense(&mut self) {
        if let Some(Dense {
            row: RowRef::Owned(v),
            ..
        }) = self.dense.take()
        {
            self.spare_row = Some(v);
        }
    }

    /// In-place edits of the dense row (the caller's row is copied first).
    /// `None` once the work is sparse.
    ///
    /// A pending scale (an edit after the temperature, in a custom order) is
    /// applied to the copy first, so that edits work on the values the
    /// stages see and never divide by a tiny scale.
    pub fn patcher(&mut self) -> Option<Patcher<'_>> {
        let d = self.dense.as_mut()?;
        if let RowRef::Borrowed(src) = d.row {
            let mut v = self.spare_row.take().unwrap_or_default();
            v.clear();
            v.extend_from_slice(src);
            d.row = RowRef::Owned(v);
        }
        if d.scale != 1.0 {
            if let RowRef::Owned(v) = &mut d.row {
                for x in v.iter_mut() {
                    *x *= d.scale;
                }
            }
            d.max *= d.scale;
            d.scale = 1.0;
            // Distinct values may round together: find the first maximum again.
            d.stale = true;
        }
        match &mut d.row {
            RowRef::Owned(v) => Some(Patcher {
                row: v.as_mut_slice(),
                scale: d.scale,
                max: &mut d.max,
                argmax: &mut d.argmax,
                stale: &mut d.stale,
            }),
            RowRef::Borrowed(_) => None,
        }
    }

    /// Re-establish the invariants after logits were edited: sparse `-inf`
    /// entries are dropped (an error when nothing is left). A dense row is
    /// left for [`Work::refresh`].
    pub fn after_edit(&mut self) -> CoreResult<()> {
        if self.dense.is_some() {
            return Ok(());
        }
        self.cands.retain(|c| c.logit > f32::NEG_INFINITY);
        if self.cands.is_empty() {
            return Err(CoreError::AllBanned);
        }
        if self.order == Order::Desc {
            self.order = Order::Any;
        }
        Ok(())
    }

    /// Bring a dense row's maximum up to date after edits lowered it; errors
    /// when every entry is now `-inf`.
    pub fn refresh(&mut self) -> CoreResult<()> {
        if let Some(d) = &mut self.dense {
            if d.stale {
                let (argmax, max, _) = dense::argmax_nan(d.row.as_slice());
                if max == f32::NEG_INFINITY {
                    return Err(CoreError::AllBanned);
                }
                d.max = max;
                d.argmax = argmax;
                d.stale = false;
            }
        }
        Ok(())
    }

    /// Hand the reusable buffers back.
    pub fn into_buffers(mut self) -> Buffers {
        self.release_dense();
        Buffers {
            cands: self.cands,
            row: self.spare_row,
            cands2: self.spare_cands,
            floats: self.spare_f32,
            gathered: self.spare_gathered,
        }
    }

    /// Sort the candidates by rank (descending logit, ties by id).
    pub fn sort_desc(&mut self) {
        self.materialize();
        if self.order != Order::Desc {
            self.cands.sort_unstable_by(by_rank);
            self.order = Order::Desc;
        }
    }

    /// Sort the candidates by ascending id.
    pub fn sort_id(&mut self) {
        self.materialize();
        if self.order != Order::Id {
            self.cands.sort_unstable_by_key(|c| c.id);
            self.order = Order::Id;
        }
    }

    /// Replace the set by one candidate.
    pub fn set_single(&mut self, c: Cand) {
        self.materialize();
        self.cands.clear();
        self.cands.push(c);
        self.order = Order::Desc;
    }

    /// Keep only the `k` best-ranked candidates (fewer if there are fewer);
    /// with `keep_ties`, also every candidate tied with the k-th.
    pub fn top_k(&mut self, k: usize, keep_ties: bool, delta: &mut f32) {
        let k = k.max(1);
        if let Some(d) = &self.dense {
            dense::top_k(
                d.row.as_slice(),
                d.scale,
                d.max,
                k,
                keep_ties,
                delta,
                &mut self.cands,
            );
            self.order = Order::Desc;
            self.release_dense();
            return;
        }
        top_k_sparse(&mut self.cands, k, keep_ties);
        self.order = Order::Desc;
    }

    /// Largest current logit (candidates are never empty).
    pub fn max_logit(&self) -> f32 {
        match &self.dense {
            Some(d) => d.max * d.scale,
            None => {
                self.cands.iter().fold(
                    f32::NEG_INFINITY,
                    |m, c| if c.logit > m { c.logit } else { m },
                )
            }
        }
    }

    /// The best-ranked candidate (largest logit, lowest id on ties).
    pub fn best(&self) -> Cand {
        match &self.dense {
            Some(d) => Cand {
                id: d.argmax as u32,
                logit: d.max * d.scale,
            },
            None => {
                let mut best = self.cands[0];
                for c in &self.cands[1..] {
                    if by_rank(c, &best) == Ordering::Less {
                        best = *c;
                    }
                }
                best
            }
        }
    }
}

/// Keep the `k` best-ranked entries of `cands`, sorted by rank.
pub fn top_k_sparse(cands: &mut Vec<Cand>, k: usize, keep_ties: bool) {
    if cands.len() > k {
        cands.select_nth_unstable_by(k - 1, by_rank);
        let kth = cands[k - 1].logit;
        let mut n = k;
        if keep_ties {
            for i in k..cands.len() {
                if cands[i].logit == kth {
                    cands.swap(n, i);
                    n += 1;
                }
            }
        }
        cands.truncate(n);
    }
    cands.sort_unstable_by(by_rank);
}

/// Softmax of the candidates' logits in f64, in list order, into `out`.
/// Returns the log of the normaliser relative to the max (`ln S`) and the max.
pub fn softmax(cands: &[Cand], out: &mut Vec<f64>) -> (f64, f64) {
    let max = cands.iter().fold(
        f32::NEG_INFINITY,
        |m, c| if c.logit > m { c.logit } else { m },
    ) as f64;
    out.clear();
    let mut sum = 0.0f64;
    for c in cands {
        let e = (c.logit as f64 - max).exp();
        out.push(e);
        sum += e;
    }
    for p in out.iter_mut() {
        *p /= sum;
    }
    (sum.ln(), max)
}
