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
//! | Q2_K | 256 / 84 | 16 B of 4-bit scale / 4-bit min, 64 B of 2-bit q, `d`, `dmin` | `d*sc * q - dmin*m` (16 values a group) |
//! | Q3_K | 256 / 110 | 32 B high bits, 64 B of 2-bit q, 12 B of 6-bit scales, `d` | `d*(sc-32) * (q - 4*!h)` (16) |
//! | Q4_K | 256 / 144 | `d`, `dmin`, 12 B of 6-bit scales and mins, 128 B of nibbles | `d*sc * q - dmin*m` (32) |
//! | Q5_K | 256 / 176 | `d`, `dmin`, 12 B scales and mins, 32 B fifth bits, 128 B nibbles | `d*sc * q - dmin*m` (32) |
//! | Q6_K | 256 / 210 | 128 B low nibbles, 64 B of 2-bit highs, 16 int8 scales, `d` | `d*sc * (q - 32)` (16) |
//! | IQ4_XS | 256 / 136 | `d`, u16 high scale bits, 4 B low scale bits, 128 B nibbles | `d*(sc-32) * T[q]` (32) |

use super::format::QuantType;
use crate::kv::f16_to_f32;

/// IQ4_NL's and IQ4_XS's non-linear code book.
pub(crate) const IQ4_VALUES: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

#[inline(always)]
fn half(b: &[u8], at: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[at], b[at + 1]]))
}

/// Unpack one block of a block format: `codes` gets `block_values` codes,
/// `scale` and `offset` one entry per group of `group_values` (`offset` is
/// left alone for symmetric formats). `block` is `block_bytes` long.
#[inline(always)]
pub(crate) fn unpack_block(
    qtype: QuantType,
    block: &[u8],
    codes: &mut [i8],
    scale: &mut [f32],
    offset: &mut [f32],
) {
    match qtype {
        QuantType::Q4_0 => q4_0(block, codes, scale),
        QuantType::Q4_1 => q4_1(block, codes, scale, offset),
        QuantType::Q5_0 => q5_0(block, codes, scale),
        QuantType::Q5_1 => q5_1(block, codes, scale, offset),
        QuantType::Q8_0 => q8_0(block, codes, scale),
        QuantType::IQ4NL => iq4_nl(block, codes, scale),
        QuantType::Q2K => q2_k(block, codes, scale, offset),
        QuantType::Q3K => q3_k(block, codes, scale),
        QuantType::Q4K => q4_k(block, codes, scale, offset),
        QuantType::Q5K => q5_k(block, codes, scale, offset),
        QuantType::Q6K => q6_k(block, codes, scale),
        QuantType::IQ4XS => iq4_xs(block, codes, scale),
        QuantType::F32 | QuantType::F16 | QuantType::BF16 => {
            unreachable!("float formats have no codes")
        }
    }
}

#[inline(always)]
fn nibbles(qs: &[u8], codes: &mut [i8], bias: i8) {
    let n = qs.len();
    for j in 0..n {
        codes[j] = (qs[j] & 0x0f) as i8 - bias;
        codes[j + n] = (qs[j] >> 4) as i8 - bias;
    }
}

#[inline(always)]
fn q4_0(b: &[u8], codes: &mut [i8], scale: &mut [f32]) {
    scale[0] = half(b, 0);
    nibbles(&b[2..18], codes, 8);
}

#[inline(always)]
fn q4_1(b: &[u8], codes: &mut [i8], scale: &mut [f32], offset: &mut [f32]) {
    scale[0] = half(b, 0);
    // gguf adds `m`: subtracting `-m` is the same single rounding.
    offset[0] = -half(b, 2);
    nibbles(&b[4..20], codes, 0);
}

#[inline(always)]
fn fifth_bits(qh: u32, qs: &[u8], codes: &mut [i8], bias: i8) {
    for j in 0..16 {
        let lo = (qs[j] & 0x0f) | (((qh >> j) & 1) as u8) << 4;
        let hi = (qs[j] >> 4) | (((qh >> (j + 16)) & 1) as u8) << 4;
        codes[j] = lo as i8 - bias;
        codes[j + 16] = hi as i8 - bias;
    }
}

#[inline(always)]
fn q5_0(b: &[u8], codes: &mut [i8], scale: &mut [f32]) {
    scale[0] = half(b, 0);
    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    fifth_bits(qh, &b[6..22], codes, 16);
}

#[inline(always)]
fn q5_1(b: &[u8], codes: &mut [i8], scale: &mut [f32], offset: &mut [f32]) {
    scale[0] = half(b, 0);
    offset[0] = -half(b, 2);
    let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    fifth_bits(qh, &b[8..24], codes, 0);
}

#[inline(always)]
fn q8_0(b: &[u8], codes: &mut [i8], scale: &mut [f32]) {
    scale[0] = half(b, 0);
    for (c, &q) in codes[..32].iter_mut().zip(&b[2..34]) {
        *c = q as i8;
    }
}

#[inline(always)]
fn iq4_nl(b: &[u8], codes: &mut [i8], scale: &mut [f32]) {
    scale[0] = half(b, 0);
    for j in 0..16 {
        codes[j] = IQ4_VALUES[(b[2 + j] & 0x0f) as usize];
        codes[j + 16] = IQ4_VALUES[(b[2 + j] >> 4) as usize];
    }
}

