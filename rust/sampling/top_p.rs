//! Top-p (nucleus): keep the smallest set of best-ranked candidates whose
//! probability mass reaches `p` (the token that crosses `p` is kept), and
//! never fewer than `min_keep`.

use super::candidates::{by_rank, Cand, Order, Work};
use super::dense;

/// Number of leading entries of a rank-sorted list to keep.
fn prefix_len(cands: &[Cand], max: f32, target: f64, min_keep: usize, fast_exp: bool) -> usize {
    let mut cum = 0.0f64;
    for (i, c) in cands.iter().enumerate() {
        cum += if fast_exp {
            dense::exp_neg(c.logit - max) as f64
        } else {
            (c.logit as f64 - max as f64).exp()
        };
        if cum >= target && i + 1 >= min_keep {
            return i + 1;
        }
    }
    cands.len()
}

/// Apply top-p with mass `p` (`p >= 1` keeps everything).
///
/// On a whole row: one pass for the normaliser, then a gather of the entries
/// within `delta` of the max, widened until they hold the nucleus, and a sort
/// of those only.
pub fn apply(work: &mut Work<'_>, p: f32, min_keep: usize, delta: &mut f32) {
    if p >= 1.0 {
        return;
    }
    if let Some(d) = &work.dense {
        let row = d.row.as_slice();
        let ms = d.max * d.scale;
        let total = dense::exp_sum(row, d.max, d.scale);
        let target = p as f64 * total;
        if !(delta.is_finite() && *delta > 0.0) {
            *delta = 6.0;
        }
        loop {
            work.cands.clear();
            let thr = ms - *delta;
            dense::gather_ge(row, d.scale, thr, &mut work.cands);
            let mass: f64 = work
                .cands
                .iter()
                .map(|c| dense::exp_neg(c.logit - ms) as f64)
                .sum();
            if (mass >= target && work.cands.len() >= min_keep) || thr < f32::MIN {
                break;
            }
            *delta *= 2.0;
        }
        if work.cands.len() > 16_384 {
            *delta *= 0.75;
        }
        work.cands.sort_unstable_by(by_rank);
        let n = prefix_len(&work.cands, ms, target, min_keep, true);
        work.cands.truncate(n);
        work.order = Order::Desc;
        work.release_dense();
        return;
    }
    work.sort_desc();
    let max = work.cands[0].logit;
    let total: f64 = work
        .cands
        .iter()
        .map(|c| (c.logit as f64 - max as f64).exp())
        .sum();
    let n = prefix_len(&work.cands, max, p as f64 * total, min_keep, false);
    work.cands.truncate(n);
}
