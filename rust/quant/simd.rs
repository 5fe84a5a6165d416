//! Eight float32 lanes, three ways: AVX2+FMA+F16C (x86-64, chosen at run
//! time), NEON (aarch64) and portable Rust. The kernels are written once
//! over [`Lanes`]; each build does the same operations in the same order,
//! so one build's results never depend on how the work was split.

/// Eight float32 lanes and the few operations the kernels need.
///
/// # Safety
/// Implementations may only be used where their CPU features are present
/// (the callers check at run time); pointers must be valid for the bytes read.
pub(crate) trait Lanes: Copy {
    type V: Copy;
    unsafe fn zero() -> Self::V;
    unsafe fn splat(x: f32) -> Self::V;
    /// Eight int8 codes at `p`, as floats.
    unsafe fn codes(p: *const i8) -> Self::V;
    /// Eight float32 at `p` (any alignment).
    unsafe fn load(p: *const f32) -> Self::V;
    /// Eight float16 at `p` (any alignment), as float32.
    unsafe fn load_f16(p: *const u8) -> Self::V;
    /// Eight bfloat16 at `p` (any alignment), as float32.
    unsafe fn load_bf16(p: *const u8) -> Self::V;
    /// `a * b`, rounded once (a code times its group scale: gguf's weight).
    unsafe fn mul(a: Self::V, b: Self::V) -> Self::V;
    /// `a + b`, rounded once.
    unsafe fn add(a: Self::V, b: Self::V) -> Self::V;
    /// `a * b + c` (fused where the build has FMA).
    unsafe fn fma(a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    /// `((v0 + v4) + (v2 + v6)) + ((v1 + v5) + (v3 + v7))`.
    unsafe fn hsum(v: Self::V) -> f32;
    /// One float16 (bits) as float32, exactly.
    unsafe fn half(h: u16) -> f32;
    /// The low nibbles of 16 bytes, then their high nibbles.
    #[inline(always)]
    unsafe fn nibbles16(qs: &[u8; 16]) -> [u8; 32] {
        std::array::from_fn(|j| if j < 16 { qs[j] & 15 } else { qs[j - 16] >> 4 })
    }
    /// `0x10` in byte `j` where bit `j` of `qh` is set, else 0.
    #[inline(always)]
    unsafe fn bits32(qh: u32) -> [u8; 32] {
        std::array::from_fn(|j| (((qh >> j) & 1) as u8) << 4)
    }
    /// `table[idx[j]]` for 32 indices below 16.
    #[inline(always)]
    unsafe fn lookup16(table: &[i8; 16], idx: &[u8; 32]) -> [i8; 32] {
        idx.map(|i| table[usize::from(i & 15)])
    }
}

/// Plain Rust (any CPU); `fma` rounds twice.
#[derive(Clone, Copy)]
pub(crate) struct Portable;

impl Lanes for Portable {
    type V = [f32; 8];
    #[inline(always)]
    unsafe fn zero() -> Self::V {
        [0.0; 8]
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> Self::V {
        [x; 8]
    }
    #[inline(always)]
    unsafe fn codes(p: *const i8) -> Self::V {
        // SAFETY: the caller guarantees 8 readable codes at `p`.
        let c = unsafe { p.cast::<[i8; 8]>().read_unaligned() };
        c.map(f32::from)
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self::V {
        // SAFETY: the caller guarantees 8 readable floats at `p`.
        unsafe { p.cast::<[f32; 8]>().read_unaligned() }
    }
    #[inline(always)]
    unsafe fn load_f16(p: *const u8) -> Self::V {
        // SAFETY: the caller guarantees 16 readable bytes at `p`.
        let b = unsafe { p.cast::<[u8; 16]>().read_unaligned() };
        std::array::from_fn(|i| crate::kv::f16_to_f32(u16::from_le_bytes([b[2 * i], b[2 * i + 1]])))
    }
    #[inline(always)]
    unsafe fn load_bf16(p: *const u8) -> Self::V {
        // SAFETY: the caller guarantees 16 readable bytes at `p`.
        let b = unsafe { p.cast::<[u8; 16]>().read_unaligned() };
        std::array::from_fn(|i| {
            f32::from_bits(u32::from(u16::from_le_bytes([b[2 * i], b[2 * i + 1]])) << 16)
        })
    }
    #[inline(always)]
    unsafe fn mul(a: Self::V, b: Self::V) -> Self::V {
        std::array::from_fn(|i| a[i] * b[i])
    }
    #[inline(always)]
    unsafe fn add(a: Self::V, b: Self::V) -> Self::V {
        std::array::from_fn(|i| a[i] + b[i])
    }
    #[inline(always)]
    unsafe fn fma(a: Self::V, b: Self::V, c: Self::V) -> Self::V {
        std::array::from_fn(|i| a[i] * b[i] + c[i])
    }
    #[inline(always)]
    unsafe fn hsum(v: Self::V) -> f32 {
        ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]))
    }
    #[inline(always)]
    unsafe fn half(h: u16) -> f32 {
        crate::kv::f16_to_f32(h)
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) use x86::{whole_xmm, Avx2};

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::Lanes;
    use std::arch::x86_64::*;

