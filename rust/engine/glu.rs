//! The feed-forward gate: `out = act(gate) * up` with `act` SiLU (SwiGLU:
//! Llama, Qwen) or GELU in its tanh form (GeGLU: Gemma).
//!
//! `silu(g) = g / (1 + exp(-g))`, and GELU's tanh form is the same shape:
//! `0.5 g (1 + tanh(y)) = g / (1 + exp(-2y))`, `y = sqrt(2/pi) (g + 0.044715 g^3)`.
//! `exp` is one polynomial (Cephes' `expf`: a power of two times a degree-7
//! polynomial of the remainder, every step a fused multiply-add) evaluated
//! eight lanes at a time where AVX2 and FMA are present and one value at a
//! time otherwise, with the same operations in the same order: so every
//! build, and every path of the engine (prefill, one step, a team's batched
//! step), gives the same bits. libm's `expf`, one call per value, was 3% of
//! a batched decode step.

/// The gate's activation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Act {
    /// `g / (1 + exp(-g))`.
    Silu,
    /// `g / (1 + exp(-2 sqrt(2/pi) (g + 0.044715 g^3)))` (PyTorch's `gelu(approximate="tanh")`).
    Gelu,
    /// gpt-oss's gate (llama.cpp's `swiglu_oai`): with `x = min(g, 7)`,
    /// `x / (1 + exp(-1.702 x)) * (clamp(u, -7, 7) + 1)`; the up value is
    /// part of the activation, so this one is computed a value at a time in
    /// every build.
    Oai,
}

/// gpt-oss's sigmoid slope and clamp (llama.cpp's constants for `swiglu_oai`).
const OAI_ALPHA: f32 = 1.702;
const OAI_LIMIT: f32 = 7.0;

/// [`Act::Oai`] of one gate and up value.
#[inline(always)]
pub(crate) fn oai(g: f32, u: f32) -> f32 {
    let x = if g > OAI_LIMIT { OAI_LIMIT } else { g };
    let y = u.clamp(-OAI_LIMIT, OAI_LIMIT);
    x / (1.0 + exp(-OAI_ALPHA * x)) * (y + 1.0)
}

/// `-2 sqrt(2 / pi)` and that times 0.044715: GELU's exponent is
/// `g * (G0 + G1 * g * g)`.
const G0: f32 = -1.595_769;
const G1: f32 = G0 * 0.044_715;

/// `out[i] = act(gate[i]) * up[i]`.
pub(crate) fn glu(act: Act, gate: &[f32], up: &[f32], out: &mut [f32]) {
    assert!(gate.len() == up.len() && up.len() == out.len());
    // SAFETY: three slices of one length.
    unsafe { run(act, gate.as_ptr(), up.as_ptr(), out.as_mut_ptr(), out.len()) }
}

/// `gate[i] = act(gate[i]) * up[i]`.
pub(crate) fn glu_in_place(act: Act, gate: &mut [f32], up: &[f32]) {
    assert!(gate.len() == up.len());
    let p = gate.as_mut_ptr();
    // SAFETY: two slices of one length; each value is read before it is
    // written, at the same index.
    unsafe { run(act, p, up.as_ptr(), p, up.len()) }
}

