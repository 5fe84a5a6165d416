//! Repetition, frequency and presence penalties over the most recent tokens.
//!
//! For a token seen `c > 0` times in the window:
//! `l' = (l <= 0 ? l * repeat : l / repeat) - c * frequency - presence`.

use super::candidates::Work;
use crate::error::CoreResult;

/// The three penalties and the window they look at.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Penalties {
    pub repeat: f32,
    pub frequency: f32,
    pub presence: f32,
    /// How many of the most recent history tokens count (`None`: all).
    pub window: Option<usize>,
}

impl Penalties {
    /// True when the stage changes nothing.
    pub fn is_neutral(&self) -> bool {
        self.repeat == 1.0 && self.frequency == 0.0 && self.presence == 0.0
    }

    /// The penalised value of logit `l` for a token seen `count` times.
    #[inline]
    pub fn penalize(&self, l: f32, count: u32) -> f32 {
        if count == 0 {
            return l;
        }
        let v = if l <= 0.0 {
            l * self.repeat
        } else {
            l / self.repeat
        };
        let v = v - (count as f32 * self.frequency + self.presence);
        if l > f32::NEG_INFINITY {
            v.clamp(f32::MIN, f32::MAX)
        } else {
            v
        }
    }

    /// The tokens the penalties look at.
    pub fn window<'h>(&self, history: &'h [u32]) -> &'h [u32] {
        let n = self.window.map_or(history.len(), |w| w.min(history.len()));
        &history[history.len() - n..]
    }

    /// Apply to the work. `counts` is an all-zero scratch at least as long as
    /// the vocabulary; it is all-zero again on return.
    pub fn apply(
        &self,
        work: &mut Work<'_>,
        history: &[u32],
        counts: &mut [u32],
    ) -> CoreResult<()> {
        let window = self.window(history);
        if self.is_neutral() || window.is_empty() {
            return Ok(());
        }
        if let Some(mut row) = work.patcher() {
            for &t in window {
                counts[t as usize] += 1;
            }
            for &t in window {
                let c = std::mem::take(&mut counts[t as usize]);
                if c > 0 {
                    let t = t as usize;
                    row.set(t, self.penalize(row.get(t), c));
                }
            }
        } else {
            for &t in window {
                counts[t as usize] += 1;
            }
            for c in &mut work.cands {
                c.logit = self.penalize(c.logit, counts[c.id as usize]);
            }
            for &t in window {
                counts[t as usize] = 0;
            }
        }
        work.after_edit()
    }
}
