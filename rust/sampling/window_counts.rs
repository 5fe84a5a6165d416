//! Token counts of the penalty window, kept from one sampling call to the
//! next.
//!
//! A decode loop passes a history that grew by a token (and, once the window
//! is full, lost its oldest one) since the last call. Recounting 4096 tokens
//! into a vocabulary-sized array costs more than the rest of a classic chain,
//! so the counts of the last window are kept and brought up to date by the
//! difference. The stored window is compared with the new one on every call,
//! so a history that changed in any other way is simply recounted: the counts
//! are always those of the window passed in.

/// Counts of every token in the last window seen.
#[derive(Debug, Default, Clone)]
pub struct WindowCounts {
    /// The window the counts describe.
    window: Vec<u32>,
    /// `counts[t]` = occurrences of `t` in `window`; never shrinks, so it
    /// covers every token of `window`.
    counts: Vec<u32>,
}

/// How far back a shifted window is looked for before recounting.
const MAX_SHIFT: usize = 8;

impl WindowCounts {
    /// Bring the counts to those of `window` (every token `< vocab`).
    pub fn sync(&mut self, window: &[u32], vocab: usize) {
        if self.counts.len() < vocab {
            self.counts.resize(vocab, 0);
        }
        let old = self.window.len();
        // The same window, or the old one with tokens appended.
        if window.len() >= old && window[..old] == self.window[..] {
            self.add(window.len() - old, window);
            return;
        }
        // The old window minus its first `d` tokens, with tokens appended.
        for d in 1..=MAX_SHIFT.min(old) {
            let kept = old - d;
            if window.len() >= kept
                && window.len() - kept <= MAX_SHIFT
                && window.first() == self.window.get(d)
                && window[..kept] == self.window[d..]
            {
                for &t in &self.window[..d] {
                    self.counts[t as usize] -= 1;
                }
                self.window.drain(..d);
                self.add(window.len() - kept, window);
                return;
            }
        }
        for &t in &self.window {
            self.counts[t as usize] = 0;
        }
        self.window.clear();
        self.add(window.len(), window);
    }

    /// Count the last `n` tokens of `window` and append them to the stored one.
    fn add(&mut self, n: usize, window: &[u32]) {
        let new = &window[window.len() - n..];
        for &t in new {
            self.counts[t as usize] += 1;
        }
        self.window.extend_from_slice(new);
    }

    /// Occurrences of `t` in the synced window.
    #[inline]
    pub fn count(&self, t: u32) -> u32 {
        self.counts.get(t as usize).copied().unwrap_or(0)
    }

    /// The synced window.
    pub fn window(&self) -> &[u32] {
        &self.window
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn brute(window: &[u32], t: u32) -> u32 {
        window.iter().filter(|&&x| x == t).count() as u32
    }

    #[test]
    fn follows_growing_sliding_and_unrelated_windows() {
        let mut state = 7u64;
        let mut next = |m: u32| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1);
            ((state >> 33) % m as u64) as u32
        };
        let mut wc = WindowCounts::default();
        let mut history: Vec<u32> = Vec::new();
        for step in 0..400 {
            match next(10) {
                // Usual decode: one token appended.
                0..=5 => history.push(next(50)),
                // Several appended (speculative decoding).
                6 => history.extend((0..next(12)).map(|_| next(50))),
                // Rolled back a few tokens.
                7 => history.truncate(history.len().saturating_sub(next(5) as usize)),
                // Same history again.
                8 => {}
                // Replaced by something unrelated.
                _ => history = (0..next(80)).map(|_| next(50)).collect(),
            }
            let window = &history[history.len().saturating_sub(32)..];
            wc.sync(window, 50);
            assert_eq!(wc.window(), window, "step {step}");
            for t in 0..50 {
                assert_eq!(wc.count(t), brute(window, t), "step {step} token {t}");
            }
        }
    }

    #[test]
    fn a_larger_vocabulary_keeps_the_counts() {
        let mut wc = WindowCounts::default();
        wc.sync(&[3, 3, 1], 4);
        wc.sync(&[3, 3, 1, 9], 10);
        assert_eq!((wc.count(3), wc.count(1), wc.count(9)), (2, 1, 1));
        // A smaller one afterwards still counts correctly.
        wc.sync(&[1], 2);
        assert_eq!((wc.count(3), wc.count(1), wc.count(9)), (0, 1, 0));
    }
}
