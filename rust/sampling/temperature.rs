//! Temperature: plain (divide every logit by `t`) and dynamic (a temperature
//! chosen from the normalised entropy of the current distribution).

use super::candidates::{reorder_ties, softmax, Cand, Order, Work};
use super::dense;

/// Divide every logit by `t`; `t <= 0` keeps only the best-ranked candidate.
///
/// A temperature so small that the largest scaled logit overflows float32
/// (or `1 / t` does) is the limit `t -> 0`: every candidate not tied with the
/// maximum has probability exactly 0 there (distinct float32 values that
/// large differ by more than 2^-24 of the maximum, times `1 / t`), so only the
/// candidates tied at the maximum are kept, with equal mass, as `+inf`
/// logits share theirs. No scaled logit is ever `+inf` or NaN.
pub fn apply(work: &mut Work<'_>, t: f32) {
    if t <= 0.0 {
        let best = work.best();
        work.set_single(best);
        return;
    }
    if t == 1.0 {
        return;
    }
    let s = 1.0 / t;
    match &mut work.dense {
        Some(d) => {
            let scale = d.scale * s;
            if s.is_finite() && (d.max * scale).is_finite() && scale > 0.0 {
                d.scale = scale;
                return;
            }
        }
        None => {
            let max = work.max_logit();
            if s.is_finite() && (max * s).is_finite() {
                let mut banned = false;
                for c in &mut work.cands {
                    c.logit *= s;
                    banned |= c.logit == f32::NEG_INFINITY;
                }
                if banned {
                    // Far below the maximum: probability 0, as a ban.
                    work.cands.retain(|c| c.logit > f32::NEG_INFINITY);
                }
                if work.order == Order::Desc {
                    // Scaling can tie logits that ranked apart; a tie ranks by id.
                    reorder_ties(&mut work.cands);
                }
                return;
            }
        }
    }
    keep_ties_at_max(work);
}

/// Keep only the candidates tied with the maximum, each with logit 0.
fn keep_ties_at_max(work: &mut Work<'_>) {
    let max = match &work.dense {
        Some(d) => d.max,
        None => work.max_logit(),
    };
    let mut kept = std::mem::take(&mut work.spare_cands);
    kept.clear();
    match &work.dense {
        Some(d) => {
            let row = d.row.as_slice();
            kept.extend(
                row.iter()
                    .enumerate()
                    .filter(|&(_, &v)| v == max)
                    .map(|(i, _)| Cand {
                        id: i as u32,
                        logit: 0.0,
                    }),
            );
        }
        None => kept.extend(work.cands.iter().filter(|c| c.logit == max).map(|c| Cand {
            id: c.id,
            logit: 0.0,
        })),
    }
    kept.sort_unstable_by_key(|c| c.id);
    work.release_dense();
    work.spare_cands = std::mem::replace(&mut work.cands, kept);
    work.order = Order::Id;
}

/// Entropy (nats) of the current softmax and the number of candidates.
pub fn entropy(work: &Work<'_>, probs: &mut Vec<f64>) -> (f64, usize) {
    match &work.dense {
        Some(d) => {
            let row = d.row.as_slice();
            let (s, sez) = dense::entropy_sums(row, d.max, d.scale);
            let n = row.iter().filter(|v| v.is_finite()).count();
            (s.ln() - sez / s, n)
        }
        None => {
            softmax(&work.cands, probs);
            let h = -probs
                .iter()
                .filter(|&&p| p > 0.0)
                .map(|&p| p * p.ln())
                .sum::<f64>();
            (h, work.cands.len())
        }
    }
}

/// Dynamic temperature `T = lo + (hi - lo) * (H / ln n)^exponent`, where `H`
/// is the entropy of the current distribution over its `n` finite candidates.
/// Returns the temperature used (`None` when there is one candidate).
pub fn apply_dynamic(
    work: &mut Work<'_>,
    lo: f32,
    hi: f32,
    exponent: f32,
    probs: &mut Vec<f64>,
) -> Option<f32> {
    let (h, n) = entropy(work, probs);
    if n <= 1 {
        return None;
    }
    let h_max = (n as f64).ln();
    let norm = (h / h_max).clamp(0.0, 1.0);
    let t = lo as f64 + (hi as f64 - lo as f64) * norm.powf(exponent as f64);
    let t = t as f32;
    apply(work, t);
    Some(t)
}
