//! Attention of one query head over cached keys and values, read where the
//! cache stores them (float32 or float16 rows, no widened copy):
//! `softmax(q . K^T * scale) . V`.
//!
//! Keys and values come as segments (the cached rows, then the step's own
//! rows) and give the same bits as over their concatenation. The build is
//! chosen once per process: AVX2 + FMA + F16C (fused multiply-adds over
//! eight lanes, a polynomial `exp` of about 2 ulp) where the CPU has them
//! and the head size is a multiple of 8, else portable Rust (libm's `exp`).
//! Every path of the engine calls this one function, so a sequence gets the
//! same bits alone, batched, or in a team's decode step.

use std::sync::OnceLock;

use crate::kv::{f16_to_f32, Rows};

/// Rows `[t, hd]` of keys or values as stored.
pub(crate) type Seg<'a> = Rows<'a>;

/// Rows `from..to` of `rows` (`hd` values a row).
pub(crate) fn slice_rows(rows: Rows<'_>, from: usize, to: usize, hd: usize) -> Rows<'_> {
    match rows {
        Rows::F32(r) => Rows::F32(&r[from * hd..to * hd]),
        Rows::F16(r) => Rows::F16(&r[from * hd..to * hd]),
    }
}

fn seg_rows(s: &Seg<'_>, hd: usize) -> usize {
    match s {
        Rows::F32(r) => r.len() / hd,
        Rows::F16(r) => r.len() / hd,
    }
}

#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
fn avx2() -> bool {
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
                && std::arch::is_x86_feature_detected!("f16c")
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    })
}

/// `softmax(qv . K^T * scale) . V` over `segments` of (keys, values), each
/// `[t_i, hd]`, into `out` (`hd`). `scores` is scratch.
pub(crate) fn attend(
    qv: &[f32],
    segments: &[(Seg<'_>, Seg<'_>)],
    hd: usize,
    scale: f32,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if hd.is_multiple_of(8) && hd <= 256 && avx2() {
        // SAFETY: the features were detected.
        unsafe { x86::attend(qv, segments, hd, scale, scores, out) };
        return;
    }
    portable(qv, segments, hd, scale, scores, out);
}

fn portable(
    qv: &[f32],
    segments: &[(Seg<'_>, Seg<'_>)],
    hd: usize,
    scale: f32,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    let mut row = vec![0.0f32; hd];
    let widen = |s: &Seg<'_>, i: usize, row: &mut [f32]| match s {
        Rows::F32(r) => row.copy_from_slice(&r[i * hd..(i + 1) * hd]),
        Rows::F16(r) => row
            .iter_mut()
            .zip(&r[i * hd..(i + 1) * hd])
            .for_each(|(y, &b)| *y = f16_to_f32(b)),
    };
    scores.clear();
    for (keys, _) in segments {
        for i in 0..seg_rows(keys, hd) {
            widen(keys, i, &mut row);
            scores.push(dot(qv, &row) * scale);
        }
    }
    let max = scores.iter().fold(f32::NEG_INFINITY, |m, &s| m.max(s));
    let mut sum = 0.0f32;
    for s in scores.iter_mut() {
        *s = (*s - max).exp();
        sum += *s;
    }
    let inv = 1.0 / sum;
    out.iter_mut().for_each(|o| *o = 0.0);
    let mut p = scores.iter();
    for (_, values) in segments {
        for i in 0..seg_rows(values, hd) {
            widen(values, i, &mut row);
            let w = p.next().copied().unwrap_or(0.0) * inv;
            out.iter_mut().zip(&row).for_each(|(o, &x)| *o += w * x);
        }
    }
}

