use super::format::ALL;
use super::*;

/// A small deterministic generator.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        self.0 >> 24
    }
    fn byte(&mut self) -> u8 {
        self.next() as u8
    }
    /// Uniform in [-1, 1).
    fn unit(&mut self) -> f32 {
        (self.next() % 2_000_000) as f32 / 1_000_000.0 - 1.0
    }
}

/// Where a block keeps its float16 scales.
fn half_fields(qtype: QuantType) -> &'static [usize] {
    match qtype {
        QuantType::Q4_1 | QuantType::Q5_1 | QuantType::Q4K | QuantType::Q5K => &[0, 2],
        QuantType::Q2K => &[80, 82],
        QuantType::Q3K => &[108],
        QuantType::Q6K => &[208],
        _ => &[0],
    }
}

/// `rows` random rows of `cols` values: arbitrary bits, except finite,
/// smallish float16 scales (MXFP4: E8M0 exponents of smallish scales; and
/// finite floats for the float formats).
fn random_rows(qtype: QuantType, rows: usize, cols: usize, rng: &mut Rng) -> Vec<u8> {
    let rb = qtype.row_bytes(cols).unwrap();
    let mut raw: Vec<u8> = (0..rows * rb).map(|_| rng.byte()).collect();
    match qtype {
        QuantType::F32 => {
            for v in raw.chunks_exact_mut(4) {
                v.copy_from_slice(&rng.unit().to_le_bytes());
            }
        }
        QuantType::F16 | QuantType::BF16 => {
            for v in raw.chunks_exact_mut(2) {
                // Exponent bits well inside the finite range of both formats.
                v[1] = (v[1] & 0x83) | 0x30;
            }
        }
        QuantType::MXFP4 => {
            for blk in raw.chunks_exact_mut(17) {
                // E8M0 scales 2^-12 .. 2^-1 (every byte is one; the
                // extremes have their own test).
                blk[0] = 116 + (rng.byte() % 12);
            }
        }
        _ => {
            for blk in raw.chunks_exact_mut(qtype.block_bytes()) {
                for &at in half_fields(qtype) {
                    blk[at] = rng.byte();
                    blk[at + 1] = (rng.byte() & 0x83) | 0x1c; // |h| in [2^-8, 2^-4)
                }
            }
        }
    }
    raw
}

fn dequantized(qtype: QuantType, raw: &[u8], rows: usize, cols: usize) -> Vec<f32> {
    let rb = qtype.row_bytes(cols).unwrap();
    let mut w = vec![0.0f32; rows * cols];
    for r in 0..rows {
        dequantize_row(
            qtype,
            &raw[r * rb..(r + 1) * rb],
            &mut w[r * cols..(r + 1) * cols],
        );
    }
    w
}

/// Columns for which `qtype` has whole blocks: one odd count and a few more.
fn shapes(qtype: QuantType) -> Vec<usize> {
    match qtype.block_values() {
        1 => vec![1, 7, 13, 64, 77],
        32 => vec![32, 96, 224],
        _ => vec![256, 768],
    }
}

/// The speed probes' formats (`QT`, comma-separated names, or `default`),
/// each with SmolLM2's matrix shape for it: 1536 x 576, or 576 x 1536 for
/// the 256-value K-quant blocks.
fn probe_formats(default: &str) -> Vec<(QuantType, usize, usize)> {
    let list = std::env::var("QT").unwrap_or_else(|_| default.into());
    // `QS=ROWSxCOLS` (e.g. 576x1536, SmolLM2's down projection) for every format.
    let shape = std::env::var("QS").ok().map(|s| {
        let (r, c) = s.split_once('x').expect("QS=ROWSxCOLS");
        (r.parse().unwrap(), c.parse().unwrap())
    });
    list.split(',')
        .map(|name| {
            let qtype = ALL.into_iter().find(|t| t.name() == name).unwrap();
            if let Some((rows, cols)) = shape {
                (qtype, rows, cols)
            } else if qtype.block_values() == 256 {
                (qtype, 576, 1536)
            } else {
                (qtype, 1536, 576)
            }
        })
        .collect()
}

/// Every build this CPU runs, widest first (the AVX-512 one where the CPU
/// has it, whatever `RLX_SIMD` says).
fn builds() -> Vec<Build> {
    let mut all = vec![Build::Portable];
    #[cfg(target_arch = "x86_64")]
    {
        if has_avx2() {
            all.insert(0, Build::Avx2);
        }
        if has_avx512() {
            all.insert(0, Build::Avx512);
        }
    }
    #[cfg(target_arch = "aarch64")]
    all.insert(0, Build::Neon);
    all
}

#[test]
fn q8_0_and_q4_0_blocks_decode_by_hand() {
    // d = 0.5 (f16 0x3800).
    let mut b = vec![0x00, 0x38];
    b.extend((0..32).map(|i| (i as i8 - 16) as u8));
    let mut y = vec![0.0; 32];
    dequantize_row(QuantType::Q8_0, &b, &mut y);
    assert_eq!(y[0], -8.0);
    assert_eq!(y[31], 7.5);
    let mut b = vec![0x00, 0x38];
    b.extend((0..16).map(|i| (i as u8) | (15 - i as u8) << 4));
    dequantize_row(QuantType::Q4_0, &b, &mut y);
    assert_eq!((y[0], y[15], y[16], y[31]), (-4.0, 3.5, 3.5, -4.0));
    // Q4_1: d = 0.5, m = -1: x = q / 2 - 1.
    let mut b = vec![0x00, 0x38, 0x00, 0xbc];
    b.extend((0..16).map(|i| (i as u8) | (15 - i as u8) << 4));
    dequantize_row(QuantType::Q4_1, &b, &mut y);
    assert_eq!((y[0], y[15], y[16], y[31]), (-1.0, 6.5, 6.5, -1.0));
    // IQ4_NL: d = 1, nibble 0 is -127, 15 is 113.
    let mut b = vec![0x00, 0x3c];
    b.extend([0xf0u8; 16]);
    dequantize_row(QuantType::IQ4NL, &b, &mut y);
    assert_eq!((y[0], y[16]), (-127.0, 113.0));
    // Q5_0: the fifth bit of value 3 set: q = 15 + 16 - 16.
    let mut b = vec![0x00, 0x3c, 0x08, 0, 0, 0];
    b.extend([0x0fu8; 16]);
    dequantize_row(QuantType::Q5_0, &b, &mut y);
    assert_eq!((y[2], y[3], y[16]), (-1.0, 15.0, -16.0));
}

#[test]
fn mxfp4_scales_are_ggmls_e8m0_halves_and_blocks_decode_by_hand() {
    use super::unpack::{e8m0_half, E8M0_HALF, MXFP4_VALUES};
    // GGML_E8M0_TO_FP32_HALF: subnormals below e = 2, then (e - 1) << 23.
    for (e, bits) in [
        (0u8, 0x0020_0000u32),
        (1, 0x0040_0000),
        (2, 0x0080_0000),
        (126, 0x3e80_0000),
        (127, 0x3f00_0000),
        (128, 0x3f80_0000),
        (254, 0x7e80_0000),
        (255, 0x7f00_0000),
    ] {
        assert_eq!(e8m0_half(e).to_bits(), bits, "e = {e}");
    }
    for e in 0..=255u8 {
        // 2^(e - 128), exact in float32 for every byte.
        let want = (f64::from(e) - 128.0).exp2() as f32;
        assert_eq!(e8m0_half(e).to_bits(), want.to_bits(), "e = {e}");
        assert_eq!(
            E8M0_HALF[usize::from(e)].to_bits(),
            want.to_bits(),
            "e = {e}"
        );
    }
    // Twice the E2M1 values: 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives.
    assert_eq!(
        MXFP4_VALUES,
        [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12]
    );
    // e = 129 (scale 2): byte j's low nibble is value j, its high one j + 16.
    let mut b = vec![129u8];
    b.extend((0..16).map(|j| (j as u8) | ((15 - j as u8) << 4)));
    let mut y = vec![0.0f32; 64];
    dequantize_row(QuantType::MXFP4, &b, &mut y[..32]);
    for j in 0..16 {
        assert_eq!(y[j], 2.0 * f32::from(MXFP4_VALUES[j]), "value {j}");
        assert_eq!(
            y[16 + j],
            2.0 * f32::from(MXFP4_VALUES[15 - j]),
            "value {}",
            16 + j
        );
    }
    assert_eq!((y[7], y[15], y[16], y[31]), (24.0, -24.0, -24.0, 0.0));
    // Two blocks: e = 0 (2^-128, a subnormal) and e = 255 (2^127), where
    // codes of 2 and more overflow to infinity as in gguf.
    let mut b = vec![0u8, 0x97];
    b.extend([0u8; 15]);
    b.extend([255u8, 0x21, 0x09]);
    b.extend([0u8; 14]);
    dequantize_row(QuantType::MXFP4, &b, &mut y);
    assert_eq!(y[0].to_bits(), 0x0140_0000); // 12 * 2^-128 = 1.5 * 2^-125
    assert_eq!(y[0], (12.0 * (-128f64).exp2()) as f32);
    assert_eq!(y[16].to_bits(), 0x8020_0000); // -2^-128
    assert_eq!(y[1], 0.0);
    let big = 2f32.powi(127);
    assert_eq!(
        (y[32], y[48], y[33], y[49]),
        (big, f32::INFINITY, -big, 0.0)
    );
}

