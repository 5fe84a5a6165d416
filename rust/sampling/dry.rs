//! DRY ("Don't Repeat Yourself"): penalise the token that would extend a
//! repeat of the history's latest tokens.
//!
//! For every earlier position `j` holding the newest token, the repeat length
//! `len_j` is the longest common suffix of `history[..=j]` and `history`,
//! capped by the distance to the newest sequence breaker (and by `max_ngram`
//! when it is not 0). The token that followed `j` gets
//! `multiplier * base^(len - allowed_length)` subtracted when
//! `len >= allowed_length` (the largest such length per token); breaker
//! tokens are never penalised.

use super::candidates::{edit_add, Work};
use crate::error::CoreResult;

/// DRY's knobs.
#[derive(Clone, Debug, PartialEq)]
pub struct Dry {
    pub multiplier: f32,
    pub base: f32,
    pub allowed_length: usize,
    /// Cap on the repeat length; 0 for none.
    pub max_ngram: usize,
    /// Single-token breakers, sorted.
    pub breakers: Vec<u32>,
}

impl Dry {
    fn is_breaker(&self, t: u32) -> bool {
        self.breakers.binary_search(&t).is_ok()
    }

    /// The penalty for a repeat of length `len >= allowed_length`, finite
    /// (it saturates at `f32::MAX`: a large penalty pushes a token to the
    /// bottom of the float32 range, it does not ban it).
    ///
    /// In float64, as llama.cpp's `std::pow(float, int)` is: a small
    /// multiplier times a power beyond float32's range is still finite.
    pub fn penalty(&self, len: usize) -> f32 {
        let e = (len - self.allowed_length).min(self.max_exponent() as usize);
        let e = i32::try_from(e).unwrap_or(i32::MAX);
        (self.multiplier as f64 * (self.base as f64).powi(e)).min(f32::MAX as f64) as f32
    }

    /// llama.cpp's clamp on the exponent, in its float32 arithmetic
    /// (`int(88.7228391f / logf(base))`: 128 for base 2, where float64 gives
    /// 127); `i32::MAX` (no clamp) for a base within 1e-6 of 1.
    pub fn max_exponent(&self) -> i32 {
        // llama.cpp writes 88.7228391f; that rounds to this float32.
        const FLOAT_MAX_LOG: f32 = 88.722_84;
        if self.base > 1.000_001 {
            (FLOAT_MAX_LOG / self.base.ln()) as i32
        } else {
            i32::MAX
        }
    }

    /// `(token, repeat length)` for every token DRY penalises, sorted by token.
    /// `scratch` is an all-zero slice at least as long as the vocabulary and
    /// is all-zero again on return.
    pub fn lengths(&self, history: &[u32], scratch: &mut [u32]) -> Vec<(u32, usize)> {
        let n = history.len();
        let mut out: Vec<(u32, usize)> = Vec::new();
        if n < 2 || n <= self.allowed_length {
            return out;
        }
        let rep_limit = if self.breakers.is_empty() {
            n
        } else {
            (0..n)
                .find(|&i| self.is_breaker(history[n - 1 - i]))
                .unwrap_or(n)
        };
        if rep_limit < self.allowed_length || rep_limit == 0 {
            return out;
        }
        let cap = if self.max_ngram > 0 {
            rep_limit.min(self.max_ngram)
        } else {
            rep_limit
        };
        let mut record = |j: usize, len: usize| {
            if len < self.allowed_length {
                return;
            }
            let t = history[j + 1];
            if self.is_breaker(t) {
                return;
            }
            let slot = &mut scratch[t as usize];
            if *slot == 0 {
                out.push((t, len));
                *slot = out.len() as u32;
            } else {
                let e = &mut out[*slot as usize - 1];
                e.1 = e.1.max(len);
            }
        };
        let _steps = if cap <= DIRECT_CAP {
            direct_lengths(history, cap, &mut record)
        } else {
            z_lengths(history, cap, &mut record)
        };
        #[cfg(test)]
        STEPS.with(|s| s.set(_steps));
        for &(t, _) in &out {
            scratch[t as usize] = 0;
        }
        out.sort_unstable_by_key(|&(t, _)| t);
        out
    }

    /// Subtract the penalties from the work's logits.
    pub fn apply(
        &self,
        work: &mut Work<'_>,
        history: &[u32],
        scratch: &mut [u32],
    ) -> CoreResult<()> {
        if self.multiplier == 0.0 {
            return Ok(());
        }
        let lens = self.lengths(history, scratch);
        if lens.is_empty() {
            return Ok(());
        }
        if let Some(mut row) = work.patcher() {
            for &(t, len) in &lens {
                let t = t as usize;
                row.set(t, edit_add(row.get(t), -self.penalty(len)));
            }
        } else {
            for c in &mut work.cands {
                if let Ok(i) = lens.binary_search_by_key(&c.id, |&(t, _)| t) {
                    c.logit = edit_add(c.logit, -self.penalty(lens[i].1));
                }
            }
        }
        work.after_edit()
    }
}

/// Above this cap the repeat lengths come from the Z-algorithm (linear in
/// the history) rather than a comparison per earlier occurrence of the newest
/// token (`cap` steps each: quadratic when the cap is the whole history).
const DIRECT_CAP: usize = 64;

