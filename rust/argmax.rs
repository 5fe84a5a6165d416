//! Greedy pick over a logits row: the lowest index wins ties, NaN is refused.
//!
//! Two passes over the row: a lane-parallel maximum (which also notices NaN)
//! and a scan for the first position holding that maximum. The lane-parallel
//! form vectorises on every target; on x86-64 an AVX2 copy of the same code is
//! chosen at run time when the CPU has it.

use crate::error::{CoreError, CoreResult};

const LANES: usize = 16;

/// Index of the largest logit (lowest index on ties).
///
/// Errors on an empty row, on any NaN (naming its position), and on a row
/// that is entirely `-inf`.
pub fn argmax(logits: &[f32]) -> CoreResult<usize> {
    if logits.is_empty() {
        return Err(CoreError::EmptyLogits);
    }
    let (max, has_nan) = max_and_nan(logits);
    if has_nan {
        let index = logits.iter().position(|v| v.is_nan()).unwrap_or(0);
        return Err(CoreError::NanLogit { index });
    }
    if max == f32::NEG_INFINITY {
        return Err(CoreError::AllBanned);
    }
    // `max` is a value of the row, so this always finds it.
    Ok(logits.iter().position(|&v| v == max).unwrap_or(0))
}

/// Maximum of the row and whether any entry is NaN (NaN is ignored by the max).
pub fn max_and_nan(logits: &[f32]) -> (f32, bool) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2, checked just above.
            return unsafe { max_and_nan_avx2(logits) };
        }
    }
    max_and_nan_generic(logits)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn max_and_nan_avx2(logits: &[f32]) -> (f32, bool) {
    max_and_nan_generic(logits)
}

#[inline(always)]
fn max_and_nan_generic(logits: &[f32]) -> (f32, bool) {
    let mut lane_max = [f32::NEG_INFINITY; LANES];
    let mut lane_nan = [false; LANES];
    let chunks = logits.chunks_exact(LANES);
    let tail = chunks.remainder();
    for chunk in chunks {
        for i in 0..LANES {
            let v = chunk[i];
            // `v > m` is false for NaN, so NaN never becomes the max.
            lane_max[i] = if v > lane_max[i] { v } else { lane_max[i] };
            lane_nan[i] |= v.is_nan();
        }
    }
    let mut max = f32::NEG_INFINITY;
    let mut nan = false;
    for i in 0..LANES {
        if lane_max[i] > max {
            max = lane_max[i];
        }
        nan |= lane_nan[i];
    }
    for &v in tail {
        if v > max {
            max = v;
        }
        nan |= v.is_nan();
    }
    (max, nan)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference(xs: &[f32]) -> usize {
        let mut best = 0;
        for (i, &v) in xs.iter().enumerate() {
            if v > xs[best] {
                best = i;
            }
        }
        best
    }

    #[test]
    fn ties_go_to_the_lowest_index() {
        let mut row = vec![0.0f32; 100];
        row[17] = 3.0;
        row[40] = 3.0;
        row[99] = 3.0;
        assert_eq!(argmax(&row), Ok(17));
    }

    #[test]
    fn nan_is_refused_with_its_position() {
        let mut row = vec![1.0f32; 50];
        row[33] = f32::NAN;
        row[45] = f32::NAN;
        assert_eq!(argmax(&row), Err(CoreError::NanLogit { index: 33 }));
    }

    #[test]
    fn empty_and_all_banned_rows_are_errors() {
        assert_eq!(argmax(&[]), Err(CoreError::EmptyLogits));
        assert_eq!(argmax(&[f32::NEG_INFINITY; 40]), Err(CoreError::AllBanned));
    }

    #[test]
    fn infinities_are_ordinary_values() {
        assert_eq!(
            argmax(&[f32::NEG_INFINITY, -1e30, f32::INFINITY, 5.0, f32::INFINITY]),
            Ok(2)
        );
    }

    #[test]
    fn agrees_with_a_plain_loop_on_many_lengths() {
        // A small deterministic LCG covers tails of every length around the lane width.
        let mut state = 0x2545_f491_4f6c_dd1du64;
        for len in 1..200 {
            let row: Vec<f32> = (0..len)
                .map(|_| {
                    state = state
                        .wrapping_mul(6_364_136_223_846_793_005)
                        .wrapping_add(1);
                    // Coarse values so ties are common.
                    ((state >> 33) % 7) as f32 - 3.0
                })
                .collect();
            assert_eq!(argmax(&row), Ok(reference(&row)), "len {len}: {row:?}");
        }
    }
}
