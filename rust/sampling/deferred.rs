//! Deferred edits: logit bias, penalties and DRY applied to the candidates
//! of the top-k that follows them, instead of to a copy of the whole row.
//!
//! When every edit before a top-k can only lower logits (non-positive biases,
//! repetition penalty >= 1, non-negative frequency and presence penalties,
//! DRY), the top-k of the edited row is found exactly from the raw row: gather
//! the raw entries at or above a threshold, edit those alone, and check that at
//! least `k` of them are still at or above it. Every entry left out was below
//! the threshold before its edit and can only be lower after it, so it cannot
//! reach the top k. Too few survivors widen the threshold, as the dense top-k
//! does. The result is the same candidate list, bit for bit, as editing a copy
//! and then taking the top-k, with no copy and no pass over the window to patch
//! it.

use super::candidates::{edit_add, top_k_sparse, Cand};
use super::dense;
use super::dry::Dry;
use super::knobs::Knobs;
use super::order::Stage;
use super::penalties::Penalties;
use super::window_counts::WindowCounts;
use crate::error::{CoreError, CoreResult};

/// Where a chain can defer its edits: which leading stages are edits, whether
/// a plain temperature sits between them and the top-k, and where the
/// remaining stages resume.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    pub edits: Vec<Stage>,
    pub temperature: bool,
    pub resume: usize,
}

impl Plan {
    /// The plan for a chain's enabled stages, or `None` when its leading
    /// edits could raise a logit or no top-k follows them.
    pub fn for_chain(stages: &[Stage], knobs: &Knobs) -> Option<Plan> {
        let mut i = 0;
        while let Some(&s) = stages.get(i) {
            let lowers = match s {
                Stage::LogitBias => knobs.logit_bias.iter().all(|&(_, b)| b <= 0.0),
                Stage::Penalties => {
                    knobs.repetition_penalty >= 1.0
                        && knobs.frequency_penalty >= 0.0
                        && knobs.presence_penalty >= 0.0
                }
                Stage::Dry => knobs.dry_multiplier > 0.0 && knobs.dry_base >= 1.0,
                _ => break,
            };
            if !lowers {
                return None;
            }
            i += 1;
        }
        if i == 0 {
            return None;
        }
        let edits = stages[..i].to_vec();
        let temperature = stages.get(i) == Some(&Stage::Temperature);
        if temperature {
            if knobs.dynamic_temp.is_some() || knobs.temperature <= 0.0 {
                return None;
            }
            i += 1;
        }
        (stages.get(i) == Some(&Stage::TopK) && knobs.top_k > 0).then_some(Plan {
            edits,
            temperature,
            resume: i + 1,
        })
    }
}

/// The edits of one sampling call, applied to single tokens.
pub struct Edits<'a> {
    pub stages: &'a [Stage],
    /// Sorted by token.
    pub bias: &'a [(u32, f32)],
    pub penalties: &'a Penalties,
    /// Counts of the penalty window.
    pub counts: &'a WindowCounts,
    pub dry: &'a Dry,
    /// DRY's `(token, repeat length)`, sorted by token.
    pub dry_lengths: &'a [(u32, usize)],
}

impl Edits<'_> {
    /// Token `id`'s logit after the edits, from its raw value `l`; the same
    /// arithmetic, in the same order, as the stages applied to a whole row.
    #[inline]
    pub fn apply(&self, id: u32, mut l: f32) -> f32 {
        for s in self.stages {
            match s {
                Stage::LogitBias => {
                    if let Ok(i) = self.bias.binary_search_by_key(&id, |&(t, _)| t) {
                        l = edit_add(l, self.bias[i].1);
                    }
                }
                Stage::Penalties => l = self.penalties.penalize(l, self.counts.count(id)),
                Stage::Dry => {
                    if let Ok(i) = self.dry_lengths.binary_search_by_key(&id, |&(t, _)| t) {
                        l = edit_add(l, -self.dry.penalty(self.dry_lengths[i].1));
                    }
                }
                _ => {}
            }
        }
        l
    }
}

