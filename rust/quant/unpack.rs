//! Block layouts: each ggml block unpacked into small integer codes and, per
//! group of values, a float scale (and offset), so that value `v` of group
//! `g` is exactly what `gguf.quants.dequantize` computes:
//!
//! ```text
//! x[v] = scale[g] * code[v]             (symmetric formats)
//! x[v] = scale[g] * code[v] - offset[g] (formats with a minimum)
//! ```
//!
//! in float32 with one rounding per operation, `scale` and `offset` rounded
//! as gguf rounds them. Layouts (`d`, `dmin`, `m` are float16):
//!
//! | format | values / bytes | layout | value |
//! |---|---|---|---|
//! | Q4_0 | 32 / 18 | `d`, 16 B of nibbles (low nibbles are values 0-15) | `d * (q - 8)` |
//! | Q4_1 | 32 / 20 | `d`, `m`, 16 B of nibbles | `d * q + m` |
//! | Q5_0 | 32 / 22 | `d`, u32 of fifth bits, 16 B of nibbles | `d * (q - 16)` |
//! | Q5_1 | 32 / 24 | `d`, `m`, u32 of fifth bits, 16 B of nibbles | `d * q + m` |
//! | Q8_0 | 32 / 34 | `d`, 32 int8 | `d * q` |
//! | IQ4_NL | 32 / 18 | `d`, 16 B of nibbles indexing a 16-entry table | `d * T[q]` |
//! | MXFP4 | 32 / 17 | E8M0 byte `e`, 16 B of nibbles indexing twice the E2M1 values | `2^(e-128) * T[q]` |
//! | Q2_K | 256 / 84 | 16 B of 4-bit scale / 4-bit min, 64 B of 2-bit q, `d`, `dmin` | `d*sc * q - dmin*m` (16 values a group) |
//! | Q3_K | 256 / 110 | 32 B high bits, 64 B of 2-bit q, 12 B of 6-bit scales, `d` | `d*(sc-32) * (q - 4*!h)` (16) |
//! | Q4_K | 256 / 144 | `d`, `dmin`, 12 B of 6-bit scales and mins, 128 B of nibbles | `d*sc * q - dmin*m` (32) |
//! | Q5_K | 256 / 176 | `d`, `dmin`, 12 B scales and mins, 32 B fifth bits, 128 B nibbles | `d*sc * q - dmin*m` (32) |
//! | Q6_K | 256 / 210 | 128 B low nibbles, 64 B of 2-bit highs, 16 int8 scales, `d` | `d*sc * (q - 32)` (16) |
//! | IQ4_XS | 256 / 136 | `d`, u16 high scale bits, 4 B low scale bits, 128 B nibbles | `d*(sc-32) * T[q]` (32) |
//!
//! MXFP4 (ggml's `block_mxfp4`, gpt-oss's expert weights) is IQ4_NL's layout
//! with a one-byte scale: `e` is an E8M0 exponent and the scale is ggml's
//! `GGML_E8M0_TO_FP32_HALF(e)` = `2^(e - 128)` (the float32 with bits
//! `0x00200000 << e` for `e < 2`, subnormals, else `(e - 1) << 23`; gguf-py's
//! `e8m0_to_fp32_half`), the codes twice the E2M1 values (so whole numbers).
//! Every `e` is valid; `2^(e-128) * T[q]` exceeds float32 for `e >= 253` and
//! large codes, and is then infinite, as gguf computes it too.

use super::format::QuantType;
use super::simd::{Lanes, Portable};
use crate::kv::f16_to_f32;

/// IQ4_NL's and IQ4_XS's non-linear code book.
pub(crate) const IQ4_VALUES: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// MXFP4's code book: twice the FP4 (E2M1) values, so the scale is half
/// the E8M0 one (`GGML_E8M0_TO_FP32_HALF`); index 8 is E2M1's negative zero.
pub(crate) const MXFP4_VALUES: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// MXFP4's block scale from its E8M0 byte: `2^(e - 128)`, ggml's
/// `GGML_E8M0_TO_FP32_HALF(e)` bit for bit (subnormal for `e` 0 and 1).
#[inline(always)]
pub(crate) const fn e8m0_half(e: u8) -> f32 {
    let bits = if e < 2 {
        0x0020_0000u32 << e
    } else {
        (e as u32 - 1) << 23
    };
    f32::from_bits(bits)
}

