//! Min-p: keep the candidates whose probability is at least `p` times the
//! largest one, tested in logit space (`l >= l_max + ln p`, no softmax).

use super::candidates::{Order, Work};
use super::dense;

/// Apply min-p (`p <= 0` keeps everything); at least `min_keep` survive.
pub fn apply(work: &mut Work<'_>, p: f32, min_keep: usize, delta: &mut f32) {
    if p <= 0.0 {
        return;
    }
    let thr = work.max_logit() + p.ln();
    if let Some(d) = &work.dense {
        work.cands.clear();
        dense::gather_ge(d.row.as_slice(), d.scale, thr, &mut work.cands);
        if work.cands.len() < min_keep {
            work.top_k(min_keep, false, delta);
            return;
        }
        work.order = Order::Id;
        work.release_dense();
        return;
    }
    let n = work.cands.iter().filter(|c| c.logit >= thr).count();
    if n < min_keep {
        work.top_k(min_keep, false, delta);
    } else {
        work.cands.retain(|c| c.logit >= thr);
    }
}
