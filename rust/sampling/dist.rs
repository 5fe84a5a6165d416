//! The final draw and the counter-based generator behind it.
//!
//! The random numbers of step `t` of sequence `s` are Philox4x64-10
//! (Salmon et al., SC'11) of the counter `[t, s, 0, 0]` under the key
//! `[seed, 0]`: a pure function of `(seed, s, t)`, identical on every machine
//! and independent of batching. Word 0 drives the draw, word 1 XTC's coin.
//!
//! The draw is inverse-CDF sampling over the candidates in ascending token id:
//! the first candidate whose running probability mass exceeds `u` is chosen.

use super::candidates::{Cand, Order, Work};
use super::dense;

const M0: u64 = 0xD2E7_470E_E14C_6C93;
const M1: u64 = 0xCA5A_8263_9512_1157;
const W0: u64 = 0x9E37_79B9_7F4A_7C15;
const W1: u64 = 0xBB67_AE85_84CA_A73B;

#[inline(always)]
fn mulhilo(a: u64, b: u64) -> (u64, u64) {
    let p = (a as u128) * (b as u128);
    ((p >> 64) as u64, p as u64)
}

/// Philox4x64 with 10 rounds.
pub fn philox4x64_10(ctr: [u64; 4], key: [u64; 2]) -> [u64; 4] {
    let mut c = ctr;
    let mut k = key;
    for round in 0..10 {
        if round > 0 {
            k[0] = k[0].wrapping_add(W0);
            k[1] = k[1].wrapping_add(W1);
        }
        let (hi0, lo0) = mulhilo(M0, c[0]);
        let (hi1, lo1) = mulhilo(M1, c[2]);
        c = [hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0];
    }
    c
}

