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

/// AVX2, FMA and F16C present (checked once).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) fn avx2() -> bool {
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

/// Keys one span of attention covers. A head's keys (from the first it
/// sees) are cut into spans of `SPAN` rows; each span's softmax is taken
/// alone ([`attend_span`]) and the spans are combined in order
/// ([`combine`]). So the spans of one head can go to different threads (9
/// query heads split evenly over 2), and the query heads that share a KV
/// head read each span while it is in L1 (8-16 KiB of keys and values at
/// a head size of 64). Every path cuts at the same places, so the bits do
/// not depend on who computed which span.
pub(crate) const SPAN: usize = 64;

/// Spans over `t` keys (at least one).
pub(crate) fn spans(t: usize) -> usize {
    t.div_ceil(SPAN).max(1)
}

/// Total rows of the key segments.
pub(crate) fn segments_rows(segments: &[(Seg<'_>, Seg<'_>)], hd: usize) -> usize {
    segments.iter().map(|(k, _)| seg_rows(k, hd)).sum()
}

/// At most two segments (the cached rows and a step's own), by value.
#[derive(Clone, Copy)]
pub(crate) struct Few<'a> {
    n: usize,
    s: [(Seg<'a>, Seg<'a>); 2],
}

impl<'a> Few<'a> {
    pub(crate) fn get(&self) -> &[(Seg<'a>, Seg<'a>)] {
        &self.s[..self.n]
    }
}

/// Span `s` of `segments` (one or two): rows `s * SPAN..` of their
/// concatenation, cut where they fall.
pub(crate) fn span_of<'a>(segments: &[(Seg<'a>, Seg<'a>)], s: usize, hd: usize) -> Few<'a> {
    assert!(segments.len() <= 2, "attention takes one or two segments");
    let empty = (Rows::F32(&[]), Rows::F32(&[]));
    let mut out = Few {
        n: 0,
        s: [empty, empty],
    };
    let (lo, hi) = (s * SPAN, (s + 1) * SPAN);
    let mut at = 0usize;
    for &(k, v) in segments {
        let t = seg_rows(&k, hd);
        let (a, b) = (lo.max(at), hi.min(at + t));
        if a < b {
            out.s[out.n] = (
                slice_rows(k, a - at, b - at, hd),
                slice_rows(v, a - at, b - at, hd),
            );
            out.n += 1;
        }
        at += t;
    }
    out
}

/// How `q . k` becomes a score: times `scale`, then, with a cap `c`,
/// `c * tanh(s / c)` (Gemma 2's soft-capping).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Scoring {
    pub(crate) scale: f32,
    pub(crate) softcap: Option<f32>,
}

impl Scoring {
    /// Scores scaled by `scale`, not capped.
    #[cfg(test)]
    pub(crate) fn scaled(scale: f32) -> Self {
        Self {
            scale,
            softcap: None,
        }
    }

    /// Apply the cap (if any) to scaled scores, in place: one scalar
    /// function every build and path shares, so the bits agree.
    #[inline]
    fn cap(self, scores: &mut [f32]) {
        if let Some(c) = self.softcap {
            let inv = 1.0 / c;
            scores.iter_mut().for_each(|s| *s = c * (*s * inv).tanh());
        }
    }
}

/// Scratch of [`attend`] and [`attend_group`].
#[derive(Default)]
pub(crate) struct Scratch {
    scores: Vec<f32>,
    /// `(m, l)` of each head's spans, flat.
    parts: Vec<f32>,
    outs: Vec<f32>,
}

/// `softmax(qv . K^T * scale) . V` over `segments` (one or two) of
/// (keys, values), each `[t_i, hd]`, into `out` (`hd`): its spans one by
/// one, then combined.
#[cfg(test)]
pub(crate) fn attend(
    qv: &[f32],
    segments: &[(Seg<'_>, Seg<'_>)],
    hd: usize,
    sc: Scoring,
    scratch: &mut Scratch,
    out: &mut [f32],
) {
    attend_group(&[qv], segments, hd, sc, None, scratch, &mut [out]);
}

