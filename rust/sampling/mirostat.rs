//! Mirostat v1 and v2 (Basu et al. 2021): a selector that truncates the
//! distribution to keep the surprise of sampled tokens near `tau`, learning
//! `mu` from each accepted token's surprise: `mu -= eta * (surprise - tau)`.

use super::candidates::{top_k_sparse, Cand, Work};
use super::dense;
use super::dist;

/// What a mirostat draw leaves for `accept`: the surprise (bits) of every
/// token of the truncated distribution, sorted by id.
pub type Surprises = Vec<(u32, f32)>;

/// The truncated, renormalised distribution after the cut, as
/// `(ln normaliser, max logit)`, ready for the draw.
fn surprises(work: &Work<'_>) -> Surprises {
    let max = work.max_logit() as f64;
    let sum: f64 = work
        .cands
        .iter()
        .map(|c| (c.logit as f64 - max).exp())
        .sum();
    let ln_s = sum.ln();
    let mut out: Surprises = work
        .cands
        .iter()
        .map(|c| {
            (
                c.id,
                (-(c.logit as f64 - max - ln_s) / std::f64::consts::LN_2) as f32,
            )
        })
        .collect();
    out.sort_unstable_by_key(|&(t, _)| t);
    out
}

/// `(ln S, max)` of the current distribution and its `m` best candidates.
fn head(work: &Work<'_>, m: usize, delta: &mut f32) -> (f64, f64, Vec<Cand>) {
    match &work.dense {
        Some(d) => {
            let row = d.row.as_slice();
            let s = dense::exp_sum(row, d.max, d.scale);
            let mut top = Vec::new();
            dense::top_k(row, d.scale, d.max, m, false, delta, &mut top);
            (s.ln(), (d.max * d.scale) as f64, top)
        }
        None => {
            let max = work.max_logit() as f64;
            let s: f64 = work
                .cands
                .iter()
                .map(|c| (c.logit as f64 - max).exp())
                .sum();
            let mut top = work.cands.clone();
            top_k_sparse(&mut top, m, false);
            (s.ln(), max, top)
        }
    }
}

/// Mirostat v1's k from the Zipf exponent estimated over the `m` best tokens.
pub fn v1_k(logps: &[f64], mu: f32, vocab: usize) -> f64 {
    let mut num = 0.0f64;
    let mut den = 0.0f64;
    for i in 0..logps.len().saturating_sub(1) {
        let t = ((i + 2) as f64 / (i + 1) as f64).ln();
        let b = logps[i] - logps[i + 1];
        num += t * b;
        den += t * t;
    }
    if den == 0.0 {
        return 1.0;
    }
    let s_hat = num / den;
    let eps = s_hat - 1.0;
    let n = vocab as f64;
    // eps / (1 - n^-eps) tends to 1 / ln n as eps -> 0.
    let ratio = if eps.abs() < 1e-9 {
        1.0 / n.ln()
    } else {
        eps / (1.0 - n.powf(-eps))
    };
    (ratio * 2f64.powf(mu as f64)).powf(1.0 / s_hat)
}

/// Mirostat v1: keep the top `k` (k from the Zipf fit), then draw.
pub fn v1(
    work: &mut Work<'_>,
    mu: f32,
    m: usize,
    vocab: usize,
    u: f64,
    delta: &mut f32,
    exps: &mut Vec<f32>,
) -> (Cand, Surprises) {
    let (ln_s, max, top) = head(work, m.max(2), delta);
    let logps: Vec<f64> = top.iter().map(|c| c.logit as f64 - max - ln_s).collect();
    let k = v1_k(&logps, mu, vocab);
    let k = if k.is_finite() && k >= 1.0 {
        k.min(vocab as f64) as usize
    } else if k.is_finite() || k.is_nan() {
        1
    } else {
        vocab
    };
    work.top_k(k.max(1), false, delta);
    let s = surprises(work);
    let (c, _, _) = dist::draw(work, u, exps);
    (c, s)
}

/// Mirostat v2: keep the tokens whose surprise is at most `mu` (at least the
/// best one), then draw.
pub fn v2(
    work: &mut Work<'_>,
    mu: f32,
    u: f64,
    delta: &mut f32,
    exps: &mut Vec<f32>,
) -> (Cand, Surprises) {
    let (ln_s, max, _) = head(work, 1, delta);
    let thr = (max + ln_s - mu as f64 * std::f64::consts::LN_2) as f32;
    let best = work.best();
    match &work.dense {
        Some(d) => {
            work.cands.clear();
            dense::gather_ge(d.row.as_slice(), d.scale, thr, &mut work.cands);
            work.order = super::candidates::Order::Id;
            work.release_dense();
        }
        None => work.cands.retain(|c| c.logit >= thr),
    }
    if work.cands.is_empty() {
        work.set_single(best);
    }
    let s = surprises(work);
    let (c, _, _) = dist::draw(work, u, exps);
    (c, s)
}
