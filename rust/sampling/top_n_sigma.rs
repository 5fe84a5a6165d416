//! Top-n-sigma (Tang et al. 2024): keep the logits within `n` standard
//! deviations of the max, `l >= max - n * sigma`, with the population standard
//! deviation over the current finite candidates.

use super::candidates::{Order, Work};
use super::dense;

/// Apply top-n-sigma (`n <= 0` keeps everything).
pub fn apply(work: &mut Work<'_>, n: f32) {
    if n <= 0.0 {
        return;
    }
    if let Some(d) = &work.dense {
        let row = d.row.as_slice();
        let (count, _mean, sd) = dense::moments(row);
        if count <= 1 {
            return;
        }
        let thr = ((d.max as f64 - n as f64 * sd) * d.scale as f64) as f32;
        work.cands.clear();
        dense::gather_ge(row, d.scale, thr, &mut work.cands);
        work.order = Order::Id;
        work.release_dense();
        return;
    }
    let k = work.cands.len();
    if k <= 1 {
        return;
    }
    let mean = work.cands.iter().map(|c| c.logit as f64).sum::<f64>() / k as f64;
    let var = work
        .cands
        .iter()
        .map(|c| (c.logit as f64 - mean).powi(2))
        .sum::<f64>()
        / k as f64;
    let max = work.max_logit() as f64;
    let thr = (max - n as f64 * var.sqrt()) as f32;
    work.cands.retain(|c| c.logit >= thr);
}