/// [`attend`] for several query heads over the same keys (the query heads
/// of one KV head), span by span, so each span is read from memory once.
/// Each head gets the bits [`attend`] gives it alone. With `sinks` (one
/// logit a head of `qs`: gpt-oss), each head's softmax has one more term,
/// `exp(sink)`, whose value is zero ([`with_sink`]).
pub(crate) fn attend_group(
    qs: &[&[f32]],
    segments: &[(Seg<'_>, Seg<'_>)],
    hd: usize,
    sc: Scoring,
    sinks: Option<&[f32]>,
    scratch: &mut Scratch,
    outs: &mut [&mut [f32]],
) {
    group_with(attend_span, qs, segments, hd, sc, sinks, scratch, outs);
}

/// A head's softmax-weighted values `out` (from [`combine`], whose
/// `(top, l)` are its largest score and `sum exp(s - top)`) with a sink
/// logit in the softmax: `out * l / (l + exp(sink - top))`.
pub(crate) fn with_sink(out: &mut [f32], (top, l): (f32, f32), sink: f32) {
    let f = l / (l + (sink - top).exp());
    out.iter_mut().for_each(|o| *o *= f);
}

/// The span kernel of [`attend_group`] and [`portable`]'s signature.
type SpanFn =
    fn(&[f32], &[(Seg<'_>, Seg<'_>)], usize, Scoring, &mut Vec<f32>, &mut [f32]) -> (f32, f32);

/// [`attend_group`] with the span kernel `span_fn`.
#[allow(clippy::too_many_arguments)]
fn group_with(
    span_fn: SpanFn,
    qs: &[&[f32]],
    segments: &[(Seg<'_>, Seg<'_>)],
    hd: usize,
    sc: Scoring,
    sinks: Option<&[f32]>,
    scratch: &mut Scratch,
    outs: &mut [&mut [f32]],
) {
    let n = spans(segments_rows(segments, hd));
    let heads = qs.len();
    scratch.parts.clear();
    scratch.parts.resize(heads * n * 2, 0.0);
    scratch.outs.clear();
    scratch.outs.resize(heads * n * hd, 0.0);
    for s in 0..n {
        let span = span_of(segments, s, hd);
        for (h, qv) in qs.iter().enumerate() {
            let at = h * n + s;
            let (m, l) = span_fn(
                qv,
                span.get(),
                hd,
                sc,
                &mut scratch.scores,
                &mut scratch.outs[at * hd..(at + 1) * hd],
            );
            scratch.parts[at * 2] = m;
            scratch.parts[at * 2 + 1] = l;
        }
    }
    for (h, out) in outs.iter_mut().enumerate() {
        let tl = combine(
            &scratch.parts[h * n * 2..(h + 1) * n * 2],
            &scratch.outs[h * n * hd..(h + 1) * n * hd],
            hd,
            out,
        );
        if let Some(s) = sinks {
            with_sink(out, tl, s[h]);
        }
    }
}

/// One span: `out = sum_i exp(s_i - m) * v_i` (not normalised) over the
/// keys of `segments` (at least one row), with `s_i = qv . k_i * scale`;
/// returns `(m, sum_i exp(s_i - m))`, `m` the largest score.
pub(crate) fn attend_span(
    qv: &[f32],
    segments: &[(Seg<'_>, Seg<'_>)],
    hd: usize,
    sc: Scoring,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) -> (f32, f32) {
    #[cfg(target_arch = "x86_64")]
    if hd.is_multiple_of(8) && hd <= 256 && avx2() {
        // SAFETY: the features were detected.
        return unsafe { x86::attend_span(qv, segments, hd, sc, scores, out) };
    }
    portable(qv, segments, hd, sc, scores, out)
}