/// The `k` best-ranked entries of the edited `row` (raw maximum `max`), in
/// rank order, into `out`: [`dense::gather_top`] with the edits applied to
/// each batch it gathers. `delta` is the starting width the dense top-k also
/// keeps. Errors when the edits ban every token.
pub fn top_k(
    row: &[f32],
    max: f32,
    k: usize,
    keep_ties: bool,
    delta: &mut f32,
    edits: &Edits<'_>,
    out: &mut Vec<Cand>,
) -> CoreResult<()> {
    let k = k.max(1);
    if !(delta.is_finite() && *delta > 0.0) {
        *delta = 8.0;
    }
    let edit = |batch: &mut [Cand]| {
        for c in batch {
            c.logit = edits.apply(c.id, c.logit);
        }
    };
    let cap = k.saturating_mul(4).max(256);
    let start = if k.saturating_mul(4) >= row.len() {
        f32::MIN
    } else {
        max - *delta
    };
    out.clear();
    let thr = dense::gather_top(row, start, k, cap, &edit, out);
    // Without a cut, the start must have let k edited entries through.
    let above = out.iter().filter(|c| c.logit >= thr).count();
    if above < k && thr > f32::MIN {
        // Too narrow (the edits pushed top tokens below it): from the bottom.
        out.clear();
        dense::gather_top(row, f32::MIN, k, cap, &edit, out);
    }
    out.retain(|c| c.logit > f32::NEG_INFINITY);
    if out.is_empty() {
        return Err(CoreError::AllBanned);
    }
    top_k_sparse(out, k, keep_ties);
    // Next time start a little below this row's k-th.
    if let Some(kth) = out.get(k - 1).or(out.last()) {
        let want = (max - kth.logit) + 2.0;
        *delta = if want.is_finite() { want.max(1.0) } else { 8.0 };
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::candidates::{RowRef, Work};
    use crate::sampling::logit_bias;

    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self
                .0
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            self.0 >> 33
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
    }

    /// The top-k of a patched copy: what the chain computes without deferral.
    #[allow(clippy::too_many_arguments)]
    fn by_copy(
        row: &[f32],
        k: usize,
        bias: &[(u32, f32)],
        pen: &Penalties,
        dry: &Dry,
        history: &[u32],
    ) -> CoreResult<Vec<Cand>> {
        let (am, mx, _) = dense::argmax_nan(row);
        let mut w = Work::from_row(RowRef::Borrowed(row), am, mx, Vec::new());
        let mut zero = vec![0u32; row.len()];
        logit_bias::apply(&mut w, bias)?;
        pen.apply(&mut w, history, &mut zero)?;
        dry.apply(&mut w, history, &mut zero)?;
        w.refresh()?;
        let mut delta = 0.0;
        w.top_k(k, false, &mut delta);
        Ok(w.cands)
    }

    #[test]
    fn matches_editing_a_copy_on_many_rows() {
        let mut rng = Rng(42);
        let stages = [Stage::LogitBias, Stage::Penalties, Stage::Dry];
        for case in 0..400 {
            let n = 2 + rng.below(3000);
            let row: Vec<f32> = (0..n)
                .map(|_| {
                    if rng.below(50) == 0 {
                        f32::NEG_INFINITY
                    } else {
                        // Coarse values, so that ties are common.
                        (rng.below(400) as f32) / 16.0
                    }
                })
                .collect();
            if row.iter().all(|v| *v == f32::NEG_INFINITY) {
                continue;
            }
            // Histories made of the row's best tokens, so that the edits
            // push the top-k's members out often.
            let mut order: Vec<u32> = (0..n as u32).collect();
            order.sort_by(|&a, &b| row[b as usize].total_cmp(&row[a as usize]));
            let hot = 1 + rng.below(n.min(60));
            let history: Vec<u32> = (0..rng.below(200)).map(|_| order[rng.below(hot)]).collect();
            let mut bias: Vec<(u32, f32)> = (0..rng.below(4))
                .map(|_| {
                    let t = order[rng.below(hot)];
                    let b = if rng.below(3) == 0 {
                        f32::NEG_INFINITY
                    } else {
                        -(rng.below(64) as f32) / 8.0
                    };
                    (t, b)
                })
                .collect();
            bias.sort_unstable_by_key(|&(t, _)| t);
            bias.dedup_by_key(|&mut (t, _)| t);
            let pen = Penalties {
                output_only: false,
                repeat: 1.0 + rng.below(10) as f32 / 4.0,
                frequency: rng.below(4) as f32 / 2.0,
                presence: rng.below(4) as f32,
                window: if rng.below(2) == 0 { None } else { Some(64) },
            };
            let dry = Dry {
                multiplier: 0.5 + rng.below(4) as f32,
                base: 1.75,
                allowed_length: 1 + rng.below(3),
                max_ngram: 0,
                breakers: vec![],
            };
            let k = [1, 3, 40, 600][rng.below(4)];
            let want = by_copy(&row, k, &bias, &pen, &dry, &history);
            let mut counts = WindowCounts::default();
            counts.sync(pen.window(&history), n);
            let mut zero = vec![0u32; n];
            let lens = dry.lengths(&history, &mut zero);
            let edits = Edits {
                stages: &stages,
                bias: &bias,
                penalties: &pen,
                counts: &counts,
                dry: &dry,
                dry_lengths: &lens,
            };
            let (_, mx, _) = dense::argmax_nan(&row);
            let mut delta = [0.25, 2.0, 8.0][rng.below(3)];
            let mut got = Vec::new();
            let r = top_k(&row, mx, k, false, &mut delta, &edits, &mut got).map(|()| got);
            assert_eq!(r, want, "case {case}: n {n} k {k}");
        }
    }

    /// fuzz/sampler_chain found `4 * k` overflowing (a panic with overflow checks) for a
    /// `top_k` near `usize::MAX`; any k past the row keeps the whole row, ranked.
    #[test]
    fn a_top_k_near_usize_max_keeps_the_whole_row() {
        let stages = [Stage::LogitBias, Stage::Penalties, Stage::Dry];
        let row = [0.5f32, 2.0, -1.0, 2.0, f32::NEG_INFINITY];
        let pen = Penalties {
            output_only: false,
            repeat: 1.0,
            frequency: 0.0,
            presence: 0.0,
            window: None,
        };
        let dry = Dry {
            multiplier: 0.0,
            base: 1.75,
            allowed_length: 2,
            max_ngram: 0,
            breakers: vec![],
        };
        let history: Vec<u32> = vec![];
        let mut counts = WindowCounts::default();
        counts.sync(pen.window(&history), row.len());
        let mut zero = vec![0u32; row.len()];
        let lens = dry.lengths(&history, &mut zero);
        let edits = Edits {
            stages: &stages,
            bias: &[],
            penalties: &pen,
            counts: &counts,
            dry: &dry,
            dry_lengths: &lens,
        };
        for k in [usize::MAX, usize::MAX / 2, usize::MAX / 4 + 1] {
            let want = by_copy(&row, k, &[], &pen, &dry, &history);
            let mut delta = 8.0;
            let mut got = Vec::new();
            let r = top_k(&row, 2.0, k, false, &mut delta, &edits, &mut got).map(|()| got);
            assert_eq!(r, want, "k {k}");
        }
    }

    #[test]
    fn plans_only_edits_that_lower_logits_before_a_top_k() {
        let stages = [
            Stage::Penalties,
            Stage::Temperature,
            Stage::TopK,
            Stage::TopP,
        ];
        let knobs = Knobs {
            repetition_penalty: 1.1,
            temperature: 0.8,
            top_k: 40,
            ..Knobs::default()
        };
        assert_eq!(
            Plan::for_chain(&stages, &knobs),
            Some(Plan {
                edits: vec![Stage::Penalties],
                temperature: true,
                resume: 3
            })
        );
        let raising = Knobs {
            presence_penalty: -0.5,
            ..knobs.clone()
        };
        assert_eq!(Plan::for_chain(&stages, &raising), None);
        let boost = Knobs {
            logit_bias: vec![(3, 1.0)],
            ..knobs.clone()
        };
        let with_bias = [Stage::LogitBias, Stage::Penalties, Stage::TopK];
        assert_eq!(Plan::for_chain(&with_bias, &boost), None);
        assert_eq!(
            Plan::for_chain(&[Stage::Penalties, Stage::TopP], &knobs),
            None,
            "no top-k to defer to"
        );
    }
}