/// [`e8m0_half`] of every byte: a scale is one load (the SIMD kernels
/// broadcast it from here).
pub(crate) static E8M0_HALF: [f32; 256] = {
    let mut t = [0.0f32; 256];
    let mut e = 0;
    while e < 256 {
        t[e] = e8m0_half(e as u8);
        e += 1;
    }
    t
};

/// The float32 bits of float16 `h`, as F16C's `vcvtph2ps` gives them
/// (exact; a signalling NaN comes back quiet).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const fn f16_bits(h: u16) -> u32 {
    let sign = ((h as u32) & 0x8000) << 16;
    let exp = ((h >> 10) & 0x1f) as u32;
    let man = (h & 0x3ff) as u32;
    if exp == 0 {
        if man == 0 {
            return sign;
        }
        // A subnormal: shift its leading one to the implicit bit.
        let (mut e, mut m) = (113u32, man);
        while m & 0x400 == 0 {
            m <<= 1;
            e -= 1;
        }
        return sign | (e << 23) | ((m & 0x3ff) << 13);
    }
    if exp == 31 {
        let quiet = if man != 0 { 0x0040_0000 } else { 0 };
        return sign | 0x7f80_0000 | (man << 13) | quiet;
    }
    sign | ((exp + 112) << 23) | (man << 13)
}

/// Every float16's float32 value, by its bits: a block's scale is one load
/// (the AVX-512 one-row kernels broadcast it from here; converting it with
/// `vcvtph2ps` a block was about a quarter of their time).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) static F16_TABLE: [f32; 65536] = {
    let mut t = [0.0f32; 65536];
    let mut h = 0;
    while h < 65536 {
        t[h] = f32::from_bits(f16_bits(h as u16));
        h += 1;
    }
    t
};

/// The float16 at `b[at..at + 2]`, converted by the build `S` (F16C on x86).
#[inline(always)]
fn half<S: Lanes>(b: &[u8], at: usize) -> f32 {
    // SAFETY: `S` is usable wherever its unpack functions are called.
    unsafe { S::half(u16::from_le_bytes([b[at], b[at + 1]])) }
}

/// `$f(block, codes, scales, offsets)` over the blocks of `raw` (block
/// bytes, values and groups `$bb`, `$bv`, `$ng`), offsets past the end of
/// `offset` (symmetric formats) into a dummy.
macro_rules! block_loop {
    ($raw:ident, $codes:ident, $scale:ident, $offset:ident, $bb:tt, $bv:tt, $ng:tt, $f:expr) => {{
        let (raw, _) = $raw.as_chunks::<$bb>();
        let (codes, _) = $codes.as_chunks_mut::<$bv>();
        let (scale, _) = $scale.as_chunks_mut::<$ng>();
        let (offset, _) = $offset.as_chunks_mut::<$ng>();
        let mut dummy = [0.0f32; $ng];
        let mut offsets = offset.iter_mut();
        for ((b, c), s) in raw.iter().zip(codes.iter_mut()).zip(scale.iter_mut()) {
            let o = offsets.next().unwrap_or(&mut dummy);
            ($f)(b, c, s, o);
        }
    }};
}

