//! Top-p (nucleus): keep the smallest set of best-ranked candidates whose
//! probability mass reaches `p` (the token that crosses `p` is kept), and
//! never fewer than `min_keep`.

use super::candidates::{by_rank, Cand, Order, Work};
use super::dense;

/// How far below `p` (relative) a prefix's mass may fall and still count as
/// reaching it. The masses carry the fast exp's ~2e-7 relative error (and the
/// normaliser the same), so a prefix whose exact mass is `p` (`{.5, .3}` for
/// `p = .8`) can come out a few 1e-7 short: without this slack the chain
/// would keep one token more than every engine does. One part per million is
/// above those errors and below anything a float32 `p` can express apart.
pub const SLACK: f64 = 1e-6;

/// The mass a prefix must reach: `p` of `total`, less [`SLACK`].
pub fn target(p: f32, total: f64) -> f64 {
    p as f64 * total * (1.0 - SLACK)
}

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

/// Number of logit bins of [`bucket_boundary`] (a bin index fits a `u8`).
const BINS: usize = 256;

/// The nucleus of the candidates `(ids[i], logits[i])` (any order;
/// `weights[i]` the mass of entry `i`; every logit in `[bottom, top]`) as `(tau, ties)`:
/// keep every logit above `tau` and the `ties` lowest ids at `tau`; `None`
/// keeps everything.
///
/// One pass bins the candidates by logit (bins never split equal logits and
/// follow rank order), a walk over the bins' masses finds the bin where the
/// cumulative mass reaches `target`, and only that bin is sorted and walked.
#[allow(clippy::too_many_arguments)]
pub fn bucket_boundary(
    ids: &[u32],
    logits: &[f32],
    weights: &[f32],
    top: f32,
    bottom: f32,
    target: f64,
    min_keep: usize,
    tmp: &mut Vec<Cand>,
) -> Option<(f32, usize)> {
    let mut walk = Walk { acc: 0.0, kept: 0 };
    boundary_in(
        ids, logits, weights, top, bottom, target, min_keep, tmp, &mut walk, 0,
    )
}

/// A crossing bin with more members than this is binned again, not sorted.
const SPLIT: usize = 512;
/// How many times a crowded bin is binned again before sorting it anyway.
const MAX_DEPTH: u32 = 3;

/// The mass and the number of candidates walked so far, from the top.
struct Walk {
    acc: f64,
    kept: usize,
}

