//! Logit bias: add a fixed amount to chosen tokens' logits (`-inf` bans).

use super::candidates::Work;
use crate::error::CoreResult;

/// Add `bias` (sorted by token, ids already checked against the vocabulary).
pub fn apply(work: &mut Work<'_>, bias: &[(u32, f32)]) -> CoreResult<()> {
    if bias.is_empty() {
        return Ok(());
    }
    if let Some((row, scale)) = work.row_mut() {
        for &(t, b) in bias {
            let v = &mut row[t as usize];
            *v = (*v * scale + b) / scale;
        }
    } else {
        for c in &mut work.cands {
            if let Ok(i) = bias.binary_search_by_key(&c.id, |&(t, _)| t) {
                c.logit += bias[i].1;
            }
        }
    }
    work.after_edit()
}
