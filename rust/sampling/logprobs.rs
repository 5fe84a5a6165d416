//! Log-probabilities reported with a sampled token: under the raw row, the
//! penalised row, or the distribution the token was drawn from.

use super::candidates::{top_k_sparse, Work};
use super::dense;

/// Which distribution `sample_with_logprobs` reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogprobMode {
    /// The softmax of the logits as given.
    Raw,
    /// After logit bias, penalties and DRY, before temperature and truncation.
    Penalized,
    /// The distribution the token was drawn from.
    Final,
}

/// Log-probabilities reported with a token.
#[derive(Clone, Debug, PartialEq)]
pub struct Logprobs {
    pub logprob: f64,
    pub top: Vec<(u32, f64)>,
}

/// Log-probabilities under the softmax of a whole row (`+inf` entries share
/// all the mass).
pub(crate) fn dense_logprobs(
    row: &[f32],
    scale: f32,
    token: u32,
    top_n: usize,
    delta: &mut f32,
) -> Logprobs {
    let (max, _) = crate::argmax::max_and_nan(row);
    if max == f32::INFINITY {
        let n_inf = row.iter().filter(|&&v| v == f32::INFINITY).count() as f64;
        let lp = |t: u32| {
            if row[t as usize] == f32::INFINITY {
                -n_inf.ln()
            } else {
                f64::NEG_INFINITY
            }
        };
        let top = row
            .iter()
            .enumerate()
            .filter(|(_, &v)| v == f32::INFINITY)
            .take(top_n)
            .map(|(i, _)| (i as u32, lp(i as u32)))
            .collect();
        return Logprobs {
            logprob: lp(token),
            top,
        };
    }
    let ln_s = dense::exp_sum(row, max, scale).ln();
    // The same gap to the maximum as the sum's kernel subtracted, so that the
    // token's term is part of `ln_s` and the result is at most 0 (the fast
    // exponential's 2e-7 may leave it a hair above: clamped).
    let lp = |l: f32| (dense::scaled_gap(l, max, scale) - ln_s).min(0.0);
    let mut top = Vec::new();
    if top_n > 0 {
        dense::top_k(row, 1.0, max, top_n, false, delta, &mut top);
    }
    Logprobs {
        logprob: lp(row[token as usize]),
        top: top.iter().map(|c| (c.id, lp(c.logit))).collect(),
    }
}

/// Log-probabilities under the distribution left at the draw.
pub(crate) fn final_logprobs(
    work: &Work<'_>,
    token: u32,
    top_n: usize,
    delta: &mut f32,
) -> Logprobs {
    if let Some(d) = &work.dense {
        return dense_logprobs(d.row.as_slice(), d.scale, token, top_n, delta);
    }
    let max = work.max_logit() as f64;
    let ln_s = work
        .cands
        .iter()
        .map(|c| (c.logit as f64 - max).exp())
        .sum::<f64>()
        .ln();
    let lp = |l: f32| (l as f64 - max - ln_s).min(0.0);
    let logprob = work
        .cands
        .iter()
        .find(|c| c.id == token)
        .map_or(f64::NEG_INFINITY, |c| lp(c.logit));
    let mut top = work.cands.clone();
    if top_n > 0 {
        top_k_sparse(&mut top, top_n, false);
    } else {
        top.clear();
    }
    Logprobs {
        logprob,
        top: top.iter().map(|c| (c.id, lp(c.logit))).collect(),
    }
}