/// The softmax-weighted values of one head from its spans' partials
/// (`parts[2s], parts[2s + 1]` = [`attend_span`]'s `(m, l)` of span `s`,
/// `outs` its outputs, `hd` apart), in span order:
/// `sum_s exp(m_s - M) o_s / sum_s exp(m_s - M) l_s`. One span gives `o / l`.
/// Returns `(M, sum_s exp(m_s - M) l_s)`.
pub(crate) fn combine(parts: &[f32], outs: &[f32], hd: usize, out: &mut [f32]) -> (f32, f32) {
    let top = parts
        .chunks_exact(2)
        .fold(f32::NEG_INFINITY, |a, p| a.max(p[0]));
    let mut l = 0.0f32;
    out.iter_mut().for_each(|o| *o = 0.0);
    for (s, p) in parts.chunks_exact(2).enumerate() {
        let (m, ls) = (p[0], p[1]);
        let f = (m - top).exp();
        l += f * ls;
        out.iter_mut()
            .zip(&outs[s * hd..(s + 1) * hd])
            .for_each(|(o, &x)| *o += f * x);
    }
    let inv = 1.0 / l;
    out.iter_mut().for_each(|o| *o *= inv);
    (top, l)
}

fn portable(
    qv: &[f32],
    segments: &[(Seg<'_>, Seg<'_>)],
    hd: usize,
    sc: Scoring,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) -> (f32, f32) {
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
            scores.push(dot(qv, &row) * sc.scale);
        }
    }
    sc.cap(scores);
    let max = scores.iter().fold(f32::NEG_INFINITY, |m, &s| m.max(s));
    let mut sum = 0.0f32;
    for s in scores.iter_mut() {
        *s = (*s - max).exp();
        sum += *s;
    }
    out.iter_mut().for_each(|o| *o = 0.0);
    let mut p = scores.iter();
    for (_, values) in segments {
        for i in 0..seg_rows(values, hd) {
            widen(values, i, &mut row);
            let w = p.next().copied().unwrap_or(0.0);
            out.iter_mut().zip(&row).for_each(|(o, &x)| *o += w * x);
        }
    }
    (max, sum)
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
    use super::{seg_rows, Scoring, Seg};
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

    /// `scores = exp(scores - m)` in place; returns `(m, sum)`, `m` the
    /// largest score. Every span kernel's softmax, so they share its bits.
    #[inline(always)]
    unsafe fn softmax(scores: &mut [f32]) -> (f32, f32) {
        let t = scores.len();
        let max = scores.iter().fold(f32::NEG_INFINITY, |m, &s| m.max(s));
        // SAFETY: AVX present (caller).
        let (mv, mut sums) = unsafe { (_mm256_set1_ps(max), _mm256_setzero_ps()) };
        let whole = t / 8 * 8;
        for at in (0..whole).step_by(8) {
            // SAFETY: 8 scores at `at`; AVX2 + FMA present (caller).
            unsafe {
                let p = scores.as_mut_ptr().add(at);
                let e = exp_neg(_mm256_sub_ps(_mm256_loadu_ps(p), mv));
                _mm256_storeu_ps(p, e);
                sums = _mm256_add_ps(sums, e);
            }
        }
        // SAFETY: AVX present (caller).
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
        (max, sum)
    }

    /// `out = sum_i w_i * v_i` over the value rows of `segments`, `w_i` =
    /// `weights[i]`: each eight-lane accumulator from zero over the rows in
    /// order. Eight chunks of eight lanes at a time, their accumulators in
    /// registers (eight independent FMA chains), the last ones chunk by chunk.
    ///
    /// # Safety
    /// AVX2, FMA and F16C present; `hd` a multiple of 8; `weights` holds a
    /// weight a row; `out` holds `hd` values.
    #[inline(always)]
    unsafe fn weighted_values(
        segments: &[(Seg<'_>, Seg<'_>)],
        hd: usize,
        weights: &[f32],
        out: &mut [f32],
    ) {
        /// Chunks `c0..c0 + K`.
        #[inline(always)]
        unsafe fn block<const K: usize>(
            segments: &[(Seg<'_>, Seg<'_>)],
            hd: usize,
            weights: &[f32],
            c0: usize,
            out: &mut [f32],
        ) {
            // SAFETY: the caller's contract.
            unsafe {
                let mut o = [_mm256_setzero_ps(); K];
                let mut w = weights.as_ptr();
                for (_, values) in segments {
                    for i in 0..seg_rows(values, hd) {
                        let wv = _mm256_set1_ps(*w);
                        w = w.add(1);
                        for (c, o) in o.iter_mut().enumerate() {
                            *o = _mm256_fmadd_ps(wv, load(values, i * hd + 8 * (c0 + c)), *o);
                        }
                    }
                }
                for (c, o) in o.iter().enumerate() {
                    _mm256_storeu_ps(out.as_mut_ptr().add(8 * (c0 + c)), *o);
                }
            }
        }
        let (lanes, mut c0) = (hd / 8, 0);
        // SAFETY: the caller's contract.
        unsafe {
            while c0 + 8 <= lanes {
                block::<8>(segments, hd, weights, c0, out);
                c0 += 8;
            }
            while c0 < lanes {
                block::<1>(segments, hd, weights, c0, out);
                c0 += 1;
            }
        }
    }

    /// `scores = [qv . k_i * scale]` over the keys of `segments`: per key an
    /// FMA chain over its eight-value chunks from zero, then [`hsum`]'s
    /// adds, then the scale. Keys go eight at a time (eight independent
    /// chains, and one reduction for the eight: the same adds as [`hsum`]
    /// on each, laid out across lanes), the rest one by one; the bits are
    /// the same either way.
    ///
    /// # Safety
    /// AVX2, FMA and F16C present; `hd` a multiple of 8 up to 256; `qv` and
    /// every key row hold `hd` values.
    #[inline(always)]
    unsafe fn qk_scores(
        qv: &[f32],
        segments: &[(Seg<'_>, Seg<'_>)],
        hd: usize,
        scale: f32,
        scores: &mut Vec<f32>,
    ) {
        let lanes = hd / 8;
        let t: usize = segments.iter().map(|(k, _)| seg_rows(k, hd)).sum();
        scores.clear();
        scores.resize(t, 0.0);
        let sp = scores.as_mut_ptr();
        let qp = qv.as_ptr();
        let mut p = 0usize;
        // SAFETY (whole body): the caller's contract; p + 8 <= t in blocks.
        unsafe {
            let sv = _mm256_set1_ps(scale);
            // Lane order of the block's reduction: keys 0, 2, 4, 6 | 1, 3, 5, 7.
            let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
            for (keys, _) in segments {
                let rows = seg_rows(keys, hd);
                let mut i = 0;
                while i + 8 <= rows {
                    let mut a = [_mm256_setzero_ps(); 8];
                    for c in 0..lanes {
                        let q = _mm256_loadu_ps(qp.add(8 * c));
                        for (k, a) in a.iter_mut().enumerate() {
                            *a = _mm256_fmadd_ps(q, load(keys, (i + k) * hd + 8 * c), *a);
                        }
                    }
                    // hsum's adds: s_j = v_j + v_(j+4); t = (s0 + s2, s1 + s3);
                    // t0 + t1. Pairs of keys share a register at each step.
                    let half = |x: __m256, y: __m256| {
                        _mm256_add_ps(
                            _mm256_permute2f128_ps::<0x20>(x, y),
                            _mm256_permute2f128_ps::<0x31>(x, y),
                        )
                    };
                    let (s01, s23, s45, s67) = (
                        half(a[0], a[1]),
                        half(a[2], a[3]),
                        half(a[4], a[5]),
                        half(a[6], a[7]),
                    );
                    let pair = |x: __m256, y: __m256| {
                        _mm256_add_ps(
                            _mm256_shuffle_ps::<0b01_00_01_00>(x, y),
                            _mm256_shuffle_ps::<0b11_10_11_10>(x, y),
                        )
                    };
                    let (t0, t1) = (pair(s01, s23), pair(s45, s67));
                    let r = _mm256_add_ps(
                        _mm256_shuffle_ps::<0b10_00_10_00>(t0, t1),
                        _mm256_shuffle_ps::<0b11_01_11_01>(t0, t1),
                    );
                    let r = _mm256_permutevar8x32_ps(r, order);
                    _mm256_storeu_ps(sp.add(p), _mm256_mul_ps(r, sv));
                    i += 8;
                    p += 8;
                }
                while i < rows {
                    let mut acc = _mm256_setzero_ps();
                    for c in 0..lanes {
                        let q = _mm256_loadu_ps(qp.add(8 * c));
                        acc = _mm256_fmadd_ps(q, load(keys, i * hd + 8 * c), acc);
                    }
                    *sp.add(p) = hsum(acc) * scale;
                    i += 1;
                    p += 1;
                }
            }
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn attend_span(
        qv: &[f32],
        segments: &[(Seg<'_>, Seg<'_>)],
        hd: usize,
        sc: Scoring,
        scores: &mut Vec<f32>,
        out: &mut [f32],
    ) -> (f32, f32) {
        // SAFETY: AVX2, FMA, F16C present; qv and every row hold hd values.
        unsafe { qk_scores(qv, segments, hd, sc.scale, scores) };
        sc.cap(scores);
        // SAFETY: AVX2 + FMA present.
        let (max, sum) = unsafe { softmax(scores) };
        // SAFETY: as above; out holds hd values.
        unsafe { weighted_values(segments, hd, scores, out) };
        (max, sum)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values uniform in `[-scale / 2, scale / 2)` from a seeded LCG.
    fn lcg(mut seed: u64) -> impl FnMut(usize, f32) -> Vec<f32> {
        move |n, scale| {
            (0..n)
                .map(|_| {
                    seed = seed
                        .wrapping_mul(6_364_136_223_846_793_005)
                        .wrapping_add(1_442_695_040_888_963_407);
                    ((seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * scale
                })
                .collect()
        }
    }

    fn reference(q: &[f32], k: &[f32], v: &[f32], hd: usize, scale: f32) -> Vec<f64> {
        reference_capped(q, k, v, hd, scale, None)
    }

    fn reference_capped(
        q: &[f32],
        k: &[f32],
        v: &[f32],
        hd: usize,
        scale: f32,
        cap: Option<f32>,
    ) -> Vec<f64> {
        let t = k.len() / hd;
        let s: Vec<f64> = (0..t)
            .map(|i| {
                let s = (0..hd)
                    .map(|d| f64::from(q[d]) * f64::from(k[i * hd + d]))
                    .sum::<f64>()
                    * f64::from(scale);
                cap.map_or(s, |c| f64::from(c) * (s / f64::from(c)).tanh())
            })
            .collect();
        let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
        let z: f64 = e.iter().sum();
        (0..hd)
            .map(|d| (0..t).map(|i| e[i] * f64::from(v[i * hd + d])).sum::<f64>() / z)
            .collect()
    }

    /// The built kernel and the portable one both give `want` (float64) to 1e-5.
    fn assert_builds_match(
        q: &[f32],
        segs: &[(Seg<'_>, Seg<'_>)],
        hd: usize,
        sc: Scoring,
        want: &[f64],
        t: usize,
    ) {
        let mut scratch = Scratch::default();
        let mut fast = vec![0.0f32; hd];
        attend(q, segs, hd, sc, &mut scratch, &mut fast);
        let mut slow = vec![0.0f32; hd];
        group_with(
            portable,
            &[q],
            segs,
            hd,
            sc,
            None,
            &mut scratch,
            &mut [&mut slow],
        );
        for (d, w) in want.iter().enumerate() {
            for got in [fast[d], slow[d]] {
                assert!(
                    (f64::from(got) - w).abs() <= 1e-5 * (1.0 + w.abs()),
                    "hd {hd} t {t} d {d}: {got} vs {w}"
                );
            }
        }
    }

    #[test]
    fn attention_matches_a_float64_softmax_in_every_build_and_storage() {
        let mut rnd = lcg(5);
        for hd in [4usize, 8, 12, 64, 128] {
            for t in [1usize, 2, 7, 8, 9, 33, 64, 65, 129, 300] {
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
                    assert_builds_match(&q, &segs, hd, Scoring::scaled(scale), want, t);
                }
            }
        }
    }

    #[test]
    fn soft_capped_scores_match_a_float64_reference_in_every_build() {
        let mut rnd = lcg(9);
        for hd in [8usize, 12, 64] {
            for t in [1usize, 9, 70, 130] {
                let (q, k, v) = (rnd(hd, 6.0), rnd(t * hd, 6.0), rnd(t * hd, 2.0));
                let sc = Scoring {
                    scale: 0.5,
                    softcap: Some(2.0),
                };
                let want = reference_capped(&q, &k, &v, hd, 0.5, Some(2.0));
                let plain = reference(&q, &k, &v, hd, 0.5);
                let segs = [(Rows::F32(&k), Rows::F32(&v))];
                assert_builds_match(&q, &segs, hd, sc, &want, t);
                if t > 1 {
                    let moved = want.iter().zip(&plain).map(|(a, b)| (a - b).abs());
                    assert!(moved.fold(0.0, f64::max) > 1e-3, "the cap must matter here");
                }
            }
        }
    }

    #[test]
    fn a_group_of_heads_gets_each_heads_bits_alone_and_spans_cut_where_they_fall() {
        let mut lcg = lcg(11);
        let mut rnd = |n: usize| lcg(n, 1.0);
        // Groups of 1..=9 heads (SmolLM2 has 3, Llama 3 4, Qwen2 0.5B 7),
        // float32 and float16 keys, head sizes 16 and 64.
        for hd in [16usize, 64] {
            for t in [1usize, SPAN - 1, SPAN, SPAN + 1, 3 * SPAN + 5] {
                let (k, v) = (rnd(t * hd), rnd(t * hd));
                let kh: Vec<u16> = k.iter().map(|&x| crate::kv::f32_to_f16(x)).collect();
                let vh: Vec<u16> = v.iter().map(|&x| crate::kv::f32_to_f16(x)).collect();
                // Two segments split off the span grid: span_of covers each row once.
                let cut = t / 3;
                let storages = [
                    [
                        (Rows::F32(&k[..cut * hd]), Rows::F32(&v[..cut * hd])),
                        (Rows::F32(&k[cut * hd..]), Rows::F32(&v[cut * hd..])),
                    ],
                    [
                        (Rows::F16(&kh[..cut * hd]), Rows::F16(&vh[..cut * hd])),
                        (Rows::F32(&k[cut * hd..]), Rows::F32(&v[cut * hd..])),
                    ],
                ];
                for segs in storages {
                    let n = spans(t);
                    let rows: usize = (0..n)
                        .map(|s| segments_rows(span_of(&segs, s, hd).get(), hd))
                        .sum();
                    assert_eq!(rows, t);
                    assert!((0..n).all(|s| segments_rows(span_of(&segs, s, hd).get(), hd) <= SPAN));
                    for heads in 1..=9 {
                        let qs: Vec<Vec<f32>> = (0..heads).map(|_| rnd(hd)).collect();
                        let mut scratch = Scratch::default();
                        let mut alone = vec![vec![0.0f32; hd]; heads];
                        for (q, out) in qs.iter().zip(alone.iter_mut()) {
                            attend(q, &segs, hd, Scoring::scaled(0.25), &mut scratch, out);
                        }
                        let mut together = vec![vec![0.0f32; hd]; heads];
                        let refs: Vec<&[f32]> = qs.iter().map(|q| q.as_slice()).collect();
                        let mut outs: Vec<&mut [f32]> =
                            together.iter_mut().map(|o| o.as_mut_slice()).collect();
                        attend_group(
                            &refs,
                            &segs,
                            hd,
                            Scoring::scaled(0.25),
                            None,
                            &mut scratch,
                            &mut outs,
                        );
                        assert_eq!(alone, together, "hd {hd} t {t} heads {heads}");
                    }
                }
            }
        }
    }

    #[test]
    fn a_sink_is_one_more_softmax_term_with_a_zero_value() {
        let mut rnd = lcg(11);
        let hd = 16;
        for t in [1usize, 5, 64, 65, 200] {
            let (k, v) = (rnd(t * hd, 4.0), rnd(t * hd, 2.0));
            let qs: Vec<Vec<f32>> = (0..2).map(|_| rnd(hd, 4.0)).collect();
            // A sink far below, near, and far above the scores.
            for sink in [-50.0f32, 0.3, 3.0, 80.0] {
                let sinks = [sink, -sink];
                let refs: Vec<&[f32]> = qs.iter().map(|q| q.as_slice()).collect();
                let mut got = vec![vec![0.0f32; hd]; 2];
                let mut outs: Vec<&mut [f32]> = got.iter_mut().map(|o| o.as_mut_slice()).collect();
                let segs = [(Rows::F32(&k), Rows::F32(&v))];
                let mut scratch = Scratch::default();
                attend_group(
                    &refs,
                    &segs,
                    hd,
                    Scoring::scaled(0.25),
                    Some(&sinks),
                    &mut scratch,
                    &mut outs,
                );
                for (h, q) in qs.iter().enumerate() {
                    // Float64: the scores and the sink in one softmax.
                    let mut s: Vec<f64> = (0..t)
                        .map(|i| {
                            (0..hd)
                                .map(|d| f64::from(q[d]) * f64::from(k[i * hd + d]))
                                .sum::<f64>()
                                * 0.25
                        })
                        .collect();
                    s.push(f64::from(sinks[h]));
                    let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let z: f64 = s.iter().map(|x| (x - m).exp()).sum();
                    for d in 0..hd {
                        let want: f64 = (0..t)
                            .map(|i| (s[i] - m).exp() * f64::from(v[i * hd + d]))
                            .sum::<f64>()
                            / z;
                        let g = f64::from(got[h][d]);
                        assert!(
                            (g - want).abs() <= 1e-5 * (1.0 + want.abs()),
                            "t {t} sink {} head {h} d {d}: {g} vs {want}",
                            sinks[h]
                        );
                    }
                }
            }
        }
    }

    /// One span of SmolLM2's shape (head size 64, 64 float16 keys), one head,
    /// CPU time of one thread, the built kernel against the portable one:
    /// `cargo test --release -q --lib attend_span_probe -- --ignored --nocapture`.
    #[test]
    #[ignore = "a speed probe, not a test"]
    fn attend_span_probe() {
        use std::time::Instant;
        let (hd, t) = (64usize, SPAN);
        let mut rnd = lcg(3);
        let (k, v, q) = (rnd(t * hd, 1.0), rnd(t * hd, 1.0), rnd(hd, 1.0));
        let kh: Vec<u16> = k.iter().map(|&x| crate::kv::f32_to_f16(x)).collect();
        let vh: Vec<u16> = v.iter().map(|&x| crate::kv::f32_to_f16(x)).collect();
        let segs = [(Rows::F16(&kh), Rows::F16(&vh))];
        let (mut scores, mut out) = (Vec::new(), vec![0.0f32; hd]);
        let reps = 300_000;
        for round in 0..3 {
            let mut us = [0.0f64; 2];
            for (f, us) in [attend_span as SpanFn, portable]
                .into_iter()
                .zip(us.iter_mut())
            {
                let start = Instant::now();
                for _ in 0..reps {
                    std::hint::black_box(f(
                        &q,
                        &segs,
                        hd,
                        Scoring::scaled(0.125),
                        &mut scores,
                        &mut out,
                    ));
                }
                *us = start.elapsed().as_secs_f64() / reps as f64 * 1e6;
            }
            println!(
                "round {round}: {t} keys: built {:.3} us, portable {:.3} us, {:.2}x",
                us[0],
                us[1],
                us[1] / us[0]
            );
        }
    }
}