    /// `h` in the low 16 bits of a register whose other bits are zero,
    /// written whole (`vmovd`). `_mm_cvtsi32_si128` means the same, but
    /// where only the low lane is used LLVM drops the zeroing and inserts
    /// the two bytes (`vpinsrw`) into whatever register it picks, often one
    /// the previous block's work just wrote: each block's scale then waited
    /// on the block before (a chain through every row's scales; the
    /// batched tiles' unpacking at up to 2x its time). Opaque to LLVM, so
    /// it stays whole.
    ///
    /// # Safety
    /// AVX present (the VEX encoding, as the callers' builds use).
    #[inline(always)]
    pub(crate) unsafe fn whole_xmm(h: u16) -> __m128i {
        let x: __m128i;
        // SAFETY: AVX present (caller); `vmovd` from a general register
        // reads nothing but its operand.
        unsafe {
            std::arch::asm!(
                "vmovd {x}, {h:e}",
                h = in(reg) u32::from(h),
                x = out(xmm_reg) x,
                options(pure, nomem, nostack, preserves_flags)
            );
        }
        x
    }

    /// AVX2 + FMA + F16C; only inside `#[target_feature(enable = "avx2,fma,f16c")]`
    /// functions, after checking the CPU.
    #[derive(Clone, Copy)]
    pub(crate) struct Avx2;

    impl Lanes for Avx2 {
        type V = __m256;
        #[inline(always)]
        unsafe fn zero() -> __m256 {
            unsafe { _mm256_setzero_ps() }
        }
        #[inline(always)]
        unsafe fn splat(x: f32) -> __m256 {
            unsafe { _mm256_set1_ps(x) }
        }
        #[inline(always)]
        unsafe fn codes(p: *const i8) -> __m256 {
            // SAFETY: 8 readable bytes at `p` (caller); AVX2 present (caller).
            unsafe { _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(p.cast()))) }
        }
        #[inline(always)]
        unsafe fn load(p: *const f32) -> __m256 {
            unsafe { _mm256_loadu_ps(p) }
        }
        #[inline(always)]
        unsafe fn load_f16(p: *const u8) -> __m256 {
            unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p.cast())) }
        }
        #[inline(always)]
        unsafe fn load_bf16(p: *const u8) -> __m256 {
            unsafe {
                let h = _mm256_cvtepu16_epi32(_mm_loadu_si128(p.cast()));
                _mm256_castsi256_ps(_mm256_slli_epi32::<16>(h))
            }
        }
        #[inline(always)]
        unsafe fn mul(a: __m256, b: __m256) -> __m256 {
            unsafe { _mm256_mul_ps(a, b) }
        }
        #[inline(always)]
        unsafe fn add(a: __m256, b: __m256) -> __m256 {
            unsafe { _mm256_add_ps(a, b) }
        }
        #[inline(always)]
        unsafe fn fma(a: __m256, b: __m256, c: __m256) -> __m256 {
            unsafe { _mm256_fmadd_ps(a, b, c) }
        }
        #[inline(always)]
        unsafe fn hsum(v: __m256) -> f32 {
            unsafe {
                // [v0+v4, v1+v5, v2+v6, v3+v7]
                let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
                // [(v0+v4)+(v2+v6), (v1+v5)+(v3+v7), ..]
                let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
                _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps::<1>(s, s)))
            }
        }
        #[inline(always)]
        unsafe fn half(h: u16) -> f32 {
            unsafe { _mm_cvtss_f32(_mm_cvtph_ps(whole_xmm(h))) }
        }
        #[inline(always)]
        unsafe fn nibbles16(qs: &[u8; 16]) -> [u8; 32] {
            unsafe {
                let v = _mm_loadu_si128(qs.as_ptr().cast());
                let m = _mm_set1_epi8(15);
                let lo = _mm_and_si128(v, m);
                let hi = _mm_and_si128(_mm_srli_epi16::<4>(v), m);
                let mut out = [0u8; 32];
                _mm256_storeu_si256(out.as_mut_ptr().cast(), _mm256_set_m128i(hi, lo));
                out
            }
        }
        #[inline(always)]
        unsafe fn bits32(qh: u32) -> [u8; 32] {
            unsafe {
                let v = _mm256_set1_epi32(qh as i32);
                // Byte j gets byte j / 8 of qh (both 128-bit lanes hold all four).
                let spread = _mm256_setr_epi8(
                    0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3,
                    3, 3, 3, 3, 3, 3,
                );
                let b = _mm256_shuffle_epi8(v, spread);
                let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201_u64 as i64);
                let set = _mm256_cmpeq_epi8(_mm256_and_si256(b, bit), bit);
                let mut out = [0u8; 32];
                let v = _mm256_and_si256(set, _mm256_set1_epi8(0x10));
                _mm256_storeu_si256(out.as_mut_ptr().cast(), v);
                out
            }
        }
        #[inline(always)]
        unsafe fn lookup16(table: &[i8; 16], idx: &[u8; 32]) -> [i8; 32] {
            unsafe {
                let t = _mm256_broadcastsi128_si256(_mm_loadu_si128(table.as_ptr().cast()));
                let i = _mm256_loadu_si256(idx.as_ptr().cast());
                let mut out = [0i8; 32];
                _mm256_storeu_si256(out.as_mut_ptr().cast(), _mm256_shuffle_epi8(t, i));
                out
            }
        }
    }
}