/// [`bucket_boundary`] continuing a walk: `walk` holds what the higher
/// logits (outside this set) already contribute, and on `None` it also
/// holds this whole set.
#[allow(clippy::too_many_arguments)]
fn boundary_in(
    ids: &[u32],
    logits: &[f32],
    weights: &[f32],
    top: f32,
    bottom: f32,
    target: f64,
    min_keep: usize,
    tmp: &mut Vec<Cand>,
    walk: &mut Walk,
    depth: u32,
) -> Option<(f32, usize)> {
    let n = ids.len();
    let cand = |i: u32| Cand {
        id: ids[i as usize],
        logit: logits[i as usize],
    };
    let span = top - bottom;
    let inv = if span.is_finite() && span > 0.0 {
        (BINS as f32 / span).min(f32::MAX)
    } else {
        0.0
    };
    // Bin ids first, in a loop of its own so that it vectorises.
    let mut bins = vec![0u8; n];
    for (b, &l) in bins.iter_mut().zip(logits) {
        // `min` and `max` return the other operand for a NaN, so `x` is a
        // number in [0, 255].
        let x = ((top - l) * inv).min((BINS - 1) as f32).max(0.0);
        // SAFETY: `x` is finite and in [0, 255], so truncating it fits a u32
        // (the checked `as` conversion costs a clamp per lane here).
        *b = unsafe { x.to_int_unchecked::<u32>() } as u8;
    }
    // Four interleaved histograms, so that runs of candidates in one bin do
    // not chain their additions through memory.
    let mut mass = [[0.0f64; BINS]; 4];
    let mut count = [[0u32; BINS]; 4];
    let bq = bins.chunks_exact(4);
    let wq = weights[..n].chunks_exact(4);
    let (bt, wt) = (bq.remainder(), wq.remainder());
    for (b4, w4) in bq.zip(wq) {
        for k in 0..4 {
            let b = b4[k] as usize;
            mass[k][b] += w4[k] as f64;
            count[k][b] += 1;
        }
    }
    for (&b, &w) in bt.iter().zip(wt) {
        mass[0][b as usize] += w as f64;
        count[0][b as usize] += 1;
    }
    let (mut acc, mut kept) = (walk.acc, walk.kept);
    let mut idx: Vec<u32> = Vec::new();
    for b in 0..BINS {
        let c = (count[0][b] + count[1][b] + count[2][b] + count[3][b]) as usize;
        if c == 0 {
            continue;
        }
        let m = (mass[0][b] + mass[1][b]) + (mass[2][b] + mass[3][b]);
        if acc + m < target || kept + c < min_keep {
            acc += m;
            kept += c;
            continue;
        }
        // The crossing is in this bin. Its members: a 16-entry mask of
        // matching bin ids at a time (one vector compare), then one step per
        // member.
        idx.clear();
        let chunks = bins.chunks_exact(16);
        let tail = chunks.remainder();
        for (ci, chunk) in chunks.enumerate() {
            let mut hits = 0u32;
            for (k, &bi) in chunk.iter().enumerate() {
                hits |= ((bi as usize == b) as u32) << k;
            }
            while hits != 0 {
                idx.push((ci * 16 + hits.trailing_zeros() as usize) as u32);
                hits &= hits - 1;
            }
        }
        let tail_start = bins.len() - tail.len();
        for (k, &bi) in tail.iter().enumerate() {
            if bi as usize == b {
                idx.push((tail_start + k) as u32);
            }
        }
        let (lo, hi) = idx
            .iter()
            .fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), &i| {
                let l = logits[i as usize];
                (lo.min(l), hi.max(l))
            });
        if idx.len() > SPLIT && lo < hi && depth < MAX_DEPTH {
            // A crowded bin (a very flat row): bin its members again rather
            // than sort them all.
            let sub_ids: Vec<u32> = idx.iter().map(|&i| ids[i as usize]).collect();
            let sub_logits: Vec<f32> = idx.iter().map(|&i| logits[i as usize]).collect();
            let sub_weights: Vec<f32> = idx.iter().map(|&i| weights[i as usize]).collect();
            let mut inner = Walk { acc, kept };
            let found = boundary_in(
                &sub_ids,
                &sub_logits,
                &sub_weights,
                hi,
                lo,
                target,
                min_keep,
                tmp,
                &mut inner,
                depth + 1,
            );
            if found.is_some() {
                return found;
            }
            (acc, kept) = (inner.acc, inner.kept);
            continue;
        }
        // Sort the bin alone and walk it.
        tmp.clear();
        idx.sort_unstable_by(|&x, &y| by_rank(&cand(x), &cand(y)));
        for (j, &i) in idx.iter().enumerate() {
            let c = cand(i);
            acc += weights[i as usize] as f64;
            tmp.push(c);
            if acc >= target && kept + j + 1 >= min_keep {
                let ties = tmp.iter().filter(|d| d.logit == c.logit).count();
                return Some((c.logit, ties));
            }
        }
        // Rounding kept the bin's walk short of the target: go on.
        kept += c;
    }
    walk.acc = acc;
    walk.kept = kept;
    None
}

/// Widenings of the top-p gather before it takes the whole row (doubling
/// from 8 nats, 40 of them span every float32 gap).
const MAX_WIDENINGS: i32 = 48;

/// The narrowest gather width kept between calls: a peaked row has only a
/// few entries within this of its maximum, so a wider gather costs it little
/// and spares a second pass when a flatter row follows.
const MIN_DELTA: f32 = 4.0;

/// How much wider a gather at `thr` must go to find the `missing` mass: the
/// mass per nat of the gathered band just above `thr`, assumed to continue
/// below it (it usually thins out, so this seldom overshoots; a shortfall
/// takes another step). At least a quarter nat, at most the current width.
fn widening(logits: &[f32], weights: &[f32], thr: f32, missing: f64, delta: f32) -> f32 {
    let band: f64 = logits
        .iter()
        .zip(weights)
        .map(|(&l, &w)| if l < thr + 1.0 { w as f64 } else { 0.0 })
        .sum();
    let step = if band > 0.0 {
        (missing / band) as f32 + 0.25
    } else {
        delta
    };
    step.clamp(0.25, delta.max(1.0))
}