/// Unpack whole rows of blocks: `raw` holds whole blocks, `codes` gets
/// `block_values` codes a block, `scale` and `offset` one entry per group
/// of `group_values` (`offset` is left alone for symmetric formats).
#[inline(always)]
pub(crate) fn unpack_row<S: Lanes>(
    qtype: QuantType,
    raw: &[u8],
    codes: &mut [i8],
    scale: &mut [f32],
    offset: &mut [f32],
) {
    // Q5_1, Q3_K, Q6_K and IQ4_XS call their format's function directly.
    // Passed to [`blocks`] as a function value, theirs was called through a
    // shim that LLVM left out of line, compiled without the caller's SIMD
    // features, so every intrinsic in it became a call (IQ4_XS's batched
    // products 2.3-6x slower). Inlined so, Q4_K and Q5_K measured 5-15%
    // slower (register allocation in the caller), so they keep [`blocks`].
    match qtype {
        QuantType::Q4_0 => blocks::<S, 18, 32, 1>(raw, codes, scale, offset, q4_0::<S>),
        QuantType::Q4_1 => blocks::<S, 20, 32, 1>(raw, codes, scale, offset, q4_1::<S>),
        QuantType::Q5_0 => blocks::<S, 22, 32, 1>(raw, codes, scale, offset, q5_0::<S>),
        QuantType::Q5_1 => block_loop!(raw, codes, scale, offset, 24, 32, 1, q5_1::<S>),
        QuantType::Q8_0 => blocks::<S, 34, 32, 1>(raw, codes, scale, offset, q8_0::<S>),
        QuantType::IQ4NL => blocks::<S, 18, 32, 1>(raw, codes, scale, offset, iq4_nl::<S>),
        QuantType::MXFP4 => blocks::<S, 17, 32, 1>(raw, codes, scale, offset, mxfp4::<S>),
        QuantType::Q2K => blocks::<S, 84, 256, 16>(raw, codes, scale, offset, q2_k::<S>),
        QuantType::Q3K => block_loop!(raw, codes, scale, offset, 110, 256, 16, q3_k::<S>),
        QuantType::Q4K => blocks::<S, 144, 256, 8>(raw, codes, scale, offset, q4_k::<S>),
        QuantType::Q5K => blocks::<S, 176, 256, 8>(raw, codes, scale, offset, q5_k::<S>),
        QuantType::Q6K => block_loop!(raw, codes, scale, offset, 210, 256, 16, q6_k::<S>),
        QuantType::IQ4XS => block_loop!(raw, codes, scale, offset, 136, 256, 8, iq4_xs::<S>),
        QuantType::F32 | QuantType::F16 | QuantType::BF16 => {
            unreachable!("float formats have no codes")
        }
    }
}

/// The group scales (and offsets) [`unpack_row`] gives a row of `qtype`,
/// without its codes (Q8_0's, read where they lie).
#[inline(always)]
pub(crate) fn scales_only<S: Lanes>(
    qtype: QuantType,
    raw: &[u8],
    scale: &mut [f32],
    offset: &mut [f32],
) {
    // Inlined into the caller's build, so the closures' float16
    // conversions are F16C instructions, not out-of-line calls.
    #[inline(always)]
    fn each<const BB: usize, const NG: usize>(
        raw: &[u8],
        scale: &mut [f32],
        offset: &mut [f32],
        f: impl Fn(&[u8; BB], &mut [f32; NG], &mut [f32; NG]),
    ) {
        let (raw, _) = raw.as_chunks::<BB>();
        let (scale, _) = scale.as_chunks_mut::<NG>();
        let (offset, _) = offset.as_chunks_mut::<NG>();
        let mut dummy = [0.0f32; NG];
        let mut offsets = offset.iter_mut();
        for (b, s) in raw.iter().zip(scale.iter_mut()) {
            f(b, s, offsets.next().unwrap_or(&mut dummy));
        }
    }
    match qtype {
        QuantType::Q4_0 | QuantType::IQ4NL => {
            each::<18, 1>(raw, scale, offset, |b, s, _| s[0] = half::<S>(b, 0))
        }
        QuantType::MXFP4 => each::<17, 1>(raw, scale, offset, |b, s, _| {
            s[0] = E8M0_HALF[usize::from(b[0])]
        }),
        QuantType::Q5_0 => each::<22, 1>(raw, scale, offset, |b, s, _| s[0] = half::<S>(b, 0)),
        QuantType::Q8_0 => each::<34, 1>(raw, scale, offset, |b, s, _| s[0] = half::<S>(b, 0)),
        QuantType::Q4_1 => each::<20, 1>(raw, scale, offset, |b, s, o| {
            s[0] = half::<S>(b, 0);
            o[0] = -half::<S>(b, 2);
        }),
        QuantType::Q5_1 => each::<24, 1>(raw, scale, offset, |b, s, o| {
            s[0] = half::<S>(b, 0);
            o[0] = -half::<S>(b, 2);
        }),
        QuantType::Q4K => {
            each::<144, 8>(raw, scale, offset, |b, s, o| k4_scales::<S, 144>(b, s, o))
        }
        QuantType::Q5K => {
            each::<176, 8>(raw, scale, offset, |b, s, o| k4_scales::<S, 176>(b, s, o))
        }
        QuantType::Q6K => each::<210, 16>(raw, scale, offset, |b, s, _| {
            let sc: &[u8; 16] = part(b, 192);
            let d = half::<S>(b, 208);
            for g in 0..16 {
                s[g] = d * (sc[g] as i8) as f32;
            }
        }),
        _ => unreachable!("{} has no scales-only unpacking", qtype.name()),
    }
}