/// Bytes of a block that hold its codes (zeroed, a block dequantises to
/// `-offset`), for formats with offsets.
fn code_bytes(qtype: QuantType) -> std::ops::Range<usize> {
    match qtype {
        QuantType::Q4_1 => 4..20,
        QuantType::Q5_1 => 4..24,
        QuantType::Q2K => 16..80,
        QuantType::Q4K => 16..144,
        QuantType::Q5K => 16..176,
        _ => 0..0,
    }
}

/// `|offset|` of every weight (zero for symmetric formats).
fn offsets(qtype: QuantType, raw: &[u8], rows: usize, cols: usize) -> Vec<f32> {
    if !qtype.has_offsets() {
        return vec![0.0; rows * cols];
    }
    let mut zeroed = raw.to_vec();
    for blk in zeroed.chunks_exact_mut(qtype.block_bytes()) {
        blk[code_bytes(qtype)].fill(0);
    }
    dequantized(qtype, &zeroed, rows, cols)
        .into_iter()
        .map(f32::abs)
        .collect()
}

/// The float32 bound of the kernels' sums (see `kernel`): with `G` values a
/// group, `|got - exact| <= 2^-24 * (c1 * sum |w x| + c2 * sum |offset x|)`,
/// `c1` covering a group sum, its scaling, the sum over groups and of the
/// lanes (or, for float formats, `k / 8` steps, the lanes and the tail),
/// `c2` the sums of the activations over each group too.
pub(crate) fn bound(qtype: QuantType, k: usize, abs_w: f64, abs_off: f64) -> f64 {
    let g = qtype.group_values().max(8);
    // k / 8 multiply-adds a lane, the lanes' sum, the offset's subtraction
    // and one more (float formats: the tail columns one by one). The
    // group-sum order (see `kernel`) rounds a value at most G / 8 + k / G +
    // 4 times (gguf's weights `code * scale` are exact in float32), which
    // is never more than k / 8 + 5 for G >= 8.
    let c1 = if qtype.is_float() {
        k / 8 + 4 + k % 8
    } else {
        k / 8 + 5
    };
    let c2 = c1 + g + k / g + 2;
    // Doubled for the portable build, whose multiply-add rounds twice.
    2.0 * f64::from(f32::EPSILON) / 2.0 * (c1 as f64 * (abs_w + abs_off) + c2 as f64 * abs_off)
        + 1e-30
}

fn check_matmul(build: Build, qtype: QuantType, rows: usize, cols: usize, n: usize, rng: &mut Rng) {
    let raw = random_rows(qtype, rows, cols, rng);
    let x: Vec<f32> = (0..n * cols).map(|_| rng.unit()).collect();
    check_matmul_on(build, qtype, &raw, rows, cols, &x);
}

/// [`check_matmul`] on given weights and activations.
fn check_matmul_on(
    build: Build,
    qtype: QuantType,
    raw: &[u8],
    rows: usize,
    cols: usize,
    x: &[f32],
) {
    let n = x.len() / cols;
    let w = dequantized(qtype, raw, rows, cols);
    let off = offsets(qtype, raw, rows, cols);
    let mut out = vec![f32::NAN; n * rows];
    matmul_with(build, true, qtype, raw, rows, cols, x, &mut out).unwrap();
    for t in 0..n {
        for r in 0..rows {
            let (mut want, mut abs, mut abs_off) = (0.0f64, 0.0f64, 0.0f64);
            for c in 0..cols {
                let xv = f64::from(x[t * cols + c]);
                let p = f64::from(w[r * cols + c]) * xv;
                want += p;
                abs += p.abs();
                abs_off += f64::from(off[r * cols + c]) * xv.abs();
            }
            let got = f64::from(out[t * rows + r]);
            assert!(
                (got - want).abs() <= bound(qtype, cols, abs, abs_off),
                "{} {build:?} {rows}x{cols} n={n} ({t}, {r}): {got} vs {want}",
                qtype.name()
            );
        }
    }
}

#[test]
fn matmul_is_x_times_the_dequantised_weight_in_every_format() {
    let mut rng = Rng(9);
    for build in builds() {
        for qtype in ALL {
            for cols in shapes(qtype) {
                for (rows, n) in [(1, 1), (7, 3), (13, 9), (5, 17)] {
                    check_matmul(build, qtype, rows, cols, n, &mut rng);
                }
            }
        }
    }
}

#[test]
fn threaded_matmul_matches_the_bound_too() {
    let mut rng = Rng(3);
    for build in builds() {
        for qtype in [
            QuantType::Q4K,
            QuantType::Q8_0,
            QuantType::F16,
            QuantType::Q4_0,
        ] {
            for n in [1, 2] {
                check_matmul(build, qtype, 301, 512, n, &mut rng);
            }
        }
    }
}

