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

/// The nucleus of `cands` (any order) as `(tau, ties)`: keep every logit
/// above `tau` and the `ties` lowest ids at `tau`. `None` keeps everything.
///
/// A quickselect on rank with masses: partition around a pivot logit, keep
/// the part above it whole when it cannot reach `target`, else descend into
/// it. Expected linear time; `cands` is reordered.
pub fn boundary(
    cands: &mut [Cand],
    w: impl Fn(&Cand) -> f64,
    target: f64,
    min_keep: usize,
) -> Option<(f32, usize)> {
    let w = &w;
    let (mut start, mut end) = (0usize, cands.len());
    let mut acc = 0.0f64;
    while end - start > 64 {
        let region = &mut cands[start..end];
        let n = region.len();
        let mut piv = [region[0].logit, region[n / 2].logit, region[n - 1].logit];
        piv.sort_unstable_by(f32::total_cmp);
        let pv = piv[1];
        // Three-way partition: [> pv | == pv | < pv].
        let (mut lt, mut i, mut gt) = (0usize, 0usize, n);
        while i < gt {
            let l = region[i].logit;
            if l > pv {
                region.swap(lt, i);
                lt += 1;
                i += 1;
            } else if l < pv {
                gt -= 1;
                region.swap(i, gt);
            } else {
                i += 1;
            }
        }
        let mass_hi: f64 = region[..lt].iter().map(w).sum();
        if acc + mass_hi >= target && start + lt >= min_keep {
            end = start + lt;
            continue;
        }
        acc += mass_hi;
        start += lt;
        let eq = &mut cands[start..start + (gt - lt)];
        eq.sort_unstable_by_key(|c| c.id);
        let n_eq = eq.len();
        for (j, c) in eq.iter().enumerate() {
            acc += w(c);
            if acc >= target && start + j + 1 >= min_keep {
                return Some((pv, j + 1));
            }
        }
        start += n_eq;
    }
    let region = &mut cands[start..end];
    region.sort_unstable_by(by_rank);
    for (j, c) in region.iter().enumerate() {
        acc += w(c);
        if acc >= target && start + j + 1 >= min_keep {
            let ties = region[..=j].iter().filter(|d| d.logit == c.logit).count();
            return Some((c.logit, ties));
        }
    }
    None
}

/// Apply top-p with mass `p` (`p >= 1` keeps everything).
///
/// On a whole row: one pass for the normaliser, then a gather of the entries
/// within `delta` of the max, widened until they hold the nucleus, and a sort
/// of those only.
pub fn apply(work: &mut Work<'_>, p: f32, min_keep: usize, delta: &mut f32, exps: &mut Vec<f32>) {
    if p >= 1.0 {
        return;
    }
    if let Some(d) = &work.dense {
        let row = d.row.as_slice();
        let ms = d.max * d.scale;
        if !(delta.is_finite() && *delta > 0.0) {
            *delta = 6.0;
        }
        // The normaliser and a first gather share one pass over the row.
        work.cands.clear();
        let total = dense::exp_sum_gather(row, d.max, d.scale, ms - *delta, &mut work.cands);
        let target = p as f64 * total;
        // The gathered logits side by side, so their exponentials vectorise.
        let mut logits = std::mem::take(&mut work.spare_f32);
        let mut first = true;
        loop {
            let thr = ms - *delta;
            if !first {
                work.cands.clear();
                dense::gather_ge(row, d.scale, thr, &mut work.cands);
            }
            first = false;
            logits.clear();
            logits.extend(work.cands.iter().map(|c| c.logit));
            let mass = dense::exp_sum(&logits, ms, 1.0);
            if (mass >= target && work.cands.len() >= min_keep) || thr < f32::MIN {
                break;
            }
            *delta *= 2.0;
        }
        if work.cands.len() > 16_384 {
            *delta *= 0.75;
        }
        // The nucleus boundary by weighted selection on a copy, then one
        // order-preserving filter: no sort of the gathered set.
        let mut tmp = std::mem::take(&mut work.spare_cands);
        tmp.clear();
        tmp.extend_from_slice(&work.cands);
        // The selection reads each weight several times: compute them once
        // (vectorised), stored by token id.
        let mut weights = work.spare_row.take().unwrap_or_default();
        dense::exp_store(&logits, ms, 1.0, &mut weights);
        if exps.len() < row.len() {
            exps.resize(row.len(), 0.0);
        }
        for (c, &e) in work.cands.iter().zip(&weights) {
            exps[c.id as usize] = e;
        }
        work.spare_row = Some(weights);
        work.spare_f32 = logits;
        let stored: &[f32] = exps;
        let w = |c: &Cand| stored[c.id as usize] as f64;
        if let Some((tau, ties)) = boundary(&mut tmp, w, target, min_keep) {
            let mut left = ties;
            work.cands.retain(|c| {
                if c.logit > tau {
                    true
                } else if c.logit == tau && left > 0 {
                    left -= 1;
                    true
                } else {
                    false
                }
            });
        }
        work.spare_cands = tmp;
        work.order = Order::Id;
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The nucleus by a full sort and a walk: what `boundary` must reproduce.
    fn by_sorting(cands: &[Cand], target: f64, min_keep: usize) -> Vec<u32> {
        let mut s = cands.to_vec();
        s.sort_unstable_by(by_rank);
        let n = prefix_len(&s, 0.0, target, min_keep, true);
        let mut ids: Vec<u32> = s[..n].iter().map(|c| c.id).collect();
        ids.sort_unstable();
        ids
    }

    #[test]
    fn boundary_agrees_with_sorting_on_many_rows() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        for case in 0..300 {
            let n = 1 + case * 7 % 900;
            let cands: Vec<Cand> = (0..n as u32)
                .map(|id| {
                    state = state
                        .wrapping_mul(6_364_136_223_846_793_005)
                        .wrapping_add(1);
                    // Coarse values so that ties straddle the boundary often.
                    let logit = -(((state >> 40) % 40) as f32) / 4.0;
                    Cand { id, logit }
                })
                .collect();
            let total: f64 = cands.iter().map(|c| dense::exp_neg(c.logit) as f64).sum();
            for (p, min_keep) in [(0.1, 1), (0.5, 3), (0.9, 1), (0.999, 2), (0.0, 5)] {
                let target = p * total;
                let mut tmp = cands.clone();
                let w = |c: &Cand| dense::exp_neg(c.logit) as f64;
                let got: Vec<u32> = match boundary(&mut tmp, w, target, min_keep) {
                    None => cands.iter().map(|c| c.id).collect(),
                    Some((tau, ties)) => {
                        let mut left = ties;
                        cands
                            .iter()
                            .filter(|c| {
                                c.logit > tau
                                    || (c.logit == tau && left > 0 && {
                                        left -= 1;
                                        true
                                    })
                            })
                            .map(|c| c.id)
                            .collect()
                    }
                };
                assert_eq!(
                    got,
                    by_sorting(&cands, target, min_keep),
                    "case {case} p {p}"
                );
            }
        }
    }
}
