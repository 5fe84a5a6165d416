//! Storage dtypes of the KV cache and float32 -> float16 conversion.

use crate::{CoreError, CoreResult};

/// How keys and values are stored. Input rows are always float32.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dtype {
    /// IEEE float32, stored as given.
    F32,
    /// IEEE float16, rounded to nearest-even on append (half the memory).
    F16,
}

impl Dtype {
    /// Bytes per element.
    pub fn itemsize(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::F16 => 2,
        }
    }

    /// numpy's name for the dtype.
    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "float32",
            Self::F16 => "float16",
        }
    }

    /// The safetensors spelling (`F32`, `F16`).
    pub fn safetensors_name(self) -> &'static str {
        match self {
            Self::F32 => "F32",
            Self::F16 => "F16",
        }
    }

    /// Parse a numpy or safetensors dtype name.
    pub fn parse(name: &str) -> CoreResult<Self> {
        match name {
            "float32" | "F32" | "f4" | "<f4" => Ok(Self::F32),
            "float16" | "F16" | "f2" | "<f2" => Ok(Self::F16),
            other => Err(CoreError::option(
                "dtype",
                format!("unsupported KV storage dtype {other:?}; use \"float32\" or \"float16\""),
            )),
        }
    }
}

/// Round one float32 to the nearest float16 (ties to even), as bits.
pub fn f32_to_f16(x: f32) -> u16 {
    let bits = x.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let exp = ((bits >> 23) & 0xff) as i32;
    let man = bits & 0x007f_ffff;
    if exp == 0xff {
        let nan = if man != 0 {
            0x0200 | (man >> 13) as u16
        } else {
            0
        };
        return sign | 0x7c00 | nan;
    }
    let e = exp - 127 + 15;
    if e >= 0x1f {
        return sign | 0x7c00;
    }
    if e <= 0 {
        if e < -10 {
            return sign;
        }
        let m = man | 0x0080_0000;
        let shift = (14 - e) as u32;
        let mut half = m >> shift;
        let rem = m & ((1 << shift) - 1);
        let halfway = 1 << (shift - 1);
        if rem > halfway || (rem == halfway && half & 1 == 1) {
            half += 1;
        }
        return sign | half as u16;
    }
    let mut half = ((e as u32) << 10) | (man >> 13);
    let rem = man & 0x1fff;
    if rem > 0x1000 || (rem == 0x1000 && half & 1 == 1) {
        half += 1; // a carry into the exponent is the correct rounding
    }
    sign | half as u16
}

/// Widen float16 bits to float32 (exact).
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = u32::from(h & 0x8000) << 16;
    let exp = u32::from((h >> 10) & 0x1f);
    let man = u32::from(h & 0x03ff);
    let bits = match (exp, man) {
        (0, 0) => sign,
        (0, _) => {
            // Subnormal: value = man * 2^-24; normalise.
            let shift = man.leading_zeros() - 21;
            let man = (man << shift) & 0x03ff;
            sign | ((113 - shift) << 23) | (man << 13)
        }
        (0x1f, _) => sign | 0x7f80_0000 | (man << 13),
        _ => sign | ((exp + 112) << 23) | (man << 13),
    };
    f32::from_bits(bits)
}

/// Convert a run of float32 values into float16 bits at `dst`.
///
/// Uses the F16C instructions when the CPU has them (checked at run time).
pub fn convert_f32_to_f16(src: &[f32], dst: &mut [u16]) {
    debug_assert_eq!(src.len(), dst.len());
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("f16c") && std::arch::is_x86_feature_detected!("avx")
        {
            // SAFETY: the features were detected just above.
            unsafe { convert_f16c(src, dst) };
            return;
        }
    }
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = f32_to_f16(s);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx,f16c")]
unsafe fn convert_f16c(src: &[f32], dst: &mut [u16]) {
    use std::arch::x86_64::{
        __m128i, _mm256_cvtps_ph, _mm256_loadu_ps, _mm_storeu_si128, _MM_FROUND_TO_NEAREST_INT,
    };
    let n = src.len().min(dst.len());
    let chunks = n / 8;
    for i in 0..chunks {
        // SAFETY: i * 8 + 8 <= n for both slices.
        unsafe {
            let v = _mm256_loadu_ps(src.as_ptr().add(i * 8));
            let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v);
            _mm_storeu_si128(dst.as_mut_ptr().add(i * 8).cast::<__m128i>(), h);
        }
    }
    for i in chunks * 8..n {
        dst[i] = f32_to_f16(src[i]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_every_finite_half() {
        for h in 0..=u16::MAX {
            let x = f16_to_f32(h);
            if x.is_nan() {
                assert!(f16_to_f32(f32_to_f16(x)).is_nan());
            } else {
                assert_eq!(f32_to_f16(x), h, "half bits {h:#06x} -> {x}");
            }
        }
    }

    #[test]
    fn ties_round_to_even_and_overflow_saturates_to_infinity() {
        // 1 + 2^-11 is half-way between 1 and the next half (1 + 2^-10).
        assert_eq!(f32_to_f16(1.0 + 2f32.powi(-11)), 0x3c00);
        assert_eq!(f32_to_f16(1.0 + 3.0 * 2f32.powi(-11)), 0x3c02);
        assert_eq!(f32_to_f16(65520.0), 0x7c00);
        assert_eq!(f32_to_f16(-1e10), 0xfc00);
        assert_eq!(f32_to_f16(2f32.powi(-25)), 0); // tie between 0 and the smallest subnormal
        assert_eq!(f32_to_f16(2f32.powi(-25) * 1.5), 1);
    }

    #[test]
    fn vector_path_matches_scalar() {
        let src: Vec<f32> = (0..1000)
            .map(|i| ((i as f32) * 0.731).sin() * 10f32.powi(i % 9 - 4))
            .collect();
        let mut fast = vec![0u16; src.len()];
        convert_f32_to_f16(&src, &mut fast);
        let slow: Vec<u16> = src.iter().map(|&x| f32_to_f16(x)).collect();
        assert_eq!(fast, slow);
    }

    #[test]
    fn parses_names() {
        assert_eq!(Dtype::parse("float16").unwrap(), Dtype::F16);
        assert_eq!(Dtype::parse("F32").unwrap(), Dtype::F32);
        assert!(Dtype::parse("int8").is_err());
    }
}