/// Calls `f(j, len)` for every `j < n - 1` holding the newest token, with
/// `len` the longest common suffix of `history[..=j]` and `history`, capped
/// at `cap`: positions found 16 at a time, then one comparison walk each.
/// Returns the number of comparisons walked.
fn direct_lengths(history: &[u32], cap: usize, f: &mut impl FnMut(usize, usize)) -> usize {
    let mut steps = 0;
    let n = history.len();
    let last = history[n - 1];
    let mut starts = Vec::new();
    for (ci, c) in history[..n - 1].chunks(16).enumerate() {
        if c.iter().fold(false, |any, &t| any | (t == last)) {
            for (i, &t) in c.iter().enumerate() {
                if t == last {
                    starts.push(ci * 16 + i);
                }
            }
        }
    }
    for j in starts {
        let mut len = 1;
        while len < cap && len <= j && history[j - len] == history[n - 1 - len] {
            len += 1;
        }
        steps += len;
        f(j, len);
    }
    steps
}

/// [`direct_lengths`] in linear time: the Z-array of the reversed history
/// (`z[i]`, the longest common prefix of the reversed history and its suffix
/// from `i`) is the common-suffix length for `j = n - 1 - i`.
fn z_lengths(history: &[u32], cap: usize, f: &mut impl FnMut(usize, usize)) -> usize {
    let n = history.len();
    let mut steps = 0;
    let r = |i: usize| history[n - 1 - i];
    let mut z = vec![0usize; n];
    let (mut lo, mut hi) = (0usize, 0usize);
    for i in 1..n {
        let mut k = if i < hi { (hi - i).min(z[i - lo]) } else { 0 };
        while i + k < n && r(k) == r(i + k) {
            k += 1;
            steps += 1;
        }
        z[i] = k;
        if i + k > hi {
            (lo, hi) = (i, i + k);
        }
        if k > 0 {
            f(n - 1 - i, k.min(cap));
        }
    }
    steps + n
}

#[cfg(test)]
thread_local! {
    /// Comparisons of the last `lengths` call on this thread.
    static STEPS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exponent_clamp_is_llama_cpps_float32_one() {
        let d = |base: f32| Dry {
            multiplier: 1.0,
            base,
            allowed_length: 2,
            max_ngram: 0,
            breakers: Vec::new(),
        };
        assert_eq!(d(2.0).max_exponent(), 128);
        assert_eq!(d(1.75).max_exponent(), 158);
        assert_eq!(d(1.0).max_exponent(), i32::MAX);
        assert_eq!(d(2.0).penalty(2 + 127), 2f32.powi(127));
        // 2^-125 * 2^128 = 8: finite, though 2^128 alone is not in float32.
        let small = Dry {
            multiplier: 2f32.powi(-125),
            ..d(2.0)
        };
        assert_eq!(small.penalty(2 + 300), 8.0);
    }

    fn dry(allowed: usize, breakers: Vec<u32>) -> Dry {
        Dry {
            multiplier: 1.0,
            base: 1.1,
            allowed_length: allowed,
            max_ngram: 0,
            breakers,
        }
    }

    #[test]
    fn llama_cpp_comment_example() {
        // a b c c b c y a b c: the token after each earlier "c" gets that repeat length.
        let h = [0, 1, 2, 2, 1, 2, 9, 0, 1, 2];
        let mut s = vec![0u32; 16];
        let lens = dry(1, vec![]).lengths(&h, &mut s);
        // j=2 (len 3) -> token 2; j=3 (len 1) -> token 1; j=5 (len 2) -> token 9.
        assert_eq!(lens, vec![(1, 1), (2, 3), (9, 2)]);
        assert!(s.iter().all(|&v| v == 0));
    }

    #[test]
    fn llama_cpp_test_value() {
        let mut s = vec![0u32; 4];
        let d = dry(2, vec![]);
        assert_eq!(d.lengths(&[0, 1, 2, 0, 1], &mut s), vec![(2, 2)]);
        assert_eq!(d.penalty(2), 1.0);
    }

    #[test]
    fn the_z_algorithm_agrees_with_the_direct_walk() {
        let mut state = 5u64;
        for case in 0..500 {
            let n = 2 + case % 300;
            let alphabet = 1 + (case / 7) % 4;
            let h: Vec<u32> = (0..n)
                .map(|_| {
                    state = state
                        .wrapping_mul(6_364_136_223_846_793_005)
                        .wrapping_add(1);
                    ((state >> 40) % alphabet as u64) as u32
                })
                .collect();
            for cap in [1, 3, 64, 65, n] {
                let (mut a, mut b) = (Vec::new(), Vec::new());
                direct_lengths(&h, cap, &mut |j, l| a.push((j, l)));
                z_lengths(&h, cap, &mut |j, l| b.push((j, l)));
                a.sort_unstable();
                b.sort_unstable();
                assert_eq!(a, b, "case {case} cap {cap}");
            }
        }
    }

    #[test]
    fn an_uncapped_repeat_is_linear_in_the_history() {
        // One token repeated: every earlier position matches the whole way,
        // n^2 / 2 comparisons for a walk per position.
        let n = 20_000;
        let h = vec![3u32; n];
        let mut s = vec![0u32; 8];
        let lens = dry(2, vec![]).lengths(&h, &mut s);
        assert_eq!(lens, vec![(3, n - 1)]);
        let steps = STEPS.with(|s| s.get());
        assert!(steps <= 3 * n, "{steps} comparisons for {n} tokens");
    }

    #[test]
    fn a_huge_penalty_saturates_instead_of_banning() {
        let d = Dry {
            multiplier: f32::MAX,
            base: 3.0,
            allowed_length: 1,
            max_ngram: 0,
            breakers: vec![],
        };
        assert_eq!(d.penalty(50), f32::MAX);
        assert_eq!(
            crate::sampling::candidates::edit_add(-1.0, -d.penalty(50)),
            f32::MIN
        );
    }

    #[test]
    fn a_breaker_as_newest_token_disables() {
        let mut s = vec![0u32; 8];
        assert!(dry(1, vec![7]).lengths(&[1, 2, 1, 2, 7], &mut s).is_empty());
    }
}