#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    acc.iter().sum::<f32>() + tail
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{seg_rows, Seg};
    use crate::kv::Rows;
    use std::arch::x86_64::*;

    /// Eight values of row `i` of `s` from column `c`.
    #[inline(always)]
    unsafe fn load(s: &Seg<'_>, at: usize) -> __m256 {
        // SAFETY: 8 values at `at` (caller).
        unsafe {
            match s {
                Rows::F32(r) => _mm256_loadu_ps(r.as_ptr().add(at)),
                Rows::F16(r) => _mm256_cvtph_ps(_mm_loadu_si128(r.as_ptr().add(at).cast())),
            }
        }
    }

    #[inline(always)]
    unsafe fn hsum(v: __m256) -> f32 {
        // SAFETY: AVX present (caller).
        unsafe {
            let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
            let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            let s = _mm_add_ss(s, _mm_movehdup_ps(s));
            _mm_cvtss_f32(s)
        }
    }

    /// `exp(x)` for `x <= 0` (Cephes' polynomial; below -87.3 it is about
    /// 1e-38 instead of 0, which no softmax weight can tell apart).
    #[inline(always)]
    unsafe fn exp_neg(x: __m256) -> __m256 {
        // SAFETY: AVX2 + FMA present (caller).
        unsafe {
            let x = _mm256_max_ps(x, _mm256_set1_ps(-87.336_55));
            let fx = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
                _mm256_mul_ps(x, _mm256_set1_ps(std::f32::consts::LOG2_E)),
            );
            let r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693_359_4), x);
            let r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.121_944_4e-4), r);
            let mut y = _mm256_set1_ps(1.987_569_1e-4);
            for c in [
                1.398_199_9e-3,
                8.333_452e-3,
                4.166_579_6e-2,
                0.166_666_65,
                0.5,
            ] {
                y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(c));
            }
            let y = _mm256_fmadd_ps(
                y,
                _mm256_mul_ps(r, r),
                _mm256_add_ps(r, _mm256_set1_ps(1.0)),
            );
            let n = _mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127));
            _mm256_mul_ps(y, _mm256_castsi256_ps(_mm256_slli_epi32::<23>(n)))
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn attend(
        qv: &[f32],
        segments: &[(Seg<'_>, Seg<'_>)],
        hd: usize,
        scale: f32,
        scores: &mut Vec<f32>,
        out: &mut [f32],
    ) {
        let lanes = hd / 8;
        let mut q = [_mm256_setzero_ps(); 32];
        for (c, q) in q.iter_mut().take(lanes).enumerate() {
            // SAFETY: qv holds hd values.
            *q = unsafe { _mm256_loadu_ps(qv.as_ptr().add(8 * c)) };
        }
        scores.clear();
        for (keys, _) in segments {
            for i in 0..seg_rows(keys, hd) {
                let mut acc = _mm256_setzero_ps();
                for (c, q) in q.iter().take(lanes).enumerate() {
                    // SAFETY: row i holds hd values.
                    acc = _mm256_fmadd_ps(*q, unsafe { load(keys, i * hd + 8 * c) }, acc);
                }
                // SAFETY: AVX present.
                scores.push(unsafe { hsum(acc) } * scale);
            }
        }
        let t = scores.len();
        let max = scores.iter().fold(f32::NEG_INFINITY, |m, &s| m.max(s));
        let mv = _mm256_set1_ps(max);
        let mut sums = _mm256_setzero_ps();
        let whole = t / 8 * 8;
        for at in (0..whole).step_by(8) {
            // SAFETY: 8 scores at `at`.
            unsafe {
                let p = scores.as_mut_ptr().add(at);
                let e = exp_neg(_mm256_sub_ps(_mm256_loadu_ps(p), mv));
                _mm256_storeu_ps(p, e);
                sums = _mm256_add_ps(sums, e);
            }
        }
        // SAFETY: AVX present.
        let mut sum = unsafe { hsum(sums) };
        if whole < t {
            let mut tail = [-1.0e30f32; 8];
            tail[..t - whole].copy_from_slice(&scores[whole..]);
            let mut e = [0.0f32; 8];
            // SAFETY: 8 values each.
            unsafe {
                let v = exp_neg(_mm256_sub_ps(_mm256_loadu_ps(tail.as_ptr()), mv));
                _mm256_storeu_ps(e.as_mut_ptr(), v);
            }
            for (s, &e) in scores[whole..].iter_mut().zip(&e) {
                *s = e;
                sum += e;
            }
        }
        let inv = 1.0 / sum;
        let mut o = [_mm256_setzero_ps(); 32];
        let mut p = 0usize;
        for (_, values) in segments {
            for i in 0..seg_rows(values, hd) {
                let w = _mm256_set1_ps(scores[p] * inv);
                p += 1;
                for (c, o) in o.iter_mut().take(lanes).enumerate() {
                    // SAFETY: row i holds hd values.
                    *o = _mm256_fmadd_ps(w, unsafe { load(values, i * hd + 8 * c) }, *o);
                }
            }
        }
        for (c, o) in o.iter().take(lanes).enumerate() {
            // SAFETY: out holds hd values.
            unsafe { _mm256_storeu_ps(out.as_mut_ptr().add(8 * c), *o) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference(q: &[f32], k: &[f32], v: &[f32], hd: usize, scale: f32) -> Vec<f64> {
        let t = k.len() / hd;
        let s: Vec<f64> = (0..t)
            .map(|i| {
                (0..hd)
                    .map(|d| f64::from(q[d]) * f64::from(k[i * hd + d]))
                    .sum::<f64>()
                    * f64::from(scale)
            })
            .collect();
        let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
        let z: f64 = e.iter().sum();
        (0..hd)
            .map(|d| (0..t).map(|i| e[i] * f64::from(v[i * hd + d])).sum::<f64>() / z)
            .collect()
    }

    #[test]
    fn attention_matches_a_float64_softmax_in_every_build_and_storage() {
        let mut seed = 5u64;
        let mut rnd = |n: usize, s: f32| -> Vec<f32> {
            (0..n)
                .map(|_| {
                    seed = seed
                        .wrapping_mul(6_364_136_223_846_793_005)
                        .wrapping_add(1_442_695_040_888_963_407);
                    ((seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * s
                })
                .collect()
        };
        for hd in [4usize, 8, 12, 64, 128] {
            for t in [1usize, 2, 7, 8, 9, 33, 300] {
                let (q, k, v) = (rnd(hd, 4.0), rnd(t * hd, 4.0), rnd(t * hd, 2.0));
                let kh: Vec<u16> = k.iter().map(|&x| crate::kv::f32_to_f16(x)).collect();
                let vh: Vec<u16> = v.iter().map(|&x| crate::kv::f32_to_f16(x)).collect();
                let (kr, vr): (Vec<f32>, Vec<f32>) = (
                    kh.iter().map(|&b| f16_to_f32(b)).collect(),
                    vh.iter().map(|&b| f16_to_f32(b)).collect(),
                );
                let scale = 1.0 / (hd as f32).sqrt();
                let want32 = reference(&q, &k, &v, hd, scale);
                let want16 = reference(&q, &kr, &vr, hd, scale);
                let split = t / 2;
                type Case<'a> = (Vec<(Seg<'a>, Seg<'a>)>, &'a Vec<f64>);
                let cases: Vec<Case<'_>> = vec![
                    (vec![(Rows::F32(&k), Rows::F32(&v))], &want32),
                    (
                        vec![
                            (Rows::F32(&k[..split * hd]), Rows::F32(&v[..split * hd])),
                            (Rows::F32(&k[split * hd..]), Rows::F32(&v[split * hd..])),
                        ],
                        &want32,
                    ),
                    (vec![(Rows::F16(&kh), Rows::F16(&vh))], &want16),
                    (
                        vec![
                            (Rows::F16(&kh[..split * hd]), Rows::F16(&vh[..split * hd])),
                            (Rows::F32(&kr[split * hd..]), Rows::F32(&vr[split * hd..])),
                        ],
                        &want16,
                    ),
                ];
                for (segs, want) in cases {
                    let mut scores = Vec::new();
                    let mut fast = vec![0.0f32; hd];
                    attend(&q, &segs, hd, scale, &mut scores, &mut fast);
                    let mut slow = vec![0.0f32; hd];
                    portable(&q, &segs, hd, scale, &mut scores, &mut slow);
                    for (d, w) in want.iter().enumerate() {
                        for got in [fast[d], slow[d]] {
                            assert!(
                                (f64::from(got) - w).abs() <= 1e-5 * (1.0 + w.abs()),
                                "hd {hd} t {t} d {d}: {got} vs {w}"
                            );
                        }
                    }
                }
            }
        }
    }
}