/// A 64-bit word as a uniform double in `[0, 1)` (its top 53 bits).
#[inline]
pub fn to_unit(w: u64) -> f64 {
    (w >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// Which random number of a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    /// The final draw (and mirostat's).
    Draw = 0,
    /// XTC's coin.
    Xtc = 1,
}

/// The uniform in `[0, 1)` for `(seed, sequence, step, stream)`.
pub fn uniform(seed: u64, sequence: u64, step: u64, stream: Stream) -> f64 {
    let w = philox4x64_10([step, sequence, 0, 0], [seed, 0]);
    to_unit(w[stream as usize])
}

/// Index (into `weights`) of the first entry whose running sum exceeds
/// `u * total`; zero-weight entries are never chosen. The plain walk the
/// blocked one is tested against.
#[cfg(test)]
fn walk(weights: impl Iterator<Item = f64>, total: f64, u: f64) -> Option<usize> {
    let target = u * total;
    let mut cum = 0.0f64;
    let mut last_positive = None;
    for (i, w) in weights.enumerate() {
        if w > 0.0 {
            cum += w;
            last_positive = Some(i);
            if cum > target {
                return Some(i);
            }
        }
    }
    // Rounding left the target past the end: take the last token with mass.
    last_positive
}

/// Draw one candidate with probability proportional to `exp(logit)`.
///
/// Returns the chosen candidate and the log of the softmax normaliser
/// (relative to the max logit), for log-probabilities.
pub fn draw(work: &mut Work<'_>, u: f64, exps: &mut Vec<f32>) -> (Cand, f64, f64) {
    if let Some(d) = &work.dense {
        let row = d.row.as_slice();
        let total = dense::exp_store(row, d.max, d.scale, exps);
        let i = walk_dense(exps, total, u);
        let c = Cand {
            id: i as u32,
            logit: row[i] * d.scale,
        };
        return (c, total.ln(), (d.max * d.scale) as f64);
    }
    if work.cands.len() == 1 {
        return (work.cands[0], 0.0, work.cands[0].logit as f64);
    }
    if work.order != Order::Id {
        work.sort_id();
    }
    // The same vectorised exponential and walk as on a whole row, over the
    // candidates' logits laid side by side.
    let max = work.max_logit();
    let mut logits = std::mem::take(&mut work.spare_f32);
    logits.clear();
    logits.extend(work.cands.iter().map(|c| c.logit));
    let total = dense::exp_store(&logits, max, 1.0, exps);
    work.spare_f32 = logits;
    let i = walk_dense(exps, total, u);
    (work.cands[i], total.ln(), max as f64)
}

/// [`draw`] for candidates (id order) whose masses relative to their maximum
/// are already known (`masses[i]` for `cands[i]`, as [`dense::exp_store`]
/// computes them): the same token [`draw`] would return, without
/// recomputing the exponentials.
pub fn draw_with_masses(cands: &[Cand], masses: &[f32], u: f64) -> Cand {
    debug_assert_eq!(cands.len(), masses.len());
    if cands.len() == 1 {
        return cands[0];
    }
    let total = dense::sum_like_exp_store(masses);
    cands[walk_dense(masses, total, u)]
}

/// Sum of a block with 16 independent lanes (vectorises).
fn block_sum(block: &[f32]) -> f64 {
    let mut acc = [0.0f32; 16];
    let chunks = block.chunks_exact(16);
    let tail = chunks.remainder();
    for c in chunks {
        for (a, &e) in acc.iter_mut().zip(c) {
            *a += e;
        }
    }
    acc.iter().chain(tail).map(|&v| v as f64).sum()
}

/// Index of the first entry of `exps` whose running sum exceeds
/// `u * total`: whole 1024-entry blocks are skipped by their sums, then
/// 16-entry chunks of the block that crosses, then entries (zero-mass
/// entries are never chosen).
fn walk_dense(exps: &[f32], total: f64, u: f64) -> usize {
    const BLOCK: usize = 1024;
    let target = u * total;
    let mut cum = 0.0f64;
    for (bi, block) in exps.chunks(BLOCK).enumerate() {
        let s = block_sum(block);
        if cum + s <= target {
            cum += s;
            continue;
        }
        for (ci, chunk) in block.chunks(16).enumerate() {
            let s = block_sum(chunk);
            if cum + s <= target {
                cum += s;
                continue;
            }
            for (i, &e) in chunk.iter().enumerate() {
                if e > 0.0 {
                    cum += e as f64;
                    if cum > target {
                        return bi * BLOCK + ci * 16 + i;
                    }
                }
            }
        }
    }
    // Rounding left the target past the end: take the last token with mass.
    exps.iter().rposition(|&e| e > 0.0).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn philox_matches_the_random123_known_answers() {
        assert_eq!(
            philox4x64_10([0; 4], [0; 2]),
            [
                0x1655_4d9e_ca36_314c,
                0xdb20_fe9d_672d_0fdc,
                0xd7e7_72ce_e186_176b,
                0x7e68_b68a_ec7b_a23b
            ]
        );
        assert_eq!(
            philox4x64_10([u64::MAX; 4], [u64::MAX; 2]),
            [
                0x87b0_92c3_013f_e90b,
                0x438c_3c67_be8d_0224,
                0x9cc7_d7c6_9cd7_77b6,
                0xa09c_aebf_594f_0ba0
            ]
        );
        // Cross-checked with numpy.random.Philox (which steps the counter first).
        assert_eq!(
            philox4x64_10([5, 7, 0, 0], [123, 0]),
            [
                0xf8e3_98fc_35fb_d8d3,
                0x30b5_5885_ef1b_f84f,
                0x445d_8e63_f561_3ea6,
                0x3afc_68e0_760a_6b12
            ]
        );
    }

    #[test]
    fn the_dense_walk_matches_a_plain_walk() {
        let mut state = 3u64;
        let exps: Vec<f32> = (0..5000)
            .map(|i| {
                state = state
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1);
                if i % 7 == 0 {
                    0.0
                } else {
                    ((state >> 40) % 1000) as f32 / 1000.0
                }
            })
            .collect();
        let total: f64 = exps.iter().map(|&e| e as f64).sum();
        for k in 0..200 {
            let u = k as f64 / 200.0 + 0.001_7;
            let want = walk(exps.iter().map(|&e| e as f64), total, u).unwrap();
            let got = walk_dense(&exps, total, u);
            // Block sums may round a hair differently right at a boundary.
            assert!(got.abs_diff(want) <= 1, "u={u}: {got} vs {want}");
            assert!(exps[got] > 0.0);
        }
    }

    #[test]
    fn walk_skips_zero_mass_and_handles_rounding() {
        let w = [0.0, 1.0, 0.0, 1.0];
        assert_eq!(walk(w.iter().copied(), 2.0, 0.0), Some(1));
        assert_eq!(walk(w.iter().copied(), 2.0, 0.5), Some(3));
        assert_eq!(walk(w.iter().copied(), 2.0, 0.999_999), Some(3));
        assert_eq!(walk(w.iter().copied(), 1.5, 0.999_999), Some(3));
    }
}
