//! XTC ("exclude top choices"): with probability `prob`, remove every
//! candidate whose probability is at least `threshold` except the least
//! likely of them, so that the most predictable continuations are skipped.

use super::candidates::{softmax, Work};

/// Apply XTC with the step's coin in `[0, 1)`; acts when `coin <= prob`.
/// Returns whether it removed anything.
pub fn apply(
    work: &mut Work<'_>,
    threshold: f32,
    prob: f32,
    min_keep: usize,
    coin: f64,
    probs: &mut Vec<f64>,
) -> bool {
    if prob <= 0.0 || coin > prob as f64 {
        return false;
    }
    work.sort_desc();
    let n = work.cands.len();
    if n < 2 {
        return false;
    }
    softmax(&work.cands, probs);
    let above = probs.iter().take_while(|&&p| p >= threshold as f64).count();
    if above < 2 {
        return false;
    }
    let drop = above - 1;
    if n - drop < min_keep {
        return false;
    }
    work.cands.drain(..drop);
    true
}
