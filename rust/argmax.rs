//! Greedy pick over a logits row: the lowest index wins ties, NaN is refused.
//!
//! One lane-parallel pass keeps, per lane, the maximum, the first index holding
//! it, and whether a NaN went by. The fixed-width lane loop vectorises on every
//! target; on x86-64 an AVX2 copy of the same code is chosen at run time.

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
    let (best, max, has_nan) = argmax_nan(logits);
    if has_nan {
        let index = logits.iter().position(|v| v.is_nan()).unwrap_or(0);
        return Err(CoreError::NanLogit { index });
    }
    if max == f32::NEG_INFINITY {
        return Err(CoreError::AllBanned);
    }
    Ok(best)
}

/// Maximum of the row and whether any entry is NaN (NaN is ignored by the max).
pub fn max_and_nan(logits: &[f32]) -> (f32, bool) {
    let (_, max, nan) = argmax_nan(logits);
    (max, nan)
}

/// One pass: `(index of the first maximum, the maximum, whether any entry is
/// NaN)`. NaN never becomes the maximum; a row with nothing above `-inf`
/// gives index 0. The sampler chain's greedy and first-pass scans use this too.
pub fn argmax_nan(logits: &[f32]) -> (usize, f32, bool) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2, checked just above.
            return unsafe { scan_avx2(logits) };
        }
    }
    scan_generic(logits)
}

/// AVX2 path. The row is cut into blocks of [`BLOCK`] floats; a block's
/// maximum is found with plain `max` (four accumulators so the chains overlap)
/// and only a block that raises the running maximum is remembered. The first
/// index of the maximum is then looked up inside that one block. NaN is
/// tracked with an unordered compare alongside. Same result as
/// [`scan_generic`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn scan_avx2(xs: &[f32]) -> (usize, f32, bool) {
    use std::arch::x86_64::{
        __m256, _mm256_cmp_ps, _mm256_loadu_ps, _mm256_max_ps, _mm256_movemask_ps, _mm256_or_ps,
        _mm256_set1_ps, _mm256_setzero_ps, _mm256_storeu_ps, _CMP_UNORD_Q,
    };
    const BLOCK: usize = 512;
    let n = xs.len();
    let ptr = xs.as_ptr();
    let mut max = f32::NEG_INFINITY;
    let mut best_block = usize::MAX;
    let mut vnan = _mm256_setzero_ps();
    let mut start = 0;
    while start + BLOCK <= n {
        let mut acc: [__m256; 4] = [_mm256_set1_ps(f32::NEG_INFINITY); 4];
        let mut j = start;
        while j < start + BLOCK {
            for (u, a) in acc.iter_mut().enumerate() {
                // SAFETY: j + 8 * u + 8 <= start + BLOCK <= n: in bounds.
                let v = unsafe { _mm256_loadu_ps(ptr.add(j + 8 * u)) };
                // `max_ps(v, a)` returns `a` when `v` is NaN, so NaN never wins.
                *a = _mm256_max_ps(v, *a);
                vnan = _mm256_or_ps(vnan, _mm256_cmp_ps::<_CMP_UNORD_Q>(v, v));
            }
            j += 32;
        }
        let folded = _mm256_max_ps(_mm256_max_ps(acc[0], acc[1]), _mm256_max_ps(acc[2], acc[3]));
        let mut lanes = [0f32; 8];
        // SAFETY: `lanes` holds exactly eight floats.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), folded) };
        let block_max = lanes
            .iter()
            .fold(f32::NEG_INFINITY, |m, &v| if v > m { v } else { m });
        if block_max > max {
            max = block_max;
            best_block = start;
        }
        start += BLOCK;
    }
    let nan = _mm256_movemask_ps(vnan) != 0;
    let (t_best, t_max, t_nan) = scan_plain(&xs[start..], start);
    if t_max > max {
        return (t_best, t_max, nan | t_nan);
    }
    if best_block == usize::MAX {
        // Nothing anywhere rose above -inf: index 0 is the first maximum.
        return (0, max, nan | t_nan);
    }
    let block = &xs[best_block..best_block + BLOCK];
    let offset = block.iter().position(|&v| v == max).unwrap_or(0);
    (best_block + offset, max, nan | t_nan)
}

/// Portable path, same blocking as the AVX2 one over fixed-width lane arrays
/// (which the compiler turns into SSE2 or NEON). Rows whose maximum is in a
/// block are resolved inside that block.
#[inline(always)]
fn scan_generic(xs: &[f32]) -> (usize, f32, bool) {
    const BLOCK: usize = 512;
    let mut max = f32::NEG_INFINITY;
    let mut best_block = usize::MAX;
    let mut nan = false;
    let mut start = 0;
    let blocks = xs.chunks_exact(BLOCK);
    let tail = blocks.remainder();
    for block in blocks {
        let mut lane_max = [f32::NEG_INFINITY; LANES];
        let mut lane_nan = [0u32; LANES];
        for chunk in block.chunks_exact(LANES) {
            for i in 0..LANES {
                let v = chunk[i];
                // `v > m` is false for NaN, so NaN never becomes the max.
                lane_max[i] = if v > lane_max[i] { v } else { lane_max[i] };
                lane_nan[i] |= u32::from(v.is_nan());
            }
        }
        nan |= lane_nan.iter().any(|&b| b != 0);
        let block_max = lane_max
            .iter()
            .fold(f32::NEG_INFINITY, |m, &v| if v > m { v } else { m });
        if block_max > max {
            max = block_max;
            best_block = start;
        }
        start += BLOCK;
    }
    let (t_best, t_max, t_nan) = scan_plain(tail, start);
    nan |= t_nan;
    if t_max > max {
        return (t_best, t_max, nan);
    }
    if best_block == usize::MAX {
        return (0, max, nan);
    }
    let block = &xs[best_block..best_block + BLOCK];
    let offset = block.iter().position(|&v| v == max).unwrap_or(0);
    (best_block + offset, max, nan)
}

fn scan_plain(xs: &[f32], offset: usize) -> (usize, f32, bool) {
    let mut best = usize::MAX;
    let mut max = f32::NEG_INFINITY;
    let mut nan = false;
    for (i, &v) in xs.iter().enumerate() {
        if v > max {
            max = v;
            best = offset + i;
        }
        nan |= v.is_nan();
    }
    if best == usize::MAX {
        best = offset;
    }
    (best, max, nan)
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
    fn portable_and_simd_paths_agree() {
        let mut state = 7u64;
        for len in [1usize, 31, 32, 511, 512, 513, 2048, 3000] {
            for _ in 0..20 {
                let row: Vec<f32> = (0..len)
                    .map(|_| {
                        state = state
                            .wrapping_mul(6_364_136_223_846_793_005)
                            .wrapping_add(1);
                        match (state >> 40) % 11 {
                            0 => f32::NEG_INFINITY,
                            1 => f32::INFINITY,
                            k => k as f32,
                        }
                    })
                    .collect();
                assert_eq!(argmax_nan(&row).0, scan_generic(&row).0, "len {len}");
                assert_eq!(argmax_nan(&row).0, reference(&row), "len {len}");
            }
        }
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
        for len in (1..200).chain([511, 512, 513, 1024, 1500, 4097]) {
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
