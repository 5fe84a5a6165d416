//! Logit bias: add a fixed amount to chosen tokens' logits (`-inf` bans; a
//! finite sum saturates at the float32 range instead of overflowing).

use super::candidates::{edit_add, Work};
use crate::error::CoreResult;

/// Add `bias` (sorted by token, ids already checked against the vocabulary).
pub fn apply(work: &mut Work<'_>, bias: &[(u32, f32)]) -> CoreResult<()> {
    if bias.is_empty() {
        return Ok(());
    }
    if let Some(mut row) = work.patcher() {
        for &(t, b) in bias {
            let t = t as usize;
            row.set(t, edit_add(row.get(t), b));
        }
    } else {
        for c in &mut work.cands {
            if let Ok(i) = bias.binary_search_by_key(&c.id, |&(t, _)| t) {
                c.logit = edit_add(c.logit, bias[i].1);
            }
        }
    }
    work.after_edit()
}