#[cfg(target_arch = "aarch64")]
pub(crate) use arm::Neon;

#[cfg(target_arch = "aarch64")]
mod arm {
    use super::Lanes;
    use std::arch::aarch64::*;

    /// NEON (always present on aarch64): two float32x4 halves, fused multiply-add.
    #[derive(Clone, Copy)]
    pub(crate) struct Neon;

    impl Lanes for Neon {
        type V = (float32x4_t, float32x4_t);
        #[inline(always)]
        unsafe fn zero() -> Self::V {
            unsafe { (vdupq_n_f32(0.0), vdupq_n_f32(0.0)) }
        }
        #[inline(always)]
        unsafe fn splat(x: f32) -> Self::V {
            unsafe { (vdupq_n_f32(x), vdupq_n_f32(x)) }
        }
        #[inline(always)]
        unsafe fn codes(p: *const i8) -> Self::V {
            unsafe {
                let w = vmovl_s8(vld1_s8(p));
                (
                    vcvtq_f32_s32(vmovl_s16(vget_low_s16(w))),
                    vcvtq_f32_s32(vmovl_s16(vget_high_s16(w))),
                )
            }
        }
        #[inline(always)]
        unsafe fn load(p: *const f32) -> Self::V {
            unsafe { (vld1q_f32(p), vld1q_f32(p.add(4))) }
        }
        #[inline(always)]
        unsafe fn load_f16(p: *const u8) -> Self::V {
            // SAFETY: 16 readable bytes at `p` (caller).
            let v = unsafe { super::Portable::load_f16(p) };
            unsafe { Self::load(v.as_ptr()) }
        }
        #[inline(always)]
        unsafe fn load_bf16(p: *const u8) -> Self::V {
            unsafe {
                let h = vld1q_u16(p.cast());
                (
                    vreinterpretq_f32_u32(vshll_n_u16::<16>(vget_low_u16(h))),
                    vreinterpretq_f32_u32(vshll_n_u16::<16>(vget_high_u16(h))),
                )
            }
        }
        #[inline(always)]
        unsafe fn mul(a: Self::V, b: Self::V) -> Self::V {
            unsafe { (vmulq_f32(a.0, b.0), vmulq_f32(a.1, b.1)) }
        }
        #[inline(always)]
        unsafe fn add(a: Self::V, b: Self::V) -> Self::V {
            unsafe { (vaddq_f32(a.0, b.0), vaddq_f32(a.1, b.1)) }
        }
        #[inline(always)]
        unsafe fn fma(a: Self::V, b: Self::V, c: Self::V) -> Self::V {
            unsafe { (vfmaq_f32(c.0, a.0, b.0), vfmaq_f32(c.1, a.1, b.1)) }
        }
        #[inline(always)]
        unsafe fn hsum(v: Self::V) -> f32 {
            unsafe {
                // [v0+v4, v1+v5, v2+v6, v3+v7]
                let s = vaddq_f32(v.0, v.1);
                let lo = vget_low_f32(s);
                let hi = vget_high_f32(s);
                // [(v0+v4)+(v2+v6), (v1+v5)+(v3+v7)]
                let t = vadd_f32(lo, hi);
                vget_lane_f32::<0>(t) + vget_lane_f32::<1>(t)
            }
        }
        #[inline(always)]
        unsafe fn half(h: u16) -> f32 {
            crate::kv::f16_to_f32(h)
        }
    }
}