#[test]
fn one_row_gives_the_same_bits_alone_in_a_batch_and_on_any_thread_count() {
    let mut rng = Rng(11);
    for qtype in ALL {
        let (rows, cols) = (
            203,
            if qtype.block_values() == 256 {
                512
            } else {
                160
            },
        );
        let raw = random_rows(qtype, rows, cols, &mut rng);
        let n = 13;
        let x: Vec<f32> = (0..n * cols).map(|_| rng.unit()).collect();
        let mut batch = vec![0.0f32; n * rows];
        let pool = |t| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(t)
                .build()
                .unwrap()
        };
        pool(2).install(|| matmul(qtype, &raw, rows, cols, &x, &mut batch).unwrap());
        for threads in [1, 3] {
            for (t, m) in [(0, 1), (5, 1), (12, 1), (3, 4), (8, 5)] {
                let mut part = vec![0.0f32; m * rows];
                let xs = &x[t * cols..(t + m) * cols];
                pool(threads).install(|| matmul(qtype, &raw, rows, cols, xs, &mut part).unwrap());
                if threads == 1 {
                    let mut serial = vec![0.0f32; m * rows];
                    matmul_serial(qtype, &raw, rows, cols, xs, &mut serial).unwrap();
                    assert!(serial
                        .iter()
                        .zip(&part)
                        .all(|(a, b)| a.to_bits() == b.to_bits()));
                }
                for j in 0..m {
                    let (a, b) = (&part[j * rows..(j + 1) * rows], &batch[(t + j) * rows..]);
                    for r in 0..rows {
                        assert_eq!(
                            a[r].to_bits(),
                            b[r].to_bits(),
                            "{} {t}+{j} {r}",
                            qtype.name()
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn batches_of_1_to_9_rows_give_each_row_its_single_row_bits_in_every_build() {
    // Two or more activation rows go through `multirow`, one through `kernel`.
    let mut rng = Rng(21);
    for build in builds() {
        for qtype in ALL {
            let cols = if qtype.is_float() {
                45
            } else {
                2 * qtype.block_values()
            };
            for rows in [1, 7, 14] {
                let raw = random_rows(qtype, rows, cols, &mut rng);
                let x: Vec<f32> = (0..9 * cols).map(|_| rng.unit()).collect();
                let mut alone = vec![0.0f32; 9 * rows];
                for t in 0..9 {
                    let (xs, o) = (&x[t * cols..(t + 1) * cols], &mut alone[t * rows..][..rows]);
                    matmul_with(build, false, qtype, &raw, rows, cols, xs, o).unwrap();
                }
                for b in 2..=9 {
                    let mut got = vec![f32::NAN; b * rows];
                    let xs = &x[..b * cols];
                    matmul_with(build, true, qtype, &raw, rows, cols, xs, &mut got).unwrap();
                    for (i, (g, a)) in got.iter().zip(&alone).enumerate() {
                        assert_eq!(
                            g.to_bits(),
                            a.to_bits(),
                            "{} {build:?} {rows}x{cols} b={b} element {i}",
                            qtype.name()
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn gathered_rows_are_the_dequantised_rows() {
    let mut rng = Rng(5);
    for qtype in ALL {
        let cols = shapes(qtype)[1];
        let raw = random_rows(qtype, 6, cols, &mut rng);
        let w = dequantized(qtype, &raw, 6, cols);
        let mut out = vec![0.0; 3 * cols];
        gather_rows(qtype, &raw, 6, cols, &[5, 0, 5], &mut out).unwrap();
        assert_eq!(&out[..cols], &w[5 * cols..]);
        assert_eq!(&out[cols..2 * cols], &w[..cols]);
    }
}

#[test]
fn bad_shapes_and_ids_are_errors() {
    let raw = vec![0u8; 34 * 2];
    let mut out = vec![0.0; 32];
    assert!(matmul(QuantType::Q8_0, &raw, 3, 32, &[0.0; 32], &mut [0.0; 3]).is_err());
    assert!(matmul(QuantType::Q8_0, &raw, 2, 32, &[0.0; 33], &mut [0.0; 2]).is_err());
    assert!(matmul(QuantType::Q8_0, &raw, 2, 32, &[0.0; 32], &mut [0.0; 3]).is_err());
    assert!(matmul(
        QuantType::Q8_0,
        &raw,
        usize::MAX,
        32,
        &[0.0; 32],
        &mut [0.0; 3]
    )
    .is_err());
    assert!(matmul(QuantType::Q8_0, &raw, 2, 32, &[], &mut []).is_ok());
    assert_eq!(
        gather_rows(QuantType::Q8_0, &raw, 2, 32, &[2], &mut out),
        Err(CoreError::TokenOutOfRange { token: 2, vocab: 2 })
    );
    assert_eq!(
        gather_rows(QuantType::Q8_0, &raw, 2, 32, &[-1], &mut out),
        Err(CoreError::TokenOutOfRange {
            token: -1,
            vocab: 2
        })
    );
    assert!(gather_rows(QuantType::Q8_0, &raw, 2, 32, &[0, 1], &mut out).is_err());
}

#[cfg(target_arch = "x86_64")]
#[test]
fn the_f16c_half_is_the_portable_half() {
    use super::simd::{Avx2, Lanes, Portable};
    if !has_avx2() {
        return;
    }
    for h in 0..=u16::MAX {
        // SAFETY: AVX2/F16C checked above.
        let (a, b) = unsafe { (Avx2::half(h), Portable::half(h)) };
        assert!(
            a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()),
            "{h:#06x}"
        );
    }
}

/// Kernel speed on this machine, in CPU time (robust to a busy machine):
/// `cargo test --release -q perf_probe -- --ignored --nocapture`.
#[test]
#[ignore]
fn perf_probe() {
    fn cpu() -> f64 {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: a valid timespec to fill.
        unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
        ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
    }
    let mut rng = Rng(1);
    for (qtype, rows, cols) in probe_formats("Q8_0,Q4_0,Q5_0,Q4_K,Q6_K,F16") {
        let name = qtype.name();
        let raw = random_rows(qtype, rows, cols, &mut rng);
        for n in [1usize, 2, 4, 8, 16] {
            let x: Vec<f32> = (0..n * cols).map(|_| rng.unit()).collect();
            let mut out = vec![0.0f32; n * rows];
            // Many short trials, the best of them: on a loaded machine most
            // trials are interrupted, a short one often is not.
            let reps = (2_000_000 / (rows * cols * n)).max(1);
            let mut best = f64::MAX;
            for _ in 0..80 {
                let t0 = cpu();
                for _ in 0..reps {
                    // SAFETY: out is n x rows.
                    let xsum = kernel::offset_sums(qtype, &x);
                    let job = Job {
                        qtype,
                        raw: &raw,
                        row_bytes: qtype.row_bytes(cols).unwrap(),
                        rows,
                        cols,
                        x: &x,
                        n,
                        xsum: &xsum,
                    };
                    unsafe { run(best_build(), &job, 0, rows, out.as_mut_ptr()) };
                }
                best = best.min((cpu() - t0) / reps as f64);
            }
            println!(
                "{name:6} n={n}: {:7.1} us  {:5.2} GB/s  {:5.2} Gmac/s",
                best * 1e6,
                raw.len() as f64 / best / 1e9,
                (rows * cols * n) as f64 / best / 1e9
            );
        }
    }
}

/// The fast mode against a float64 product of gguf's weights with the
/// dequantised int8 activations (`d * q`), to float32 rounding.
fn check_q8(build: Build, qtype: QuantType, rows: usize, cols: usize, n: usize, rng: &mut Rng) {
    let raw = random_rows(qtype, rows, cols, rng);
    let x: Vec<f32> = (0..n * cols).map(|_| rng.unit() * 3.0).collect();
    check_q8_on(build, qtype, &raw, rows, cols, &x);
}

/// [`check_q8`] on given weights and activations.
fn check_q8_on(build: Build, qtype: QuantType, raw: &[u8], rows: usize, cols: usize, x: &[f32]) {
    let n = x.len() / cols;
    let w = dequantized(qtype, raw, rows, cols);
    let off = offsets(qtype, raw, rows, cols);
    let block = q8::act_block(qtype).unwrap();
    let acts = q8::quantize(x, cols, block).unwrap();
    let xd: Vec<f64> = acts
        .codes
        .iter()
        .enumerate()
        .map(|(i, &q)| f64::from(acts.scales[i / block]) * f64::from(q))
        .collect();
    let mut out = vec![f32::NAN; n * rows];
    q8::matmul_with(build, true, qtype, raw, rows, cols, x, &mut out).unwrap();
    for t in 0..n {
        for r in 0..rows {
            let (mut want, mut abs, mut abs_off) = (0.0f64, 0.0f64, 0.0f64);
            for c in 0..cols {
                let xv = xd[t * cols + c];
                let p = f64::from(w[r * cols + c]) * xv;
                want += p;
                abs += p.abs();
                abs_off += f64::from(off[r * cols + c]) * xv.abs();
            }
            let got = f64::from(out[t * rows + r]);
            assert!(
                (got - want).abs() <= bound(qtype, cols, abs, abs_off),
                "q8 {} {build:?} {rows}x{cols} n={n} ({t}, {r}): {got} vs {want}",
                qtype.name()
            );
        }
    }
}

#[test]
fn q8_matmul_is_the_quantised_activations_times_the_dequantised_weight() {
    let mut rng = Rng(21);
    for build in [best_build(), Build::Portable] {
        for qtype in ALL.into_iter().filter(|t| !t.is_float()) {
            for cols in shapes(qtype) {
                // One and two rows read AVX2 codes in registers, more unpack them.
                for (rows, n) in [(1, 1), (9, 1), (6, 2), (7, 3), (13, 9), (5, 17)] {
                    check_q8(build, qtype, rows, cols, n, &mut rng);
                }
            }
        }
    }
    check_q8(best_build(), QuantType::Q4K, 301, 512, 2, &mut rng);
    check_q8(best_build(), QuantType::Q8_0, 301, 512, 1, &mut rng);
}

#[test]
fn q8_activations_are_quantised_as_ggml_does() {
    // Q8_0: d = max|x| / 127, q = round(x / d), halves away from zero.
    let mut x = vec![0.0f32; 32];
    x[0] = -2.54;
    x[1] = 0.01;
    x[2] = 1.27;
    let a = q8::quantize(&x, 32, 32).unwrap();
    assert_eq!(a.scales, vec![2.54f32 / 127.0]);
    assert_eq!(&a.codes[..4], &[-127, 1, 64, 0]);
    // Q8_K: the value of largest magnitude maps to -127 * sign, d = 1 / (-127 / m).
    let mut x = vec![0.5f32; 256];
    x[7] = -4.0;
    let a = q8::quantize(&x, 256, 256).unwrap();
    assert_eq!(a.scales, vec![1.0 / (-127.0f32 / -4.0)]);
    assert_eq!((a.codes[7], a.codes[0]), (-127, 16));
    // All zero: scale 0, codes 0.
    let a = q8::quantize(&[0.0; 64], 32, 32).unwrap();
    assert_eq!((a.scales, a.codes), (vec![0.0; 2], vec![0; 64]));
    assert!(q8::quantize(&[0.0; 48], 48, 32).is_err());
    assert!(q8::quantize(&[0.0; 64], 32, 64).is_err());
}

#[test]
fn q8_rows_give_the_same_bits_alone_in_a_batch_and_on_any_thread_count() {
    let mut rng = Rng(12);
    for qtype in ALL.into_iter().filter(|t| !t.is_float()) {
        let (rows, cols) = (
            203,
            if qtype.block_values() == 256 {
                512
            } else {
                160
            },
        );
        let raw = random_rows(qtype, rows, cols, &mut rng);
        let n = 11;
        let x: Vec<f32> = (0..n * cols).map(|_| rng.unit()).collect();
        let pool = |t| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(t)
                .build()
                .unwrap()
        };
        let mut batch = vec![0.0f32; n * rows];
        pool(2).install(|| q8::matmul(qtype, &raw, rows, cols, &x, &mut batch).unwrap());
        for threads in [1, 3] {
            for (t, m) in [(0, 1), (6, 1), (3, 4), (8, 3)] {
                let mut part = vec![0.0f32; m * rows];
                let xs = &x[t * cols..(t + m) * cols];
                pool(threads)
                    .install(|| q8::matmul(qtype, &raw, rows, cols, xs, &mut part).unwrap());
                let whole = &batch[t * rows..(t + m) * rows];
                assert!(
                    part.iter()
                        .zip(whole)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{} rows {t}..{}",
                    qtype.name(),
                    t + m
                );
            }
        }
    }
}

/// On VNNI CPUs the 32-value-block formats total each block's products in
/// integers and run the portable build's float operations: every batch of
/// 1-19 rows (whole and partial slabs of 8, bands of 16 weight rows and
/// their tails) gives the portable bits, and so each row its single-row
/// bits, on AMX (where the CPU has it) and on `vpdpbusd`. Fails if a lane
/// is mapped to the wrong output, a block's total is short of a quarter,
/// or the float operations change order.
#[cfg(target_arch = "x86_64")]
#[test]
fn q8_vnni_block_totals_give_the_portable_bits_at_every_batch_size() {
    if !has_avx2() || !q8::has_vnni() {
        eprintln!("no AVX2 + AVX-512 VNNI here: nothing to compare");
        return;
    }
    let mut rng = Rng(37);
    for qtype in ALL.into_iter().filter(|t| q8::block_totals(*t)) {
        for cols in shapes(qtype) {
            for rows in [1, 3, 16, 17, 37] {
                let mut raw = random_rows(qtype, rows, cols, &mut rng);
                if qtype == QuantType::Q8_0 {
                    // The extreme codes: -128 and 127 (any byte is a code).
                    raw[2] = 0x80;
                    raw[3] = 0x7f;
                }
                let x: Vec<f32> = (0..19 * cols).map(|_| rng.unit() * 3.0).collect();
                for (n, no_amx) in (1..=19)
                    .filter(|n| *n <= 10 || *n >= 16)
                    .flat_map(|n| [(n, false), (n, true)])
                {
                    let xs = &x[..n * cols];
                    let (mut a, mut b) = (vec![0.0f32; n * rows], vec![0.0f32; n * rows]);
                    // With AMX where this CPU has it, and without.
                    q8::NO_AMX.with(|c| c.set(no_amx));
                    let got = q8::matmul_with_vnni(
                        Build::Avx2,
                        true,
                        true,
                        qtype,
                        &raw,
                        rows,
                        cols,
                        xs,
                        &mut a,
                    );
                    q8::NO_AMX.with(|c| c.set(false));
                    got.unwrap();
                    q8::matmul_with(Build::Portable, false, qtype, &raw, rows, cols, xs, &mut b)
                        .unwrap();
                    for (i, (&a, &b)) in a.iter().zip(&b).enumerate() {
                        assert!(
                            a.to_bits() == b.to_bits(),
                            "{} {rows}x{cols} n={n} output {i} (no AMX {no_amx}): vnni {a} portable {b}",
                            qtype.name()
                        );
                    }
                }
            }
        }
    }
}

/// On CPUs without VNNI the 32-value-block formats total each block's
/// products in integers too (`q8/totals.rs`) and run the portable build's
/// float operations: every batch of 1-19 activation rows (whole and partial
/// groups of four, bands of eight weight rows and their tails) gives the
/// portable bits, so each row its single-row bits. Fails if a lane goes to
/// the wrong row, a quarter is dropped or misplaced, an int16 run
/// overflows, the stored bias is not taken off, or the float operations
/// fuse or change order.
#[cfg(target_arch = "x86_64")]
#[test]
fn q8_avx2_block_totals_give_the_portable_bits_at_every_batch_size() {
    if !has_avx2() {
        eprintln!("no AVX2 here: nothing to compare");
        return;
    }
    let mut rng = Rng(38);
    for qtype in ALL.into_iter().filter(|t| q8::avx2_block_totals(*t)) {
        for cols in shapes(qtype) {
            for rows in [1, 3, 8, 9, 17, 37] {
                let mut raw = random_rows(qtype, rows, cols, &mut rng);
                if qtype == QuantType::Q8_0 {
                    // The extreme codes: -128 and 127 (any byte is a code).
                    raw[2] = 0x80;
                    raw[3] = 0x7f;
                } else if let Some((at, end)) = match qtype {
                    QuantType::Q4_0 => Some((2, 18)),
                    QuantType::Q4_1 => Some((4, 20)),
                    QuantType::Q5_0 => Some((2, 22)),
                    QuantType::Q5_1 => Some((4, 24)),
                    _ => None,
                } {
                    // Every stored code at its largest (15, 31) in the
                    // first block: the int16 runs' limit.
                    raw[at..end].fill(0xff);
                }
                // Activations at full scale in the first block (codes +-127).
                let x: Vec<f32> = (0..19 * cols)
                    .map(|i| if i % cols < 32 { 3.0 } else { rng.unit() * 3.0 })
                    .collect();
                for n in 1..=19 {
                    let xs = &x[..n * cols];
                    let (mut a, mut b) = (vec![0.0f32; n * rows], vec![0.0f32; n * rows]);
                    q8::matmul_with(Build::Avx2, false, qtype, &raw, rows, cols, xs, &mut a)
                        .unwrap();
                    q8::matmul_with(Build::Portable, false, qtype, &raw, rows, cols, xs, &mut b)
                        .unwrap();
                    for (i, (&a, &b)) in a.iter().zip(&b).enumerate() {
                        assert!(
                            a.to_bits() == b.to_bits(),
                            "{} {rows}x{cols} n={n} output {i}: avx2 {a} portable {b}",
                            qtype.name()
                        );
                    }
                }
            }
        }
    }
}

/// The fast mode's kernels alone for 1, 2, 4, 8 and 16 activation rows, the
/// AVX2 and the VNNI kernels interleaved in one run (one thread, CPU time,
/// best of many short trials): `QT=Q8_0,Q4_0,Q4_K,Q6_K cargo test --release
/// -q --lib q8_batch_probe -- --ignored --nocapture`.
#[test]
#[ignore = "a speed probe, not a test"]
fn q8_batch_probe() {
    let mut rng = Rng(1);
    for (qtype, rows, cols) in probe_formats("Q8_0,Q4_0,Q5_0,Q4_K,Q6_K") {
        let name = qtype.name();
        let raw = random_rows(qtype, rows, cols, &mut rng);
        // NS: the batch sizes (comma-separated); ONLY=vnni skips the AVX2 kernels.
        let ns: Vec<usize> = std::env::var("NS")
            .unwrap_or_else(|_| "1,2,4,8,16".into())
            .split(',')
            .map(|v| v.trim().parse().expect("NS: numbers"))
            .collect();
        let only_vnni = std::env::var("ONLY").as_deref() == Ok("vnni");
        for n in ns {
            let x: Vec<f32> = (0..n * cols).map(|_| rng.unit()).collect();
            let acts = q8::quantize(&x, cols, q8::act_block(qtype).unwrap()).unwrap();
            let mut out = vec![0.0f32; n * rows];
            let reps = (2_000_000 / (rows * cols * n)).max(1);
            let mut best = [f64::MAX; 2];
            for _ in 0..60 {
                for (b, vnni) in best.iter_mut().zip([false, true]) {
                    if only_vnni && !vnni {
                        continue;
                    }
                    let t = CpuClock::now();
                    for _ in 0..reps {
                        q8::matmul_quantized_as(
                            best_build(),
                            vnni && q8::has_vnni(),
                            false,
                            qtype,
                            &raw,
                            rows,
                            &acts,
                            &mut out,
                        )
                        .unwrap();
                    }
                    *b = b.min(t.elapsed().as_secs_f64() / reps as f64);
                }
            }
            let macs = (rows * cols * n) as f64;
            println!(
                "{name:6} q8 n={n:2}: avx2 {:7.1} us {:5.1} Gmac/s   vnni {:7.1} us {:5.1} Gmac/s ({:.2}x)",
                best[0] * 1e6,
                macs / best[0] / 1e9,
                best[1] * 1e6,
                macs / best[1] / 1e9,
                best[0] / best[1]
            );
        }
    }
}

#[test]
fn q8_float_formats_run_the_exact_kernels() {
    let mut rng = Rng(5);
    let (rows, cols) = (9, 64);
    for qtype in [QuantType::F32, QuantType::F16, QuantType::BF16] {
        let raw = random_rows(qtype, rows, cols, &mut rng);
        let x: Vec<f32> = (0..2 * cols).map(|_| rng.unit()).collect();
        let (mut a, mut b) = (vec![0.0f32; 2 * rows], vec![0.0f32; 2 * rows]);
        q8::matmul(qtype, &raw, rows, cols, &x, &mut a).unwrap();
        matmul(qtype, &raw, rows, cols, &x, &mut b).unwrap();
        assert_eq!(a, b);
    }
}

#[test]
#[ignore = "a speed probe, not a test: cargo test --release -q q8_perf_probe -- --ignored --nocapture"]
fn q8_perf_probe() {
    let mut rng = Rng(1);
    for (qtype, rows, cols) in [
        (QuantType::Q8_0, 1536, 576),
        (QuantType::Q4_0, 1536, 576),
        (QuantType::Q4_1, 1536, 576),
        (QuantType::Q5_0, 1536, 576),
        (QuantType::Q4K, 576, 1536),
        (QuantType::Q6K, 576, 1536),
        (QuantType::Q8_0, 49152, 576),
    ] {
        let raw = random_rows(qtype, rows, cols, &mut rng);
        let x: Vec<f32> = (0..8 * cols).map(|_| rng.unit()).collect();
        for n in [1usize, 8] {
            let mut out = vec![0.0f32; n * rows];
            let reps = (200_000_000 / (rows * cols * n)).max(3);
            let mut t_exact = f64::MAX;
            let mut t_q8 = f64::MAX;
            for _ in 0..3 {
                let t = CpuClock::now();
                for _ in 0..reps {
                    matmul_serial(qtype, &raw, rows, cols, &x[..n * cols], &mut out).unwrap();
                }
                t_exact = t_exact.min(t.elapsed().as_secs_f64() / reps as f64);
                let t = CpuClock::now();
                for _ in 0..reps {
                    q8::matmul_with(
                        best_build(),
                        false,
                        qtype,
                        &raw,
                        rows,
                        cols,
                        &x[..n * cols],
                        &mut out,
                    )
                    .unwrap();
                }
                t_q8 = t_q8.min(t.elapsed().as_secs_f64() / reps as f64);
            }
            let macs = (rows * cols * n) as f64;
            println!(
                "{:>6} {rows}x{cols} n={n}: exact {:.1} Gmac/s, q8 {:.1} Gmac/s ({:.2}x)",
                qtype.name(),
                macs / t_exact / 1e9,
                macs / t_q8 / 1e9,
                t_exact / t_q8
            );
        }
    }
}

#[test]
fn q8_quantize_gives_the_portable_codes_and_scales_bit_for_bit() {
    let mut rng = Rng(41);
    let mut x: Vec<f32> = (0..64 * 256).map(|_| rng.unit() * 5.0).collect();
    // Ties of both roundings, zeros, a repeated largest magnitude of either
    // sign, tiny and huge values, infinities and NaN, in some blocks.
    for (i, v) in x[..256].iter_mut().enumerate() {
        *v = (i as f32 - 128.0) * 0.5;
    }
    x[256..512].fill(0.0);
    x[512..768]
        .iter_mut()
        .enumerate()
        .for_each(|(i, v)| *v = if i % 2 == 0 { 3.0 } else { -3.0 });
    x[768..800].fill(-0.0);
    x[800] = f32::INFINITY;
    x[1024] = f32::NAN;
    x[1280 + 7] = f32::NEG_INFINITY;
    x[1536] = 1e-40;
    x[1537] = -1e30;
    x[1800..1832]
        .iter_mut()
        .enumerate()
        .for_each(|(i, v)| *v = 127.0 / 254.0 * i as f32);
    // Exact ties: Q8_0 with d = 1 (max 127), Q8_K with iscale = 1 (max -127).
    for (i, v) in x[1824..1856].iter_mut().enumerate() {
        *v = i as f32 * 0.5 - 8.0;
    }
    x[1855] = 127.0;
    for (i, v) in x[2048..2304].iter_mut().enumerate() {
        *v = i as f32 * 0.5 - 60.0;
    }
    x[2048] = -127.0;
    for block in [32, 256] {
        let got = q8::quantize(&x, 256, block).unwrap();
        let (mut codes, mut scales) = (vec![0i8; x.len()], vec![0.0f32; x.len() / block]);
        q8::quantize_blocks(&x, &mut codes, &mut scales, block);
        assert_eq!(got.codes, codes, "codes, blocks of {block}");
        assert!(
            got.scales
                .iter()
                .zip(&scales)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "scales, blocks of {block}"
        );
    }
}

#[test]
fn q8_rounding_without_libm_is_libms() {
    let mut rng = Rng(77);
    let mut values: Vec<f32> = (0..20_000).map(|_| rng.unit() * 130.0).collect();
    for k in -130..=130 {
        let h = k as f32 + 0.5;
        values.extend([
            h,
            -h,
            k as f32,
            h - 1e-5,
            h + 1e-5,
            f32::from_bits(h.to_bits() - 1),
        ]);
    }
    for v in values {
        assert_eq!(q8::round_away(v), v.round() as i32, "{v}");
        assert_eq!(q8::round_even(v), v.round_ties_even() as i32, "{v}");
    }
}

/// This thread's CPU time, for speed probes on a shared machine.
struct CpuClock(f64);

impl CpuClock {
    fn read() -> f64 {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: a valid timespec to fill.
        unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
        ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
    }

    fn now() -> Self {
        Self(Self::read())
    }

    fn elapsed(&self) -> std::time::Duration {
        std::time::Duration::from_secs_f64(Self::read() - self.0)
    }
}

/// `engine::linear::matmul_many` (several weights, one parallel loop) gives
/// each part the bits `matmul` gives it alone, in both activation modes, for
/// 1..9 activation rows, on 1 and 2 threads, in every format; and refuses a
/// part whose shape does not fit before it writes anything.
#[test]
fn several_products_in_one_parallel_loop_give_each_its_own_bits() {
    use crate::engine::linear::{matmul as mode_matmul, matmul_many, Activations, Part};
    let mut rng = Rng(29);
    let pool = |t| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(t)
            .build()
            .unwrap()
    };
    for qtype in ALL {
        let cols = 512;
        // Big enough that two threads split them (and a part's rows are
        // not a whole number of chunks).
        let shapes = [301usize, 90, 166];
        let raws: Vec<Vec<u8>> = shapes
            .iter()
            .map(|&rows| random_rows(qtype, rows, cols, &mut rng))
            .collect();
        for mode in [Activations::Exact, Activations::Q8] {
            for n in [1usize, 2, 5, 8, 9] {
                let x: Vec<f32> = (0..n * cols).map(|_| rng.unit()).collect();
                let want: Vec<Vec<f32>> = shapes
                    .iter()
                    .zip(&raws)
                    .map(|(&rows, raw)| {
                        let mut out = vec![0.0f32; n * rows];
                        pool(1).install(|| {
                            mode_matmul(mode, qtype, raw, rows, cols, &x, &mut out).unwrap()
                        });
                        out
                    })
                    .collect();
                for threads in [1, 2] {
                    let mut outs: Vec<Vec<f32>> = shapes
                        .iter()
                        .map(|&rows| vec![f32::NAN; n * rows])
                        .collect();
                    let mut parts: Vec<Part<'_>> = shapes
                        .iter()
                        .zip(&raws)
                        .zip(outs.iter_mut())
                        .map(|((&rows, raw), out)| Part {
                            kind: qtype,
                            raw,
                            rows,
                            cols,
                            out,
                        })
                        .collect();
                    pool(threads).install(|| matmul_many(mode, &x, &mut parts).unwrap());
                    for (i, (got, want)) in outs.iter().zip(&want).enumerate() {
                        assert!(
                            got.iter()
                                .zip(want)
                                .all(|(a, b)| a.to_bits() == b.to_bits()),
                            "{} {mode:?} n={n} threads={threads} part {i}",
                            qtype.name()
                        );
                    }
                }
            }
        }
    }
    // A misfit part is refused before any part is written.
    let raw = random_rows(QuantType::Q8_0, 64, 64, &mut rng);
    let x = vec![0.5f32; 2 * 64];
    let (mut a, mut b) = (vec![7.0f32; 2 * 64], vec![7.0f32; 64]);
    let mut parts = [
        Part {
            kind: QuantType::Q8_0,
            raw: &raw,
            rows: 64,
            cols: 64,
            out: &mut a,
        },
        Part {
            kind: QuantType::Q8_0,
            raw: &raw,
            rows: 64,
            cols: 64,
            out: &mut b,
        },
    ];
    assert!(matches!(
        matmul_many(Activations::Exact, &x, &mut parts),
        Err(CoreError::Shape(_))
    ));
    assert!(a.iter().chain(&b).all(|&v| v == 7.0));
}

/// The fast mode's one-row products, hot (one matrix, in cache) and cold
/// (a set of matrices larger than the last-level cache, cycled): `QT=Q4_0
/// cargo test --release -q q8_cold_probe -- --ignored --nocapture`.
#[test]
#[ignore = "a speed probe, not a test"]
fn q8_cold_probe() {
    fn cpu() -> f64 {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: a valid timespec to fill.
        unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
        ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
    }
    let mut rng = Rng(1);
    for (qtype, rows, cols) in probe_formats("Q8_0,Q4_0,Q5_0,Q4_K,Q6_K") {
        let name = qtype.name();
        let one = random_rows(qtype, rows, cols, &mut rng);
        let copies = (96 << 20) / one.len();
        let cold: Vec<Vec<u8>> = (0..copies).map(|_| one.clone()).collect();
        // NS: the batch sizes (comma-separated, default 1).
        let ns = std::env::var("NS").unwrap_or_else(|_| "1".into());
        for n in ns
            .split(',')
            .map(|v| v.trim().parse::<usize>().expect("NS: numbers"))
        {
            let x: Vec<f32> = (0..n * cols).map(|_| rng.unit()).collect();
            let acts = q8::quantize(&x, cols, q8::act_block(qtype).unwrap()).unwrap();
            let qsum = if qtype.has_offsets() {
                q8::group_qsums(&acts, qtype.group_values())
            } else {
                Vec::new()
            };
            let mut out = vec![0.0f32; n * rows];
            let mut go = |raw: &[u8]| {
                // SAFETY: out holds `rows` floats.
                unsafe { q8::rows_into(qtype, raw, rows, &acts, &qsum, 0, rows, out.as_mut_ptr()) }
                    .unwrap()
            };
            let mut best = f64::MAX;
            for _ in 0..200 {
                let t0 = cpu();
                go(&one);
                best = best.min(cpu() - t0);
            }
            let mut cold_best = f64::MAX;
            for _ in 0..5 {
                let t0 = cpu();
                cold.iter().for_each(|m| go(m));
                cold_best = cold_best.min((cpu() - t0) / copies as f64);
            }
            // The memory's own pace in the same run: summing the same bytes.
            let mut read_best = f64::MAX;
            let mut sink = 0u64;
            for _ in 0..5 {
                let t0 = cpu();
                for m in &cold {
                    let (words, _) = m.as_chunks::<8>();
                    sink = words
                        .iter()
                        .fold(sink, |a, w| a.wrapping_add(u64::from_le_bytes(*w)));
                }
                read_best = read_best.min((cpu() - t0) / copies as f64);
            }
            println!(
            "{name:6} q8 n={n} hot: {:7.1} us {:5.2} GB/s   cold: {:7.1} us {:5.2} GB/s   (reading the bytes: {:5.2} GB/s, {})",
            best * 1e6,
            one.len() as f64 / best / 1e9,
            cold_best * 1e6,
            one.len() as f64 / cold_best / 1e9,
            one.len() as f64 / read_best / 1e9,
            sink % 2
        );
        }
    }
}

/// The exact mode's batched products (matmul's route, one thread) hot (one
/// matrix in cache) and cold (cycled through 96 MB), for the batch sizes in
/// `NS` (default 1,2,4,8): `QT=Q8_0 NS=2,8 cargo test --release -q --lib
/// exact_batch_cold_probe -- --ignored --nocapture`.
#[test]
#[ignore = "a speed probe, not a test"]
fn exact_batch_cold_probe() {
    let mut rng = Rng(1);
    let ns = std::env::var("NS").unwrap_or_else(|_| "1,2,4,8".into());
    for (qtype, rows, cols) in probe_formats("Q8_0,Q4_0,Q4_K,Q6_K") {
        let name = qtype.name();
        let one = random_rows(qtype, rows, cols, &mut rng);
        let copies = (96 << 20) / one.len();
        let cold: Vec<Vec<u8>> = (0..copies).map(|_| one.clone()).collect();
        for n in ns
            .split(',')
            .map(|v| v.trim().parse::<usize>().expect("NS: numbers"))
        {
            let x: Vec<f32> = (0..n * cols).map(|_| rng.unit()).collect();
            let xsum = kernel::offset_sums(qtype, &x);
            let mut out = vec![0.0f32; n * rows];
            let mut go = |raw: &[u8]| {
                let job = Job {
                    qtype,
                    raw,
                    row_bytes: qtype.row_bytes(cols).unwrap(),
                    rows,
                    cols,
                    x: &x,
                    n,
                    xsum: &xsum,
                };
                // SAFETY: out holds n x rows floats.
                unsafe { run(best_build(), &job, 0, rows, out.as_mut_ptr()) };
            };
            let (mut hot, mut cold_t) = (f64::MAX, f64::MAX);
            for _ in 0..5 {
                for _ in 0..40 {
                    let t = CpuClock::now();
                    go(&one);
                    hot = hot.min(t.elapsed().as_secs_f64());
                }
                let t = CpuClock::now();
                cold.iter().for_each(|m| go(m));
                cold_t = cold_t.min(t.elapsed().as_secs_f64() / copies as f64);
            }
            println!(
                "{name:6} exact n={n}: hot {:7.1} us  cold {:7.1} us",
                hot * 1e6,
                cold_t * 1e6
            );
        }
    }
}

/// The general AVX2 tiles, without the one-row route.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn avx2_tiles(job: &Job<'_>, lo: usize, hi: usize, out: *mut f32) {
    let mut s = kernel::Scratch::default();
    // SAFETY: forwarded.
    unsafe { kernel::run_rows::<simd::Avx2>(job, lo, hi, out, &mut s) }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn the_one_row_kernel_gives_the_general_tiles_bits() {
    if !has_avx2() {
        return;
    }
    let mut rng = Rng(31);
    for qtype in ALL.into_iter().filter(|&t| kernel::row1::implements(t)) {
        for (rows, blocks) in [(1, 1), (3, 2), (13, 3), (37, 5), (4, 1), (8, 2)] {
            let cols = blocks * qtype.block_values();
            let raw = random_rows(qtype, rows, cols, &mut rng);
            let x: Vec<f32> = (0..cols).map(|_| rng.unit() * 2.0).collect();
            let xsum = kernel::offset_sums(qtype, &x);
            let job = Job {
                qtype,
                raw: &raw,
                row_bytes: qtype.row_bytes(cols).unwrap(),
                rows,
                cols,
                x: &x,
                n: 1,
                xsum: &xsum,
            };
            // Every start and end, so every mix of 8-, 4- and 1-row tiles.
            for lo in 0..rows {
                for hi in lo + 1..=rows {
                    let mut want = vec![f32::NAN; rows];
                    // SAFETY: AVX2 checked; out holds `rows` floats.
                    unsafe { avx2_tiles(&job, lo, hi, want.as_mut_ptr()) };
                    for wide in [0, 4, 8] {
                        let mut got = vec![f32::NAN; rows];
                        // SAFETY: as above.
                        unsafe { kernel::row1::rows_by(&job, lo, hi, got.as_mut_ptr(), wide) };
                        for r in lo..hi {
                            assert_eq!(
                                got[r].to_bits(),
                                want[r].to_bits(),
                                "{} {rows}x{cols} rows {lo}..{hi} by {wide}: row {r}",
                                qtype.name()
                            );
                        }
                        assert!(got[..lo].iter().chain(&got[hi..]).all(|v| v.is_nan()));
                    }
                }
            }
        }
    }
}

/// The exact one-row products, the general tiles against the route
/// `matmul` takes, interleaved in one run, hot (one matrix in cache) and
/// cold (cycled through 96 MB): `QT=Q4_0 cargo test --release -q --lib
/// exact_cold_probe -- --ignored --nocapture`.
#[cfg(target_arch = "x86_64")]
#[test]
#[ignore = "a speed probe, not a test"]
fn exact_cold_probe() {
    fn cpu() -> f64 {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: a valid timespec to fill.
        unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
        ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
    }
    let mut rng = Rng(1);
    for (qtype, rows, cols) in probe_formats("Q8_0,Q4_0,Q5_0,Q4_K,Q6_K") {
        let name = qtype.name();
        let one = random_rows(qtype, rows, cols, &mut rng);
        let copies = (96 << 20) / one.len();
        let cold: Vec<Vec<u8>> = (0..copies).map(|_| one.clone()).collect();
        let x: Vec<f32> = (0..cols).map(|_| rng.unit()).collect();
        let xsum = kernel::offset_sums(qtype, &x);
        let mut out = vec![0.0f32; rows];
        let mut go = |raw: &[u8], route: usize| {
            let job = Job {
                qtype,
                raw,
                row_bytes: qtype.row_bytes(cols).unwrap(),
                rows,
                cols,
                x: &x,
                n: 1,
                xsum: &xsum,
            };
            // SAFETY: out holds `rows` floats; AVX2 checked below.
            unsafe {
                match route {
                    0 => avx2_tiles(&job, 0, rows, out.as_mut_ptr()),
                    1 => run(best_build(), &job, 0, rows, out.as_mut_ptr()),
                    2 => run(Build::Avx2, &job, 0, rows, out.as_mut_ptr()),
                    w => kernel::row1::rows_by(&job, 0, rows, out.as_mut_ptr(), w),
                }
            }
        };
        if !has_avx2() {
            return;
        }
        // Routes: the general tiles, matmul's (the build RLX_SIMD names, the
        // widest by default), the AVX2 build's matmul, and (covered formats)
        // the AVX2 one-row kernel's passes of 8 and of 4 rows.
        let routes: &[usize] = if kernel::row1::implements(qtype) {
            &[0, 1, 2, 8, 4]
        } else {
            &[0, 1, 2]
        };
        let (mut hot, mut cold_t) = ([f64::MAX; 5], [f64::MAX; 5]);
        for round in 0..10 {
            for (k, &route) in routes.iter().enumerate() {
                for _ in 0..40 {
                    let t0 = cpu();
                    go(&one, route);
                    hot[k] = hot[k].min(cpu() - t0);
                }
                if round % 2 == 0 {
                    let t0 = cpu();
                    cold.iter().for_each(|m| go(m, route));
                    cold_t[k] = cold_t[k].min((cpu() - t0) / copies as f64);
                }
            }
        }
        if routes.len() == 5 {
            println!(
                "{name:6} one-row passes of 8: hot {:6.1} us cold {:6.1} us; of 4: hot {:6.1} us cold {:6.1} us",
                hot[3] * 1e6,
                cold_t[3] * 1e6,
                hot[4] * 1e6,
                cold_t[4] * 1e6
            );
        }
        println!(
            "{name:6} exact n=1  {:?} matmul hot {:6.1} us cold {:6.1} us  |  Avx2 matmul hot {:6.1} us cold {:6.1} us  |  x{:.2} hot, x{:.2} cold",
            best_build(),
            hot[1] * 1e6,
            cold_t[1] * 1e6,
            hot[2] * 1e6,
            cold_t[2] * 1e6,
            hot[2] / hot[1],
            cold_t[2] / cold_t[1],
        );
        println!(
            "{name:6} exact n=1  tiles hot {:6.1} us cold {:6.1} us  |  matmul hot {:6.1} us cold {:6.1} us ({:5.2} GB/s)  |  x{:.2} hot, x{:.2} cold",
            hot[0] * 1e6,
            cold_t[0] * 1e6,
            hot[1] * 1e6,
            cold_t[1] * 1e6,
            one.len() as f64 / cold_t[1] / 1e9,
            hot[0] / hot[1],
            cold_t[0] / cold_t[1],
        );
    }
}

/// The AVX-512 build leaves the formats it does not cover to the AVX2
/// kernels: the same bits as the AVX2 build, for 1 to 9 activation rows.
#[cfg(target_arch = "x86_64")]
#[test]
fn the_avx512_build_gives_the_avx2_bits_in_the_formats_it_leaves_alone() {
    if !has_avx512() {
        return;
    }
    let mut rng = Rng(41);
    for qtype in ALL.into_iter().filter(|&t| !avx512::covers(t)) {
        let cols = if qtype.is_float() {
            45
        } else {
            2 * qtype.block_values()
        };
        let rows = 13;
        let raw = random_rows(qtype, rows, cols, &mut rng);
        for n in 1..=9 {
            let x: Vec<f32> = (0..n * cols).map(|_| rng.unit()).collect();
            let mut a = vec![f32::NAN; n * rows];
            let mut b = vec![f32::NAN; n * rows];
            matmul_with(Build::Avx512, false, qtype, &raw, rows, cols, &x, &mut a).unwrap();
            matmul_with(Build::Avx2, false, qtype, &raw, rows, cols, &x, &mut b).unwrap();
            assert!(
                a.iter().zip(&b).all(|(a, b)| a.to_bits() == b.to_bits()),
                "{} n={n}",
                qtype.name()
            );
        }
    }
}

/// The AVX-512 one-row kernel gives, on every row range (so every mix of
/// four-row passes and single rows), the bits the same build's batched
/// tiles give that activation row in a batch of three (in the middle).
#[cfg(target_arch = "x86_64")]
#[test]
fn the_avx512_one_row_kernel_gives_its_batched_tiles_bits_on_every_row_range() {
    if !has_avx512() {
        return;
    }
    let mut rng = Rng(43);
    for qtype in ALL.into_iter().filter(|&t| avx512::covers(t)) {
        for (rows, blocks) in [(1, 1), (3, 2), (13, 3), (37, 5), (4, 1), (9, 18)] {
            let cols = blocks * qtype.block_values();
            let raw = random_rows(qtype, rows, cols, &mut rng);
            let x3: Vec<f32> = (0..3 * cols).map(|_| rng.unit() * 2.0).collect();
            let mut batch = vec![f32::NAN; 3 * rows];
            matmul_with(
                Build::Avx512,
                false,
                qtype,
                &raw,
                rows,
                cols,
                &x3,
                &mut batch,
            )
            .unwrap();
            let x = &x3[cols..2 * cols];
            let xsum = kernel::offset_sums(qtype, x);
            let job = Job {
                qtype,
                raw: &raw,
                row_bytes: qtype.row_bytes(cols).unwrap(),
                rows,
                cols,
                x,
                n: 1,
                xsum: &xsum,
            };
            for lo in 0..rows {
                for hi in lo + 1..=rows {
                    let mut got = vec![f32::NAN; rows];
                    // SAFETY: AVX-512 checked; out holds `rows` floats.
                    unsafe { avx512::rows(&job, lo, hi, got.as_mut_ptr()) };
                    for r in lo..hi {
                        assert_eq!(
                            got[r].to_bits(),
                            batch[rows + r].to_bits(),
                            "{} {rows}x{cols} rows {lo}..{hi}: row {r}",
                            qtype.name()
                        );
                    }
                    assert!(got[..lo].iter().chain(&got[hi..]).all(|v| v.is_nan()));
                }
            }
        }
    }
}

/// Every batch size gives each activation row `one_row`'s bits under
/// `build`: the short batches (up to eight rows) decode their blocks inside
/// the tiles (`avx512::blocks_tile`, `kernel::row1::blocks_tile`), longer
/// ones unpack a band first; both must be the one-row kernel's order. Row
/// counts off the tiles' 2 and 4, activation counts off their 4, 3 and 8.
#[cfg(target_arch = "x86_64")]
fn batches_give_one_row_bits(
    build: Build,
    formats: impl Fn(QuantType) -> bool,
    one_row: unsafe fn(&Job<'_>, usize, usize, *mut f32),
    seed: u64,
) {
    let mut rng = Rng(seed);
    for qtype in ALL.into_iter().filter(|&t| formats(t)) {
        for (rows, blocks) in [(1, 1), (5, 2), (7, 3), (4, 18), (11, 48)] {
            let cols = blocks * qtype.block_values();
            let raw = random_rows(qtype, rows, cols, &mut rng);
            for n in [2usize, 3, 4, 5, 6, 7, 8, 9, 11, 16] {
                let xs: Vec<f32> = (0..n * cols).map(|_| rng.unit() * 2.0).collect();
                let mut batch = vec![f32::NAN; n * rows];
                matmul_with(build, false, qtype, &raw, rows, cols, &xs, &mut batch).unwrap();
                for t in 0..n {
                    let x = &xs[t * cols..(t + 1) * cols];
                    let xsum = kernel::offset_sums(qtype, x);
                    let job = Job {
                        qtype,
                        raw: &raw,
                        row_bytes: qtype.row_bytes(cols).unwrap(),
                        rows,
                        cols,
                        x,
                        n: 1,
                        xsum: &xsum,
                    };
                    let mut one = vec![f32::NAN; rows];
                    // SAFETY: the build is usable (callers check); `one`
                    // holds `rows` floats.
                    unsafe { one_row(&job, 0, rows, one.as_mut_ptr()) };
                    for r in 0..rows {
                        assert_eq!(
                            one[r].to_bits(),
                            batch[t * rows + r].to_bits(),
                            "{} {rows}x{cols}, {n} activation rows: row {r} of activation {t}",
                            qtype.name()
                        );
                    }
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[test]
fn the_avx512_batched_paths_give_one_row_bits_at_every_batch_size() {
    if !has_avx512() {
        return;
    }
    batches_give_one_row_bits(Build::Avx512, avx512::covers, avx512::rows, 47);
}

#[cfg(target_arch = "x86_64")]
#[test]
fn the_avx2_batched_paths_give_one_row_bits_at_every_batch_size() {
    if !has_avx2() {
        return;
    }
    unsafe fn one_row(job: &Job<'_>, lo: usize, hi: usize, out: *mut f32) {
        // SAFETY: forwarded (AVX2 checked by the test).
        unsafe { kernel::row1::rows_by(job, lo, hi, out, 0) }
    }
    batches_give_one_row_bits(Build::Avx2, kernel::row1::fuses, one_row, 53);
}

/// `RLX_SIMD` names the build, so an A/B of the AVX-512 and AVX2 kernels
/// runs the same binary: `simd_name` says which one runs.
#[test]
fn simd_name_is_the_build_that_runs() {
    let want = match best_build() {
        #[cfg(target_arch = "x86_64")]
        Build::Avx512 => "avx512",
        #[cfg(target_arch = "x86_64")]
        Build::Avx2 => "avx2",
        #[cfg(target_arch = "aarch64")]
        Build::Neon => "neon",
        Build::Portable => "portable",
    };
    assert_eq!(simd_name(), want);
    if std::env::var("RLX_SIMD").is_err() {
        assert_eq!(best_build(), widest_build());
    }
}

/// MXFP4 rows whose block `c` of row `r` has the exponent `e_of(r, c)`,
/// codes kept where every weight `2^(e-128) * code` is finite in float32
/// (`|code|` at most 1, 3 and 6 for e = 255, 254 and 253; 12 below).
fn mxfp4_rows(
    rows: usize,
    cols: usize,
    rng: &mut Rng,
    e_of: impl Fn(usize, usize, &mut Rng) -> u8,
) -> Vec<u8> {
    use super::unpack::MXFP4_VALUES;
    let mut raw = random_rows(QuantType::MXFP4, rows, cols, rng);
    let blocks = cols / 32;
    for (i, blk) in raw.chunks_exact_mut(17).enumerate() {
        let e = e_of(i / blocks, i % blocks, rng);
        blk[0] = e;
        let max = match e {
            255 => 1,
            254 => 3,
            253 => 6,
            _ => 12,
        };
        let mut nibble = |mut q: u8| {
            while MXFP4_VALUES[usize::from(q)].unsigned_abs() > max {
                q = rng.byte() & 15;
            }
            q
        };
        for b in &mut blk[1..] {
            *b = nibble(*b & 15) | nibble(*b >> 4) << 4;
        }
    }
    raw
}

/// MXFP4 over its whole exponent range (e = 0 and 1 subnormal scales, e =
/// 255 the largest), with activations scaled to keep the products in
/// float32's range: rows of one exponent each, every byte 0..=127 (x times
/// 2^100) and 128..=255 (x times 2^-40), so each result depends on its
/// exponent's decoding, and rows mixing the extremes. In every build the
/// exact mode is within the float32 bound of the float64 product over
/// gguf's weights, the q8 mode within it of the product with the quantised
/// activations, and a row's bits (both modes, every build; the VNNI and
/// AVX2 block totals against the portable build's) are the same alone and
/// in any batch. Fails if an exponent decodes to the wrong power of two, a
/// subnormal scale is flushed, or a kernel reads the scale as a float16.
#[test]
fn mxfp4_every_exponent_in_every_build_and_both_modes() {
    let qtype = QuantType::MXFP4;
    let mut rng = Rng(57);
    let extremes = [0u8, 1, 2, 127, 128, 253, 254, 255];
    let mut cases = Vec::new();
    for (base, scale) in [(0u8, 2f32.powi(100)), (128, 2f32.powi(-40))] {
        // One exponent a row (the last band of the batch kernels partial).
        let raw = mxfp4_rows(128, 64, &mut rng, |r, _, _| base + r as u8);
        cases.push((raw, 128, 64, scale));
        for (rows, cols) in [(1, 32), (19, 96)] {
            let raw = mxfp4_rows(rows, cols, &mut rng, |_, _, rng| base + (rng.byte() % 128));
            cases.push((raw, rows, cols, scale));
        }
    }
    for (rows, cols) in [(7, 96), (19, 224)] {
        let raw = mxfp4_rows(rows, cols, &mut rng, |_, _, rng| {
            extremes[rng.next() as usize % extremes.len()]
        });
        cases.push((raw, rows, cols, 2f32.powi(-40)));
    }
    for (raw, rows, cols, scale) in cases {
        let n = 9;
        let x: Vec<f32> = (0..n * cols).map(|_| rng.unit() * scale).collect();
        for build in builds() {
            check_matmul_on(build, qtype, &raw, rows, cols, &x);
            check_matmul_on(build, qtype, &raw, rows, cols, &x[..cols]);
            check_q8_on(build, qtype, &raw, rows, cols, &x);
            check_q8_on(build, qtype, &raw, rows, cols, &x[..cols]);
            // Each activation row alone, then batches of 2..=9.
            for q8 in [false, true] {
                let go = |xs: &[f32], out: &mut [f32]| {
                    if q8 {
                        q8::matmul_with(build, false, qtype, &raw, rows, cols, xs, out)
                    } else {
                        matmul_with(build, false, qtype, &raw, rows, cols, xs, out)
                    }
                    .unwrap()
                };
                let mut alone = vec![f32::NAN; n * rows];
                for t in 0..n {
                    go(
                        &x[t * cols..(t + 1) * cols],
                        &mut alone[t * rows..(t + 1) * rows],
                    );
                }
                for b in 2..=n {
                    let mut got = vec![f32::NAN; b * rows];
                    go(&x[..b * cols], &mut got);
                    for (i, (g, a)) in got.iter().zip(&alone).enumerate() {
                        assert_eq!(
                            g.to_bits(),
                            a.to_bits(),
                            "{build:?} q8={q8} {rows}x{cols} b={b} element {i}"
                        );
                    }
                }
            }
        }
        #[cfg(target_arch = "x86_64")]
        if has_avx2() {
            // The fast mode's AVX2 and VNNI block totals: the portable bits.
            for b in [1, 2, 3, 4, 5, 8, 9] {
                let xs = &x[..b * cols];
                let mut want = vec![f32::NAN; b * rows];
                q8::matmul_with(
                    Build::Portable,
                    false,
                    qtype,
                    &raw,
                    rows,
                    cols,
                    xs,
                    &mut want,
                )
                .unwrap();
                for vnni in [false, true] {
                    if vnni && !q8::has_vnni() {
                        continue;
                    }
                    let mut got = vec![f32::NAN; b * rows];
                    q8::matmul_with_vnni(
                        Build::Avx2,
                        vnni,
                        false,
                        qtype,
                        &raw,
                        rows,
                        cols,
                        xs,
                        &mut got,
                    )
                    .unwrap();
                    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                        assert_eq!(
                            g.to_bits(),
                            w.to_bits(),
                            "vnni={vnni} {rows}x{cols} b={b} element {i}"
                        );
                    }
                }
            }
        }
    }
}

/// MXFP4 against IQ4_NL (the same layout but for the scale byte) on one
/// shape, both modes, one and eight activation rows, the two formats
/// alternated round by round (one thread, CPU time, best of the rounds):
/// `QS=2880x2880 cargo test --release -q --lib mxfp4_probe -- --ignored
/// --nocapture` (gpt-oss-20b's expert width by default).
#[test]
#[ignore = "a speed probe, not a test"]
fn mxfp4_probe() {
    let (rows, cols) = std::env::var("QS")
        .ok()
        .map(|s| {
            let (r, c) = s.split_once('x').expect("QS=ROWSxCOLS");
            (r.parse().unwrap(), c.parse().unwrap())
        })
        .unwrap_or((2880, 2880));
    let mut rng = Rng(1);
    let formats = [QuantType::MXFP4, QuantType::IQ4NL];
    let raws: Vec<Vec<u8>> = formats
        .iter()
        .map(|&t| random_rows(t, rows, cols, &mut rng))
        .collect();
    println!("{:?} build, {rows} x {cols}", best_build());
    for q8 in [false, true] {
        for n in [1usize, 8] {
            let x: Vec<f32> = (0..n * cols).map(|_| rng.unit()).collect();
            let mut out = vec![0.0f32; n * rows];
            let mut best = [f64::MAX; 2];
            for _ in 0..30 {
                for (i, (&qtype, raw)) in formats.iter().zip(&raws).enumerate() {
                    let t = CpuClock::now();
                    if q8 {
                        q8::matmul_parallel(false, qtype, raw, rows, cols, &x, &mut out).unwrap();
                    } else {
                        matmul_serial(qtype, raw, rows, cols, &x, &mut out).unwrap();
                    }
                    best[i] = best[i].min(t.elapsed().as_secs_f64());
                }
            }
            let mode = if q8 { "q8" } else { "exact" };
            println!(
                "{mode:5} n={n}: MXFP4 {:7.1} us  IQ4_NL {:7.1} us  ({:.2}x)",
                best[0] * 1e6,
                best[1] * 1e6,
                best[1] / best[0]
            );
        }
    }
}

#[test]
fn the_float16_table_is_f16cs_conversion_of_every_value() {
    for h in 0..=u16::MAX {
        let t = crate::quant::unpack::F16_TABLE[usize::from(h)];
        let plain = crate::kv::f16_to_f32(h);
        assert!(
            t.to_bits() == plain.to_bits() || (t.is_nan() && plain.is_nan()),
            "{h:#06x}: table {t:e} vs {plain:e}"
        );
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("f16c") {
            // SAFETY: F16C detected.
            let f16c = unsafe {
                use std::arch::x86_64::*;
                _mm_cvtss_f32(_mm_cvtph_ps(_mm_set1_epi16(h as i16)))
            };
            assert_eq!(t.to_bits(), f16c.to_bits(), "{h:#06x}");
        }
    }
}