/// Scales of Q8_0 rows only (its codes are used in place).
#[inline(always)]
pub(crate) fn q8_0_scales<S: Lanes>(raw: &[u8], scale: &mut [f32]) {
    let (blocks, _) = raw.as_chunks::<34>();
    for (b, s) in blocks.iter().zip(scale.iter_mut()) {
        *s = half::<S>(b, 0);
    }
}

/// `f` over the blocks of `raw`, each with its codes, scales and offsets.
#[inline(always)]
fn blocks<S: Lanes, const BB: usize, const BV: usize, const NG: usize>(
    raw: &[u8],
    codes: &mut [i8],
    scale: &mut [f32],
    offset: &mut [f32],
    f: impl Fn(&[u8; BB], &mut [i8; BV], &mut [f32; NG], &mut [f32; NG]),
) {
    block_loop!(raw, codes, scale, offset, BB, BV, NG, f);
}

/// A 32-value block's nibbles (low ones first) minus `bias`.
#[inline(always)]
fn nibbles<S: Lanes>(qs: &[u8; 16], codes: &mut [i8; 32], bias: i8) {
    // SAFETY: `S` is usable here (caller).
    let n = unsafe { S::nibbles16(qs) };
    for j in 0..32 {
        codes[j] = n[j] as i8 - bias;
    }
}

/// `b[at..at + N]` as an array.
#[inline(always)]
fn part<const BB: usize, const N: usize>(b: &[u8; BB], at: usize) -> &[u8; N] {
    b[at..at + N].try_into().expect("in the block")
}

#[inline(always)]
fn q4_0<S: Lanes>(b: &[u8; 18], codes: &mut [i8; 32], scale: &mut [f32; 1], _: &mut [f32; 1]) {
    scale[0] = half::<S>(b, 0);
    nibbles::<S>(part(b, 2), codes, 8);
}

#[inline(always)]
fn q4_1<S: Lanes>(b: &[u8; 20], codes: &mut [i8; 32], scale: &mut [f32; 1], o: &mut [f32; 1]) {
    scale[0] = half::<S>(b, 0);
    // gguf adds `m`: subtracting `-m` is the same single rounding.
    o[0] = -half::<S>(b, 2);
    nibbles::<S>(part(b, 4), codes, 0);
}

/// A 32-value block's nibbles plus its fifth bits (bit `j` of `qh` for
/// value `j`), minus `bias`.
#[inline(always)]
fn fifth_bits<S: Lanes>(qh: u32, qs: &[u8; 16], codes: &mut [i8; 32], bias: i8) {
    // SAFETY: `S` is usable here (caller).
    let (n, h) = unsafe { (S::nibbles16(qs), S::bits32(qh)) };
    for j in 0..32 {
        codes[j] = (n[j] | h[j]) as i8 - bias;
    }
}

#[inline(always)]
fn q5_0<S: Lanes>(b: &[u8; 22], codes: &mut [i8; 32], scale: &mut [f32; 1], _: &mut [f32; 1]) {
    scale[0] = half::<S>(b, 0);
    let qh = u32::from_le_bytes(*part(b, 2));
    fifth_bits::<S>(qh, part(b, 6), codes, 16);
}

#[inline(always)]
fn q5_1<S: Lanes>(b: &[u8; 24], codes: &mut [i8; 32], scale: &mut [f32; 1], o: &mut [f32; 1]) {
    scale[0] = half::<S>(b, 0);
    o[0] = -half::<S>(b, 2);
    let qh = u32::from_le_bytes(*part(b, 4));
    fifth_bits::<S>(qh, part(b, 8), codes, 0);
}

#[inline(always)]
fn q8_0<S: Lanes>(b: &[u8; 34], codes: &mut [i8; 32], scale: &mut [f32; 1], _: &mut [f32; 1]) {
    scale[0] = half::<S>(b, 0);
    let qs: &[u8; 32] = part(b, 2);
    *codes = qs.map(|q| q as i8);
}

