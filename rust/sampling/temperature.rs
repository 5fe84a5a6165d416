//! Temperature: plain (divide every logit by `t`) and dynamic (a temperature
//! chosen from the normalised entropy of the current distribution).

use super::candidates::{softmax, Work};
use super::dense;

/// Divide every logit by `t`; `t <= 0` keeps only the best-ranked candidate.
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
        Some(d) => d.scale *= s,
        None => {
            for c in &mut work.cands {
                c.logit *= s;
            }
        }
    }
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