/// Apply top-p with mass `p` (`p >= 1` keeps everything).
///
/// On a whole row: one pass for the normaliser, then a gather of the entries
/// within `delta` of the max, widened until they hold the nucleus, and a sort
/// of those only.
///
/// With `masses`, a whole-row top-p also leaves there the mass of each kept
/// candidate relative to the maximum (what the draw would compute), and
/// returns true; otherwise it returns false.
pub fn apply(
    work: &mut Work<'_>,
    p: f32,
    min_keep: usize,
    delta: &mut f32,
    mut masses: Option<&mut Vec<f32>>,
) -> bool {
    if p >= 1.0 {
        return false;
    }
    if let Some(d) = &work.dense {
        let row = d.row.as_slice();
        let ms = d.max * d.scale;
        if !(delta.is_finite() && *delta > 0.0) {
            *delta = 8.0;
        }
        // The normaliser and a first gather share one pass over the row; the
        // gather writes ids and logits side by side, so that the masses the
        // boundary search needs vectorise.
        let mut g = std::mem::take(&mut work.spare_gathered);
        g.clear();
        let total = dense::exp_sum_gather(row, d.max, d.scale, ms - *delta, &mut g);
        let target = target(p, total);
        let mut weights = work.spare_row.take().unwrap_or_default();
        let mut thr = ms - *delta;
        let mut first = true;
        let mut misses = 0;
        loop {
            if !first {
                thr = ms - *delta;
                g.clear();
                dense::gather_ge_into(row, d.scale, thr, &mut g);
            }
            first = false;
            let mass = dense::exp_store(&g.logits, ms, 1.0, &mut weights);
            // Bounded whatever the row: after `MAX_WIDENINGS` the gather
            // takes every finite entry (`thr = -inf`), and then stops.
            if (mass >= target && g.len() >= min_keep) || thr < f32::MIN || misses > MAX_WIDENINGS {
                break;
            }
            misses += 1;
            *delta += if misses == MAX_WIDENINGS {
                f32::INFINITY
            } else if misses <= 4 {
                // Each shortfall makes the next estimate bolder.
                widening(&g.logits, &weights, thr, target - mass, *delta) * 1.5f32.powi(misses - 1)
            } else {
                // Estimates that keep falling short (a gap in the row): double.
                *delta
            };
        }
        // Every gathered logit is at or above the threshold, unless the
        // gather took every finite entry.
        let bottom = if thr >= f32::MIN {
            thr
        } else {
            g.logits.iter().fold(ms, |m, &l| m.min(l))
        };
        // The nucleus boundary by binning the gathered logits, then one
        // order-preserving filter: no sort of the gathered set.
        let mut tmp = std::mem::take(&mut work.spare_cands);
        let found = bucket_boundary(
            &g.ids, &g.logits, &weights, ms, bottom, target, min_keep, &mut tmp,
        );
        work.spare_cands = tmp;
        let (tau, mut ties) = found.unwrap_or((f32::NEG_INFINITY, usize::MAX));
        if let Some((tau, _)) = found {
            // The next row likely needs about as wide a gather as this one.
            // Halfway down to this row's need at a time, so that a flatter
            // row among peaked ones seldom needs a second pass.
            let want = (ms - tau) + 0.25;
            if want < *delta {
                *delta = (0.5 * (*delta + want)).max(MIN_DELTA);
            }
        }
        // Keep every logit >= tau (one compare and compress per 16 on
        // AVX-512), then drop the ties at tau beyond the first `ties` in the
        // rare case there are more.
        work.cands.clear();
        if let Some(m) = masses.as_deref_mut() {
            m.clear();
        }
        let at_tau = dense::keep_ge(
            &g.ids,
            &g.logits,
            &weights,
            tau,
            &mut work.cands,
            masses.as_deref_mut(),
        );
        if at_tau > ties {
            // Surplus ties at the boundary: keep the first `ties` of them,
            // and the masses in step.
            let mut kept = 0;
            for i in 0..work.cands.len() {
                let c = work.cands[i];
                let keep = c.logit > tau || ties > 0;
                ties -= (c.logit == tau && keep) as usize;
                if keep {
                    work.cands[kept] = c;
                    if let Some(m) = masses.as_deref_mut() {
                        m[kept] = m[i];
                    }
                    kept += 1;
                }
            }
            work.cands.truncate(kept);
            if let Some(m) = masses.as_deref_mut() {
                m.truncate(kept);
            }
        }
        let have_masses = masses.is_some();
        work.spare_row = Some(weights);
        work.spare_gathered = g;
        work.order = Order::Id;
        work.release_dense();
        return have_masses;
    }
    if work.cands.is_empty() {
        // Nothing to truncate; the draw reports the empty set, typed.
        return false;
    }
    work.sort_desc();
    let max = work.cands[0].logit;
    let total: f64 = work
        .cands
        .iter()
        .map(|c| (c.logit as f64 - max as f64).exp())
        .sum();
    let n = prefix_len(&work.cands, max, target(p, total), min_keep, false);
    work.cands.truncate(n);
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ids `bucket_boundary`'s answer keeps: every logit above `tau` and
    /// the first `ties` at it (everything for `None`).
    fn kept_ids(cands: &[Cand], found: Option<(f32, usize)>) -> Vec<u32> {
        let (tau, mut left) = found.unwrap_or((f32::NEG_INFINITY, usize::MAX));
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

    /// The nucleus by a full sort and a walk: what `bucket_boundary` must reproduce.
    fn by_sorting(cands: &[Cand], target: f64, min_keep: usize) -> Vec<u32> {
        let mut s = cands.to_vec();
        s.sort_unstable_by(by_rank);
        let n = prefix_len(&s, 0.0, target, min_keep, true);
        let mut ids: Vec<u32> = s[..n].iter().map(|c| c.id).collect();
        ids.sort_unstable();
        ids
    }

    #[test]
    fn the_masses_top_p_leaves_give_the_draws_tokens() {
        use crate::sampling::candidates::RowRef;
        use crate::sampling::dist;
        let mut state = 3u64;
        for case in 0..40 {
            let n = 50 + case * 997;
            let row: Vec<f32> = (0..n)
                .map(|_| {
                    state = state
                        .wrapping_mul(6_364_136_223_846_793_005)
                        .wrapping_add(1);
                    ((state >> 40) % 4096) as f32 / 512.0
                })
                .collect();
            let (am, mx, _) = dense::argmax_nan(&row);
            let mut w = Work::from_row(RowRef::Borrowed(&row), am, mx, Vec::new());
            let (mut masses, mut delta) = (Vec::new(), 0.0);
            let p = [0.3, 0.9, 0.99][case % 3];
            assert!(apply(&mut w, p, 1, &mut delta, Some(&mut masses)));
            assert_eq!(masses.len(), w.cands.len());
            let mut exps = Vec::new();
            for k in 0..200 {
                let u = (k as f64 + 0.5) / 200.0;
                let want = dist::draw(&mut w, u, &mut exps).0;
                assert_eq!(
                    dist::draw_with_masses(&w.cands, &masses, u),
                    want,
                    "case {case} u {u}"
                );
            }
        }
    }

    #[test]
    fn crowded_bins_are_binned_again_and_agree_with_sorting() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        for case in 0..12 {
            // Most logits packed into a sliver at the bottom of the range, so
            // that the crossing bin holds thousands (and, for some cases, a
            // sliver of equal values that cannot be split).
            let n = 3000 + case * 1500;
            let cands: Vec<Cand> = (0..n as u32)
                .map(|id| {
                    state = state
                        .wrapping_mul(6_364_136_223_846_793_005)
                        .wrapping_add(1);
                    let r = (state >> 40) as f32 / (1u64 << 24) as f32;
                    let logit = if id % 97 == 0 {
                        -r * 8.0
                    } else if case % 3 == 0 {
                        -8.0 + ((r * 4.0) as u32) as f32 * 1e-3
                    } else {
                        -8.0 + r * 1e-2
                    };
                    Cand { id, logit }
                })
                .collect();
            let weights: Vec<f32> = cands.iter().map(|c| dense::exp_neg(c.logit)).collect();
            let total: f64 = weights.iter().map(|&w| w as f64).sum();
            let ids: Vec<u32> = cands.iter().map(|c| c.id).collect();
            let logits: Vec<f32> = cands.iter().map(|c| c.logit).collect();
            for p in [0.3, 0.6, 0.95] {
                let mut tmp = Vec::new();
                let found =
                    bucket_boundary(&ids, &logits, &weights, 0.0, -8.0, p * total, 1, &mut tmp);
                assert!(found.is_some(), "a boundary");
                let got = kept_ids(&cands, found);
                assert_eq!(got, by_sorting(&cands, p * total, 1), "case {case} p {p}");
            }
        }
    }

    #[test]
    fn bucket_boundary_agrees_with_sorting_on_many_rows() {
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
                let weights: Vec<f32> = cands.iter().map(|c| dense::exp_neg(c.logit)).collect();
                let bottom = cands.iter().fold(0.0f32, |m, c| m.min(c.logit));
                let mut tmp = Vec::new();
                let ids: Vec<u32> = cands.iter().map(|c| c.id).collect();
                let logits: Vec<f32> = cands.iter().map(|c| c.logit).collect();
                let found = bucket_boundary(
                    &ids, &logits, &weights, 0.0, bottom, target, min_keep, &mut tmp,
                );
                let got = kept_ids(&cands, found);
                assert_eq!(
                    got,
                    by_sorting(&cands, target, min_keep),
                    "case {case} p {p}"
                );
            }
        }
    }
}
