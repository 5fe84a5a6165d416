//! The BPE merges of a SentencePiece (`llama`) GGUF vocabulary, derived from
//! its scores as Hugging Face's converter does: every split of a mergeable
//! piece into two pieces of the vocabulary is a merge, ranked by the merged
//! piece's score (higher first), ties by the left and then the right piece's
//! id. A GGUF of this kind carries no merge list, so a tokenizer built from
//! it needs these; in Python this took about 4 s of the 6 s a 256k
//! vocabulary (Gemma's size) took to load, here about 0.1-0.25 s (the
//! split search runs on the rayon pool; `spm_merges_probe`).
//!
//! Lengths and cuts count Unicode scalar values (Python's `len` and slices).
//! Only cuts whose two sides have lengths some token has are looked up, so a
//! piece costs O(distinct token lengths), and a hostile 1 MB token is cheap.

use std::collections::HashMap;
#[cfg(test)]
use std::collections::HashSet;
use std::hash::{BuildHasherDefault, Hasher};

/// FNV-1a: pieces are short, and SipHash's set-up cost per lookup was most
/// of the time (millions of lookups for a 256k vocabulary). The keys come
/// from the model file, and a collision costs time only, never a wrong merge.
#[derive(Default)]
struct Fnv(u64);

impl Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        let mut h = if self.0 == 0 {
            0xcbf2_9ce4_8422_2325
        } else {
            self.0
        };
        for &b in bytes {
            h = (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
        }
        self.0 = h;
    }
}

type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<Fnv>>;

/// One merge: the left and right pieces' ids (a piece's last index when the
/// vocabulary repeats it).
pub type Merge = (usize, usize);