#[inline(always)]
fn iq4_nl<S: Lanes>(b: &[u8; 18], codes: &mut [i8; 32], scale: &mut [f32; 1], _: &mut [f32; 1]) {
    scale[0] = half::<S>(b, 0);
    // SAFETY: `S` is usable here (caller).
    *codes = unsafe { S::lookup16(&IQ4_VALUES, &S::nibbles16(part(b, 2))) };
}

#[inline(always)]
fn mxfp4<S: Lanes>(b: &[u8; 17], codes: &mut [i8; 32], scale: &mut [f32; 1], _: &mut [f32; 1]) {
    scale[0] = E8M0_HALF[usize::from(b[0])];
    // SAFETY: `S` is usable here (caller).
    *codes = unsafe { S::lookup16(&MXFP4_VALUES, &S::nibbles16(part(b, 1))) };
}

#[inline(always)]
fn q2_k<S: Lanes>(b: &[u8; 84], codes: &mut [i8; 256], scale: &mut [f32; 16], o: &mut [f32; 16]) {
    let (sc, qs): (&[u8; 16], &[u8; 64]) = (part(b, 0), part(b, 16));
    let (d, dmin) = (half::<S>(b, 80), half::<S>(b, 82));
    for g in 0..16 {
        scale[g] = d * (sc[g] & 0x0f) as f32;
        o[g] = dmin * (sc[g] >> 4) as f32;
    }
    // Value 128c + 32i + l is bits 2i..2i+2 of qs[32c + l].
    for c in 0..2 {
        for i in 0..4 {
            for l in 0..32 {
                codes[128 * c + 32 * i + l] = ((qs[32 * c + l] >> (2 * i)) & 3) as i8;
            }
        }
    }
}

#[inline(always)]
fn q3_k<S: Lanes>(b: &[u8; 110], codes: &mut [i8; 256], scale: &mut [f32; 16], _: &mut [f32; 16]) {
    let (hmask, qs, sc): (&[u8; 32], &[u8; 64], &[u8; 12]) = (part(b, 0), part(b, 32), part(b, 96));
    let d = half::<S>(b, 108);
    for s in 0..16 {
        let low = (sc[s % 8] >> (4 * (s / 8))) & 0x0f;
        let high = (sc[8 + s % 4] >> (2 * (s / 4))) & 3;
        scale[s] = d * ((low | high << 4) as i8 - 32) as f32;
    }
    // Value v = 128c + 32i + l: bits 2i.. of qs[32c + l], minus 4 unless bit
    // v / 32 = 4c + i of hmask[l] is set.
    for c in 0..2 {
        for i in 0..4 {
            for l in 0..32 {
                let q = ((qs[32 * c + l] >> (2 * i)) & 3) as i8;
                let h = ((hmask[l] >> (4 * c + i)) & 1) as i8;
                codes[128 * c + 32 * i + l] = q - 4 + 4 * h;
            }
        }
    }
}