/// # Safety
/// `len` values at each pointer; `out` may be `gate`, else overlaps neither.
unsafe fn run(act: Act, gate: *const f32, up: *const f32, out: *mut f32, len: usize) {
    if act == Act::Oai {
        #[cfg(target_arch = "x86_64")]
        if crate::engine::attention::avx2() {
            // SAFETY: AVX2 and FMA were detected; forwarded.
            unsafe { x86::oai_glu(gate, up, out, len) };
            return;
        }
        for i in 0..len {
            // SAFETY: forwarded.
            unsafe { *out.add(i) = oai(*gate.add(i), *up.add(i)) };
        }
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if crate::engine::attention::avx2() {
        // SAFETY: AVX2 and FMA were detected; forwarded.
        unsafe {
            match act {
                Act::Silu => x86::glu::<false>(gate, up, out, len),
                Act::Gelu => x86::glu::<true>(gate, up, out, len),
                Act::Oai => unreachable!("handled above"),
            }
        }
        return;
    }
    let f = match act {
        Act::Silu => silu,
        Act::Gelu => gelu,
        Act::Oai => unreachable!("handled above"),
    };
    for i in 0..len {
        // SAFETY: forwarded.
        unsafe { *out.add(i) = f(*gate.add(i)) * *up.add(i) };
    }
}

/// `silu(g)` with [`exp`].
#[inline(always)]
pub(crate) fn silu(g: f32) -> f32 {
    g / (1.0 + exp(-g))
}

/// GELU's tanh form with [`exp`].
#[inline(always)]
pub(crate) fn gelu(g: f32) -> f32 {
    g / (1.0 + exp(g * (g * g).mul_add(G1, G0)))
}

/// Below `LOW`, `exp` is about 1e-38 (not 0), which `silu` cannot tell
/// apart; above `HIGH` it is infinity (silu's `g / inf = -0`).
const LOW: f32 = -87.336_55;
const HIGH: f32 = 88.0;
/// `ln 2` in two parts (the remainder's reduction, exact in the first).
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
/// The polynomial's coefficients, highest first.
const P: [f32; 6] = [
    1.987_569_1e-4,
    1.398_199_9e-3,
    8.333_452e-3,
    4.166_579_6e-2,
    0.166_666_65,
    0.5,
];

/// `exp(x)`: `x` clamped, `n = round(x log2 e)` (ties to even), `r = x - n ln 2`,
/// `2^n (1 + r + r^2 p(r))`.
#[inline(always)]
pub(crate) fn exp(x: f32) -> f32 {
    if x > HIGH {
        return f32::INFINITY;
    }
    // max/min as the vector code's (a NaN input takes the bound; silu keeps
    // the NaN through `g`).
    let x = if x > LOW { x } else { LOW };
    let x = if x < HIGH { x } else { HIGH };
    let n = (x * std::f32::consts::LOG2_E).round_ties_even();
    let r = (-n).mul_add(LN2_HI, x);
    let r = (-n).mul_add(LN2_LO, r);
    let mut y = P[0];
    for &c in &P[1..] {
        y = y.mul_add(r, c);
    }
    let y = y.mul_add(r * r, r + 1.0);
    y * f32::from_bits(((n as i32 + 127) as u32) << 23)
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{gelu, silu, G0, G1, HIGH, LN2_HI, LN2_LO, LOW, OAI_ALPHA, OAI_LIMIT, P};
    use std::arch::x86_64::*;

    /// [`super::exp`], eight lanes.
    #[inline(always)]
    unsafe fn exp(x: __m256) -> __m256 {
        // SAFETY: AVX2 + FMA present (caller).
        unsafe {
            let over = _mm256_cmp_ps::<_CMP_GT_OQ>(x, _mm256_set1_ps(HIGH));
            // maxps/minps return the second operand when either is NaN.
            let x = _mm256_max_ps(x, _mm256_set1_ps(LOW));
            let x = _mm256_min_ps(x, _mm256_set1_ps(HIGH));
            let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
                _mm256_mul_ps(x, _mm256_set1_ps(std::f32::consts::LOG2_E)),
            );
            let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_HI), x);
            let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_LO), r);
            let mut y = _mm256_set1_ps(P[0]);
            for &c in &P[1..] {
                y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(c));
            }
            let y = _mm256_fmadd_ps(
                y,
                _mm256_mul_ps(r, r),
                _mm256_add_ps(r, _mm256_set1_ps(1.0)),
            );
            let e = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
            let y = _mm256_mul_ps(y, _mm256_castsi256_ps(_mm256_slli_epi32::<23>(e)));
            _mm256_blendv_ps(y, _mm256_set1_ps(f32::INFINITY), over)
        }
    }

    /// gpt-oss's gate ([`super::oai`]), eight lanes, its operations in
    /// its order: `minps(7, g)` and `maxps(-7, minps(7, u))` keep a NaN as
    /// the scalar comparisons and `clamp` do.
    ///
    /// # Safety
    /// AVX2 and FMA present; as [`super::run`].
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn oai_glu(gate: *const f32, up: *const f32, out: *mut f32, len: usize) {
        let whole = len / 8 * 8;
        // SAFETY (whole body): `len` values at each pointer; each chunk is
        // loaded before it is stored.
        unsafe {
            let (limit, floor) = (_mm256_set1_ps(OAI_LIMIT), _mm256_set1_ps(-OAI_LIMIT));
            let (slope, one) = (_mm256_set1_ps(-OAI_ALPHA), _mm256_set1_ps(1.0));
            for at in (0..whole).step_by(8) {
                let x = _mm256_min_ps(limit, _mm256_loadu_ps(gate.add(at)));
                let y = _mm256_max_ps(floor, _mm256_min_ps(limit, _mm256_loadu_ps(up.add(at))));
                let s = _mm256_div_ps(x, _mm256_add_ps(one, exp(_mm256_mul_ps(slope, x))));
                _mm256_storeu_ps(out.add(at), _mm256_mul_ps(s, _mm256_add_ps(y, one)));
            }
            for i in whole..len {
                *out.add(i) = super::oai(*gate.add(i), *up.add(i));
            }
        }
    }

    /// SiLU (`GELU = false`) or GELU gates, eight lanes, the scalar
    /// functions' operations in their order.
    ///
    /// # Safety
    /// AVX2 and FMA present; as [`super::run`].
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn glu<const GELU: bool>(
        gate: *const f32,
        up: *const f32,
        out: *mut f32,
        len: usize,
    ) {
        let whole = len / 8 * 8;
        // SAFETY (whole body): `len` values at each pointer; each chunk is
        // loaded before it is stored.
        unsafe {
            for at in (0..whole).step_by(8) {
                let g = _mm256_loadu_ps(gate.add(at));
                let u = _mm256_loadu_ps(up.add(at));
                let z = if GELU {
                    let t = _mm256_fmadd_ps(
                        _mm256_mul_ps(g, g),
                        _mm256_set1_ps(G1),
                        _mm256_set1_ps(G0),
                    );
                    _mm256_mul_ps(g, t)
                } else {
                    _mm256_sub_ps(_mm256_setzero_ps(), g)
                };
                let s = _mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0), exp(z)));
                _mm256_storeu_ps(out.add(at), _mm256_mul_ps(s, u));
            }
            let f = if GELU { gelu } else { silu };
            for i in whole..len {
                *out.add(i) = f(*gate.add(i)) * *up.add(i);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values() -> Vec<f32> {
        let mut v: Vec<f32> = (-2000..=2000).map(|i| i as f32 * 0.01).collect();
        v.extend([
            -1.0e30, -200.0, -104.0, -88.5, -87.4, -87.0, -60.0, -1.0e-30, 0.0, -0.0, 1.0e-30,
            60.0, 87.0, 88.0, 88.5, 104.0, 200.0, 1.0e30,
        ]);
        let mut s = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..5000 {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            v.push(
                f32::from_bits((s >> 32) as u32 & 0x7fff_ffff)
                    * if s & 1 == 0 { 1.0 } else { -1.0 },
            );
        }
        v.retain(|x| x.is_finite());
        v
    }

    #[test]
    fn silu_is_within_a_few_ulp_of_float64() {
        for g in values() {
            let want = f64::from(g) / (1.0 + (-f64::from(g)).exp());
            let got = f64::from(silu(g));
            let tol = want.abs() * 4.0 * f64::from(f32::EPSILON) + 1.0e-36;
            assert!((got - want).abs() <= tol, "silu({g}) = {got}, want {want}");
        }
    }

    #[test]
    fn gelu_is_within_a_few_ulp_of_float64_tanh_form() {
        for g in values() {
            let x = f64::from(g);
            let y = (2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x);
            // 0.5 x (1 + tanh y), written without 1 + tanh's cancellation.
            let want = x / (1.0 + (-2.0 * y).exp());
            let got = f64::from(gelu(g));
            // The exponent `2y` is rounded to float32 (relative error ~eps),
            // which exp turns into a relative error of ~|2y| eps: the far
            // negative tail, where gelu is below 1e-20, carries that. Beyond
            // sqrt(f32::MAX) g^3 overflows and the float32 form is 0 or g, as
            // the float64 one rounds to.
            let cond = 8.0 + 2.0 * (2.0 * y).abs().min(200.0);
            let tol = want.abs() * cond * f64::from(f32::EPSILON) + 1.0e-36;
            assert!((got - want).abs() <= tol, "gelu({g}) = {got}, want {want}");
        }
    }

    #[test]
    fn oai_gate_matches_float64_with_its_clamps() {
        let vals = values();
        for (i, &g) in vals.iter().enumerate() {
            let u = vals[(i * 7919) % vals.len()];
            let x = f64::from(g).min(7.0);
            let y = f64::from(u).clamp(-7.0, 7.0);
            let want = x / (1.0 + (-1.702 * x).exp()) * (y + 1.0);
            let got = f64::from(oai(g, u));
            // The exponent `1.702 x` is rounded to float32, which exp turns
            // into a relative error of about |1.702 x| eps (as for GELU).
            let cond = 16.0 + 2.0 * (1.702 * x).abs();
            let tol = want.abs() * cond * f64::from(f32::EPSILON) + 1.0e-30;
            assert!(
                (got - want).abs() <= tol,
                "oai({g}, {u}) = {got}, want {want}"
            );
        }
        // The clamps: the gate saturates at 7, the up value at -7 and 7.
        assert_eq!(oai(100.0, 0.0), oai(7.0, 0.0));
        assert_eq!(oai(1.0, 50.0), oai(1.0, 7.0));
        assert_eq!(oai(1.0, -50.0), oai(1.0, -7.0));
        let (g, up) = (vec![3.0f32, -2.0, 9.0], vec![1.0f32, 20.0, -0.5]);
        let want: Vec<f32> = g.iter().zip(&up).map(|(&a, &b)| oai(a, b)).collect();
        let mut got = g.clone();
        glu_in_place(Act::Oai, &mut got, &up);
        assert_eq!(got, want);
    }

    #[test]
    fn the_oai_gate_has_one_value_at_a_times_bits_in_every_build() {
        let mut g = values();
        g.extend([f32::NAN, 7.0, -7.0, 6.999_999, 7.000_001]);
        let up: Vec<f32> = (0..g.len()).map(|i| g[(i * 7919) % g.len()]).collect();
        let mut got = g.clone();
        glu_in_place(Act::Oai, &mut got, &up);
        for ((&g, &u), &o) in g.iter().zip(&up).zip(&got) {
            let want = oai(g, u);
            assert!(
                o.to_bits() == want.to_bits() || (o.is_nan() && want.is_nan()),
                "oai({g}, {u}): {o} vs one at a time {want}"
            );
        }
    }

    #[test]
    fn every_build_gives_the_same_bits_and_nan_stays_nan() {
        let mut g = values();
        g.push(f32::NAN);
        let up: Vec<f32> = g
            .iter()
            .enumerate()
            .map(|(i, _)| 0.5 + (i % 7) as f32)
            .collect();
        for (act, f) in [(Act::Silu, silu as fn(f32) -> f32), (Act::Gelu, gelu)] {
            let mut got = vec![0.0f32; g.len()];
            glu(act, &g, &up, &mut got);
            let mut again = g.clone();
            glu_in_place(act, &mut again, &up);
            for (((&g, &u), &o), &a) in g.iter().zip(&up).zip(&got).zip(&again) {
                let want = f(g) * u;
                for o in [o, a] {
                    assert!(
                        o.to_bits() == want.to_bits() || (o.is_nan() && want.is_nan()),
                        "{act:?}({g}) * {u}: {o} vs one at a time {want}"
                    );
                }
            }
            assert!(got.last().is_some_and(|v| v.is_nan()));
        }
    }
}
