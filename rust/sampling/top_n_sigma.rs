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
    // Over the finite candidates only, as on the dense path: a -inf one (a
    // penalty or bias that overflowed) made the mean -inf, the threshold
    // NaN, and removed every candidate.
    let finite = || work.cands.iter().filter(|c| c.logit.is_finite());
    let k = finite().count();
    if k <= 1 {
        return;
    }
    let mean = finite().map(|c| c.logit as f64).sum::<f64>() / k as f64;
    let var = finite()
        .map(|c| (c.logit as f64 - mean).powi(2))
        .sum::<f64>()
        / k as f64;
    let max = work.max_logit() as f64;
    let thr = (max - n as f64 * var.sqrt()) as f32;
    work.cands.retain(|c| c.logit >= thr);
}

#[cfg(test)]
mod tests {
    use super::apply;
    use crate::sampling::candidates::{Cand, RowRef, Work};
    use crate::sampling::dense;

    #[test]
    fn a_sparse_set_with_minus_inf_keeps_its_finite_top() {
        // Found by the table-driven sampler fuzzer: frequency penalty 3e38
        // sent candidates to -inf, then top-n-sigma emptied the set and
        // top-p indexed the empty set (a panic).
        let row = [0.0f32];
        let mut w = Work::from_row(RowRef::Borrowed(&row), 0, 0.0, Vec::new());
        w.release_dense();
        w.cands = [f32::NEG_INFINITY, 2.0, 1.0, -5.0, f32::NEG_INFINITY]
            .iter()
            .enumerate()
            .map(|(id, &logit)| Cand {
                id: id as u32,
                logit,
            })
            .collect();
        apply(&mut w, 1.0);
        let kept: Vec<u32> = w.cands.iter().map(|c| c.id).collect();
        // Over {2, 1, -5}: mean -2/3, population sd 3.09, so the threshold
        // 2 - 3.09 keeps 2 and 1.
        assert_eq!(kept, vec![1, 2]);
    }

    #[test]
    fn moments_hold_at_float32_extremes() {
        // In float32 the squares overflow near 1e20 and vanish near 1e-30.
        let base = [2.0f64, 1.5, 1.0, 0.25, -1.0, -3.0, 0.5, -0.5, 0.125];
        for scale in [1e-38f64, 1e-30, 1e-20, 1.0, 1e20, 1e30, 1e38] {
            let row: Vec<f32> = base.iter().map(|b| (b * scale) as f32).collect();
            let vals: Vec<f64> = row.iter().map(|&v| v as f64).collect();
            let mean = vals.iter().sum::<f64>() / vals.len() as f64;
            let sd =
                (vals.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / vals.len() as f64).sqrt();
            let (n, m, s) = dense::moments(&row);
            assert_eq!(n, row.len());
            assert!(
                (m - mean).abs() <= 1e-12 * sd,
                "{scale}: mean {m} vs {mean}"
            );
            assert!((s - sd).abs() <= 1e-12 * sd, "{scale}: sd {s} vs {sd}");
        }
        // The extremes of float32 themselves: a spread of 2 * f32::MAX.
        let row = [f32::MAX, f32::MIN, f32::NEG_INFINITY, f32::NAN];
        let (n, m, s) = dense::moments(&row);
        assert_eq!((n, m), (2, 0.0));
        assert_eq!(s, f32::MAX as f64);
    }
}