/// The merges of `tokens`, best first. `mergeable[i]` says whether token `i`
/// may be the result of a merge (normal and user-defined pieces of more than
/// one character); `scores[i]` ranks it. A piece listed twice counts once,
/// with its last score.
pub fn spm_merges(tokens: &[&str], mergeable: &[bool], scores: &[f64]) -> Vec<Merge> {
    let mut vocab: FastMap<&str, usize> = FastMap::default();
    vocab.reserve(tokens.len());
    for (i, t) in tokens.iter().enumerate() {
        vocab.insert(t, i);
    }
    // The mergeable pieces, each once (its last listing, as the map keeps the last id).
    let pieces: Vec<(&str, f64)> = tokens
        .iter()
        .enumerate()
        .filter(|&(i, t)| {
            vocab.get(t) == Some(&i)
                && mergeable.get(i).copied().unwrap_or(false)
                && t.chars().nth(1).is_some()
        })
        .map(|(i, t)| (*t, scores.get(i).copied().unwrap_or(0.0)))
        .collect();
    // Which character lengths some token has: a table, not a hashed set (it
    // is asked once per cut).
    let char_lens: Vec<usize> = tokens.iter().map(|t| t.chars().count()).collect();
    let longest = char_lens.iter().copied().max().unwrap_or(0);
    let mut known = vec![false; longest + 1];
    for &n in &char_lens {
        known[n] = true;
    }
    let lengths: Vec<usize> = (1..=longest).filter(|&n| known[n]).collect();
    // The splits, piece by piece, across the pool: each look-up is a cache
    // miss in a table of the whole vocabulary, so two cores halve it.
    let split = |chunk: &[(&str, f64)]| {
        let mut ranked: Vec<(f64, usize, usize)> = Vec::new();
        let mut bounds: Vec<usize> = Vec::new();
        for &(piece, score) in chunk {
            // Byte offset of every char boundary, so a cut of `c` chars is bounds[c].
            bounds.clear();
            bounds.extend(piece.char_indices().map(|(b, _)| b));
            let size = bounds.len();
            bounds.push(piece.len());
            for &cut in &lengths {
                if cut >= size {
                    break;
                }
                if !known[size - cut] {
                    continue;
                }
                let (left, right) = piece.split_at(bounds[cut]);
                // The right side is looked up only when the left one is a piece.
                if let Some(&l) = vocab.get(left) {
                    if let Some(&r) = vocab.get(right) {
                        ranked.push((-score, l, r));
                    }
                }
            }
        }
        ranked
    };
    let mut ranked: Vec<(f64, usize, usize)> = if pieces.len() < 4096 {
        split(&pieces)
    } else {
        use rayon::prelude::*;
        pieces.par_chunks(2048).flat_map_iter(split).collect()
    };
    ranked.sort_unstable_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    ranked.into_iter().map(|(_, l, r)| (l, r)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every split of every piece, the slow way, sorted the same way.
    fn plain(tokens: &[&str], mergeable: &[bool], scores: &[f64]) -> Vec<Merge> {
        let id = |s: &str| tokens.iter().rposition(|t| *t == s);
        let mut seen = HashSet::new();
        let mut out = Vec::new();
        for i in (0..tokens.len()).rev() {
            let t = tokens[i];
            if !mergeable[i] || t.chars().count() < 2 || !seen.insert(t) {
                continue;
            }
            let chars: Vec<char> = t.chars().collect();
            for cut in 1..chars.len() {
                let left: String = chars[..cut].iter().collect();
                let right: String = chars[cut..].iter().collect();
                if let (Some(l), Some(r)) = (id(&left), id(&right)) {
                    out.push((-scores[i], l, r));
                }
            }
        }
        out.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
        out.into_iter().map(|(_, l, r)| (l, r)).collect()
    }

    #[test]
    fn merges_equal_every_split_ranked_by_score() {
        let tokens = [
            "<unk>",
            "a",
            "b",
            "c",
            "\u{2581}",
            "ab",
            "bc",
            "abc",
            "\u{2581}a",
            "\u{2581}ab",
            "é",
            "éa",
            "aé",
            "ab",
            "x\u{2581}y",
            "zz",
        ];
        let mut mergeable = vec![true; tokens.len()];
        mergeable[0] = false;
        mergeable[15] = false; // "zz" is not mergeable (e.g. a control piece)
        let scores: Vec<f64> = (0..tokens.len()).map(|i| -((i * 7 % 5) as f64)).collect();
        let got = spm_merges(&tokens, &mergeable, &scores);
        assert_eq!(got, plain(&tokens, &mergeable, &scores));
        // "ab" is listed twice: one merge, with the later id and score.
        assert_eq!(got.iter().filter(|&&(l, r)| (l, r) == (1, 2)).count(), 1);
        // Multi-byte characters are cut on character boundaries.
        assert!(got.contains(&(10, 1)) && got.contains(&(1, 10)));
    }

    /// `cargo test --release --lib spm_merges_probe -- --ignored --nocapture`
    #[test]
    #[ignore = "a speed probe, not a test"]
    fn spm_merges_probe() {
        let alpha: Vec<char> = "abcdefghijklmnopqrstuvwxyz\u{2581}ABCDEFGHIJ"
            .chars()
            .collect();
        let mut tokens: Vec<String> = alpha.iter().map(|c| c.to_string()).collect();
        let mut seen: HashSet<String> = tokens.iter().cloned().collect();
        let mut seed = 1u64;
        while tokens.len() < 256_000 {
            seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            let a = &tokens[(seed >> 33) as usize % tokens.len().min(tokens.len() / 2 + 40)];
            let t = format!("{a}{}", alpha[(seed >> 20) as usize % alpha.len()]);
            if t.chars().count() <= 16 && seen.insert(t.clone()) {
                tokens.push(t);
            }
        }
        let refs: Vec<&str> = tokens.iter().map(String::as_str).collect();
        let scores: Vec<f64> = (0..refs.len()).map(|i| -(i as f64)).collect();
        for _ in 0..3 {
            let t = std::time::Instant::now();
            let n = spm_merges(&refs, &vec![true; refs.len()], &scores).len();
            println!("{n} merges in {:?}", t.elapsed());
        }
    }

    #[test]
    fn a_long_hostile_piece_is_cheap_and_ties_break_by_ids() {
        let long = "a".repeat(1 << 20);
        let tokens = ["a", "b", "ab", "ba", long.as_str()];
        let got = spm_merges(&tokens, &[true; 5], &[0.0; 5]);
        assert_eq!(got, [(0, 1), (1, 0)]);
    }
}