/// Scale and min of sub-block `j` from Q4_K's (and Q5_K's) 12 packed bytes.
#[inline(always)]
fn scale_min_k4(j: usize, q: &[u8; 12]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

#[inline(always)]
pub(crate) fn k4_scales<S: Lanes, const BB: usize>(
    b: &[u8; BB],
    scale: &mut [f32; 8],
    o: &mut [f32; 8],
) {
    let (d, dmin) = (half::<S>(b, 0), half::<S>(b, 2));
    let sc: &[u8; 12] = part(b, 4);
    for j in 0..8 {
        let (s, m) = scale_min_k4(j, sc);
        scale[j] = d * s as f32;
        o[j] = dmin * m as f32;
    }
}

#[inline(always)]
fn q4_k<S: Lanes>(b: &[u8; 144], codes: &mut [i8; 256], scale: &mut [f32; 8], o: &mut [f32; 8]) {
    k4_scales::<S, 144>(b, scale, o);
    let qs: &[u8; 128] = part(b, 16);
    // Values 64c .. 64c + 32 are the low nibbles of qs[32c ..], the next 32 the high ones.
    for c in 0..4 {
        for l in 0..32 {
            codes[64 * c + l] = (qs[32 * c + l] & 0x0f) as i8;
            codes[64 * c + 32 + l] = (qs[32 * c + l] >> 4) as i8;
        }
    }
}

#[inline(always)]
fn q5_k<S: Lanes>(b: &[u8; 176], codes: &mut [i8; 256], scale: &mut [f32; 8], o: &mut [f32; 8]) {
    k4_scales::<S, 176>(b, scale, o);
    let (qh, qs): (&[u8; 32], &[u8; 128]) = (part(b, 16), part(b, 48));
    for c in 0..4 {
        for l in 0..32 {
            let q = qs[32 * c + l];
            codes[64 * c + l] = ((q & 0x0f) | ((qh[l] >> (2 * c)) & 1) << 4) as i8;
            codes[64 * c + 32 + l] = ((q >> 4) | ((qh[l] >> (2 * c + 1)) & 1) << 4) as i8;
        }
    }
}

#[inline(always)]
fn q6_k<S: Lanes>(b: &[u8; 210], codes: &mut [i8; 256], scale: &mut [f32; 16], _: &mut [f32; 16]) {
    let (ql, qh, sc): (&[u8; 128], &[u8; 64], &[u8; 16]) = (part(b, 0), part(b, 128), part(b, 192));
    let d = half::<S>(b, 208);
    for g in 0..16 {
        scale[g] = d * (sc[g] as i8) as f32;
    }
    for h in 0..2 {
        for l in 0..32 {
            let (a, c, q) = (ql[64 * h + l], ql[64 * h + l + 32], qh[32 * h + l]);
            let y = 128 * h + l;
            codes[y] = ((a & 0x0f) | (q & 3) << 4) as i8 - 32;
            codes[y + 32] = ((c & 0x0f) | ((q >> 2) & 3) << 4) as i8 - 32;
            codes[y + 64] = ((a >> 4) | ((q >> 4) & 3) << 4) as i8 - 32;
            codes[y + 96] = ((c >> 4) | ((q >> 6) & 3) << 4) as i8 - 32;
        }
    }
}

#[inline(always)]
fn iq4_xs<S: Lanes>(b: &[u8; 136], codes: &mut [i8; 256], scale: &mut [f32; 8], _: &mut [f32; 8]) {
    let d = half::<S>(b, 0);
    let scales_h = u16::from_le_bytes(*part(b, 2));
    let (scales_l, qs): (&[u8; 4], &[u8; 128]) = (part(b, 4), part(b, 8));
    for ib in 0..8 {
        let lo = (scales_l[ib / 2] >> (4 * (ib % 2))) & 0x0f;
        let hi = ((scales_h >> (2 * ib)) & 3) as u8;
        scale[ib] = d * ((lo | hi << 4) as i8 - 32) as f32;
        // SAFETY: `S` is usable here (caller).
        let c = unsafe { S::lookup16(&IQ4_VALUES, &S::nibbles16(part(qs, 16 * ib))) };
        codes[32 * ib..32 * ib + 32].copy_from_slice(&c);
    }
}

/// One float value of a float format from its bytes.
#[inline(always)]
pub(crate) fn float_at(qtype: QuantType, b: &[u8]) -> f32 {
    match qtype {
        QuantType::F32 => f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
        QuantType::F16 => f16_to_f32(u16::from_le_bytes([b[0], b[1]])),
        QuantType::BF16 => f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16),
        _ => unreachable!("not a float format"),
    }
}

/// Dequantise one row (`raw` holds whole blocks) into `out` (as many values
/// as the blocks hold), exactly as gguf does.
pub fn dequantize_row(qtype: QuantType, raw: &[u8], out: &mut [f32]) {
    if qtype.is_float() {
        let size = qtype.block_bytes();
        for (y, b) in out.iter_mut().zip(raw.chunks_exact(size)) {
            *y = float_at(qtype, b);
        }
        return;
    }
    let (bv, bb, gv) = (
        qtype.block_values(),
        qtype.block_bytes(),
        qtype.group_values(),
    );
    let mut codes = [0i8; 256];
    let (mut scale, mut offset) = ([0f32; 16], [0f32; 16]);
    let offsets = qtype.has_offsets();
    for (block, y) in raw.chunks_exact(bb).zip(out.chunks_exact_mut(bv)) {
        unpack_row::<Portable>(
            qtype,
            block,
            &mut codes[..bv],
            &mut scale[..bv / gv],
            &mut offset[..bv / gv],
        );
        for (v, y) in y.iter_mut().enumerate() {
            let w = codes[v] as f32 * scale[v / gv];
            *y = if offsets { w - offset[v / gv] } else { w };
        }
    }
}