#[inline(always)]
fn q2_k(b: &[u8], codes: &mut [i8], scale: &mut [f32], offset: &mut [f32]) {
    let (sc, qs) = (&b[0..16], &b[16..80]);
    let (d, dmin) = (half(b, 80), half(b, 82));
    for g in 0..16 {
        scale[g] = d * (sc[g] & 0x0f) as f32;
        offset[g] = dmin * (sc[g] >> 4) as f32;
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
fn q3_k(b: &[u8], codes: &mut [i8], scale: &mut [f32]) {
    let (hmask, qs, sc) = (&b[0..32], &b[32..96], &b[96..108]);
    let d = half(b, 108);
    for s in 0..16 {
        let low = (sc[s % 8] >> (4 * (s / 8))) & 0x0f;
        let high = (sc[8 + s % 4] >> (2 * (s / 4))) & 3;
        scale[s] = d * ((low | high << 4) as i8 - 32) as f32;
    }
    // Value v = 128c + 32i + l: bits 2i.. of qs[32c + l], minus 4 unless bit
    // v / 32 of hmask[l] is set.
    for c in 0..2 {
        for i in 0..4 {
            for l in 0..32 {
                let v = 128 * c + 32 * i + l;
                let q = ((qs[32 * c + l] >> (2 * i)) & 3) as i8;
                let h = ((hmask[l] >> (v / 32)) & 1) as i8;
                codes[v] = q - 4 + 4 * h;
            }
        }
    }
}

/// Scale and min of sub-block `j` from Q4_K's (and Q5_K's) 12 packed bytes.
#[inline(always)]
fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
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
fn k4_scales(b: &[u8], scale: &mut [f32], offset: &mut [f32]) {
    let (d, dmin) = (half(b, 0), half(b, 2));
    for j in 0..8 {
        let (sc, m) = scale_min_k4(j, &b[4..16]);
        scale[j] = d * sc as f32;
        offset[j] = dmin * m as f32;
    }
}

#[inline(always)]
fn q4_k(b: &[u8], codes: &mut [i8], scale: &mut [f32], offset: &mut [f32]) {
    k4_scales(b, scale, offset);
    // Values 64c .. 64c + 32 are the low nibbles of qs[32c ..], the next 32 the high ones.
    for (c, qs) in b[16..144].chunks_exact(32).enumerate() {
        for l in 0..32 {
            codes[64 * c + l] = (qs[l] & 0x0f) as i8;
            codes[64 * c + 32 + l] = (qs[l] >> 4) as i8;
        }
    }
}

#[inline(always)]
fn q5_k(b: &[u8], codes: &mut [i8], scale: &mut [f32], offset: &mut [f32]) {
    k4_scales(b, scale, offset);
    let qh = &b[16..48];
    for (c, qs) in b[48..176].chunks_exact(32).enumerate() {
        for l in 0..32 {
            let (v0, v1) = (64 * c + l, 64 * c + 32 + l);
            codes[v0] = ((qs[l] & 0x0f) | ((qh[l] >> (v0 / 32)) & 1) << 4) as i8;
            codes[v1] = ((qs[l] >> 4) | ((qh[l] >> (v1 / 32)) & 1) << 4) as i8;
        }
    }
}

#[inline(always)]
fn q6_k(b: &[u8], codes: &mut [i8], scale: &mut [f32]) {
    let (ql, qh, sc) = (&b[0..128], &b[128..192], &b[192..208]);
    let d = half(b, 208);
    for g in 0..16 {
        scale[g] = d * (sc[g] as i8) as f32;
    }
    for h in 0..2 {
        let (ql, qh) = (&ql[64 * h..64 * h + 64], &qh[32 * h..32 * h + 32]);
        let y = &mut codes[128 * h..128 * h + 128];
        for l in 0..32 {
            y[l] = ((ql[l] & 0x0f) | (qh[l] & 3) << 4) as i8 - 32;
            y[l + 32] = ((ql[l + 32] & 0x0f) | ((qh[l] >> 2) & 3) << 4) as i8 - 32;
            y[l + 64] = ((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4) as i8 - 32;
            y[l + 96] = ((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4) as i8 - 32;
        }
    }
}

#[inline(always)]
fn iq4_xs(b: &[u8], codes: &mut [i8], scale: &mut [f32]) {
    let d = half(b, 0);
    let scales_h = u16::from_le_bytes([b[2], b[3]]);
    let (scales_l, qs) = (&b[4..8], &b[8..136]);
    for ib in 0..8 {
        let lo = (scales_l[ib / 2] >> (4 * (ib % 2))) & 0x0f;
        let hi = ((scales_h >> (2 * ib)) & 3) as u8;
        scale[ib] = d * ((lo | hi << 4) as i8 - 32) as f32;
        let q = &qs[16 * ib..16 * ib + 16];
        for l in 0..16 {
            codes[32 * ib + l] = IQ4_VALUES[(q[l] & 0x0f) as usize];
            codes[32 * ib + 16 + l] = IQ4_VALUES[(q[l] >> 4) as usize];
        }
    }
}

/// Unpack a whole row of blocks (`raw` is one row, `codes` `cols` long,
/// `scale`/`offset` `cols / group_values` long).
#[inline(always)]
pub(crate) fn unpack_row(
    qtype: QuantType,
    raw: &[u8],
    codes: &mut [i8],
    scale: &mut [f32],
    offset: &mut [f32],
) {
    let (bv, bb) = (qtype.block_values(), qtype.block_bytes());
    let gpb = bv / qtype.group_values();
    let offsets = qtype.has_offsets();
    for (i, block) in raw.chunks_exact(bb).enumerate() {
        let (s, o) = (&mut scale[i * gpb..(i + 1) * gpb], i * gpb..(i + 1) * gpb);
        let o = if offsets { &mut offset[o] } else { &mut [][..] };
        unpack_block(qtype, block, &mut codes[i * bv..(i + 1) * bv], s, o);
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
        unpack_block(
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
