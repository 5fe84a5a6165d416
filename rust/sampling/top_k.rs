//! Top-k: keep the `k` highest logits (ties at the k-th rank go to the lowest
//! ids, or are all kept in the engines that do so).

use super::candidates::Work;

/// Keep the `k` best-ranked candidates; `k == 0` keeps everything.
pub fn apply(work: &mut Work<'_>, k: usize, keep_ties: bool, delta: &mut f32) {
    if k == 0 {
        return;
    }
    work.top_k(k, keep_ties, delta);
}
