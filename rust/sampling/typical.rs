//! Locally typical sampling (Meister et al. 2023): keep the candidates whose
//! surprise is closest to the entropy until their mass reaches `p`.

use super::candidates::{Cand, Order, Work};

/// How typical-p finds its cut.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Rule {
    /// Stop at the first cumulative mass `>= p` (the paper and Hugging Face)
    /// rather than the first `> p` (llama.cpp).
    pub inclusive: bool,
    /// Keep every candidate whose score ties the boundary's (Hugging Face
    /// keeps `score <= score[boundary]`), and `min_keep` regardless of where
    /// the boundary falls; otherwise the cut is the first index at or past
    /// `min_keep - 1` where the mass is reached (llama.cpp).
    pub keep_ties: bool,
}

/// Apply typical-p with `rule`.
pub fn apply(work: &mut Work<'_>, p: f32, min_keep: usize, rule: Rule, probs: &mut Vec<f64>) {
    let inclusive = rule.inclusive;
    if p >= 1.0 {
        return;
    }
    work.materialize();
    let n = work.cands.len();
    if n <= 1 {
        return;
    }
    let max = work.max_logit() as f64;
    let sum: f64 = work
        .cands
        .iter()
        .map(|c| (c.logit as f64 - max).exp())
        .sum();
    let ln_s = sum.ln();
    // ln p_i without taking the log of an underflowed p.
    let logp = |c: &Cand| c.logit as f64 - max - ln_s;
    let mut h = 0.0f64;
    for c in &work.cands {
        let lp = logp(c);
        let pr = lp.exp();
        if pr > 0.0 {
            h -= pr * lp;
        }
    }
    probs.clear();
    let mut ranked: Vec<(f64, Cand)> = work
        .cands
        .iter()
        .map(|c| ((-logp(c) - h).abs(), *c))
        .collect();
    ranked.sort_unstable_by(|a, b| a.0.total_cmp(&b.0).then(a.1.id.cmp(&b.1.id)));
    let target = p as f64;
    let mut cum = 0.0f64;
    let mut keep = n;
    // Hugging Face's cut ignores min_keep (it is applied afterwards).
    let floor = if rule.keep_ties { 1 } else { min_keep };
    for (i, (_, c)) in ranked.iter().enumerate() {
        cum += logp(c).exp();
        let reached = if inclusive {
            cum >= target
        } else {
            cum > target
        };
        if reached && i + 1 >= floor {
            keep = i + 1;
            break;
        }
    }
    if rule.keep_ties {
        let boundary = ranked[keep - 1].0;
        while keep < n && ranked[keep].0 <= boundary {
            keep += 1;
        }
        keep = keep.max(min_keep.min(n));
    }
    work.cands.clear();
    work.cands.extend(ranked[..keep].iter().map(|&(_, c)| c));
    work.order = Order::Any;
}
