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
    /// Frequency and presence count only the window's output part (after
    /// `prompt_len`); the repetition penalty still sees all of it (vLLM).
    pub output_only: bool,
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

    /// Whether a call with this `prompt_len` needs separate prompt and
    /// output counts (vLLM's split, with frequency or presence set).
    pub fn splits(&self, prompt_len: usize) -> bool {
        self.output_only && prompt_len > 0 && (self.frequency != 0.0 || self.presence != 0.0)
    }

    /// vLLM's rule for a token seen in prompt or output (`seen`) and
    /// `out` times in the output: the repetition penalty if seen, then
    /// `out * frequency + (out > 0) * presence`.
    #[inline]
    fn penalize_split(&self, l: f32, seen: bool, out: u32) -> f32 {
        if !seen {
            return l;
        }
        let v = if l <= 0.0 {
            l * self.repeat
        } else {
            l / self.repeat
        };
        let v = if out > 0 {
            v - (out as f32 * self.frequency + self.presence)
        } else {
            v
        };
        if l > f32::NEG_INFINITY {
            v.clamp(f32::MIN, f32::MAX)
        } else {
            v
        }
    }

    /// [`Self::apply`] with the history's first `prompt_len` tokens as the
    /// prompt: under vLLM's rule they count for the repetition penalty only.
    pub fn apply_split(
        &self,
        work: &mut Work<'_>,
        history: &[u32],
        prompt_len: usize,
        counts: &mut [u32],
    ) -> CoreResult<()> {
        if !self.splits(prompt_len) {
            return self.apply(work, history, counts);
        }
        let window = self.window(history);
        if self.is_neutral() || window.is_empty() {
            return Ok(());
        }
        // The window's first `cut` tokens are prompt.
        let start = history.len() - window.len();
        let cut = prompt_len.saturating_sub(start).min(window.len());
        const SEEN: u32 = 1 << 31;
        for &t in &window[..cut] {
            counts[t as usize] |= SEEN;
        }
        for &t in &window[cut..] {
            let c = &mut counts[t as usize];
            *c = (*c | SEEN) + 1;
        }
        let split = |c: u32| (c & SEEN != 0, c & !SEEN);
        if let Some(mut row) = work.patcher() {
            for &t in window {
                let c = std::mem::take(&mut counts[t as usize]);
                if c != 0 {
                    let (seen, out) = split(c);
                    let t = t as usize;
                    row.set(t, self.penalize_split(row.get(t), seen, out));
                }
            }
        } else {
            for c in &mut work.cands {
                let (seen, out) = split(counts[c.id as usize]);
                c.logit = self.penalize_split(c.logit, seen, out);
            }
            for &t in window {
                counts[t as usize] = 0;
            }
        }
        work.after_edit()
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
