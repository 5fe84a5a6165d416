//! The sampler chain on arbitrary knobs, orders, rows and histories.
//!
//! Rows mix ordinary values at scales from 1e-30 to 1e38 with the hostile
//! ones (signed zeros, +-inf, the float32 extremes, subnormals, NaN, ties);
//! knobs are drawn knob by knob from the core's table (each knob's probe
//! range, tables of edge values, or raw bits). Checked on every
//! input: no panic (a crash), no hang (libFuzzer's -timeout), and
//!
//! - a refused chain or row is a typed `CoreError`, never `Internal`;
//! - the token is inside the row, on an entry that is not NaN, not -inf and
//!   not banned by a -inf bias;
//! - log-probabilities are never NaN and never above 0; the token's is
//!   finite under the distribution it was drawn from; the top list is
//!   sorted best first;
//! - sampling is pure: the same call with fresh or reused scratch buffers
//!   gives the same token; a greedy chain gives the argmax;
//! - mirostat's mu stays finite through accepts.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rlx_lm::sampling::chain::{
    History, Knobs, LogprobMode, Mirostat, OrderSpec, SamplerChain, Scratch, PRESETS,
};
use rlx_lm::sampling::knobs::{Kind, KnobSpec, Value, KNOBS};
use rlx_lm::sampling::stages::STAGES;
use rlx_lm::CoreError;

struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn u8(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&b, rest)) => {
                self.0 = rest;
                b
            }
            None => 0,
        }
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }
    fn pick<T: Copy>(&mut self, table: &[T]) -> T {
        table[self.u8() as usize % table.len()]
    }
    /// A float from an edge table, a scaled ordinary value, or raw bits.
    fn f32_in(&mut self, table: &[f32]) -> f32 {
        match self.u8() % 4 {
            0 | 1 => self.pick(table),
            2 => f32::from_bits(self.u32()),
            _ => (self.u8() as f32 / 255.0) * self.pick(table),
        }
    }
}

const SCALES: [f32; 12] = [
    1e-30, 1e-10, 1e-3, 0.5, 1.0, 8.0, 100.0, 1e5, 1e9, 1e20, 1e30, 3e38,
];
const SPECIAL: [f32; 10] = [
    0.0,
    -0.0,
    f32::INFINITY,
    f32::NEG_INFINITY,
    f32::MIN,
    f32::MAX,
    1e-45,
    -1e-45,
    f32::MIN_POSITIVE,
    1.0,
];

/// Edge values a float knob is drawn at, besides its probe range and raw bits.
const EDGES: [f32; 14] = [
    0.0, 1e-45, 1e-40, 1e-30, 1e-5, 0.5, 1.0, 1.5, 2.0, 100.0, 1e10, 1e30, 3e38, -1.0,
];
/// Edge values an integer knob is drawn at.
const INT_EDGES: [i128; 6] = [0, 1, 2, 3, 1000, 1 << 20];

fn float(b: &mut Bytes<'_>, (lo, hi): (f64, f64)) -> f64 {
    match b.u8() % 4 {
        0 | 1 => lo + (b.u8() as f64 / 255.0) * (hi - lo),
        2 => b.f32_in(&EDGES) as f64,
        _ => f32::from_bits(b.u32()) as f64,
    }
}

/// One knob's value, by its kind in the core's table: from its probe range,
/// an edge table, or raw bits (which the chain must refuse, typed).
fn value(b: &mut Bytes<'_>, spec: &KnobSpec, vocab: usize) -> Value {
    let (lo, hi) = spec.probe;
    match spec.kind {
        Kind::Float => Value::Float(float(b, spec.probe)),
        Kind::Int | Kind::OptInt | Kind::Mode => Value::Int(match b.u8() % 3 {
            0 | 1 => lo as i128 + (b.u8() as i128 % (hi - lo + 1.0) as i128),
            // An optional integer's -1 (repetition_window: the whole history).
            _ if spec.kind == Kind::OptInt && b.u8() % 4 == 0 => -1,
            _ => b.pick(&INT_EDGES),
        }),
        Kind::Pair => {
            let a = float(b, spec.probe);
            Value::Pair(a, a + float(b, spec.probe).abs())
        }
        Kind::Tokens => Value::Tokens((0..b.u8() % 3).map(|_| (b.u8() % 64) as i128).collect()),
        Kind::Seed => Value::Int(b.u32() as i128),
        Kind::Bias => {
            let mut v: Vec<(i128, f64)> = Vec::new();
            for _ in 0..b.u8() % 4 {
                let t = (b.u8() as usize % (vocab + 2)) as i128;
                let bias = match b.u8() % 3 {
                    0 => f64::NEG_INFINITY,
                    1 => b.f32_in(&[-3e38, -1.0, 0.0, 1.0, 3e38, 1e-45]) as f64,
                    _ => float(b, spec.probe),
                };
                if v.iter().all(|&(u, _)| u != t) {
                    v.push((t, bias));
                }
            }
            Value::Bias(v)
        }
    }
}

/// Knobs drawn knob by knob from the core's table ([`KNOBS`]), each set
/// when its bit of the input says so: a new knob is fuzzed without an edit
/// here. What the core refuses must be a typed option error naming a knob;
/// that knob then goes back to its default (or, if it already is, the knobs
/// of every stage that reads it), so the rest of the draw is still run.
fn knobs(b: &mut Bytes<'_>, vocab: usize) -> Knobs {
    let flags = b.u32() as u64 | (b.u32() as u64) << 32;
    let default = |spec: &KnobSpec| match spec.kind {
        Kind::Seed => Value::Int(0), // None would be a random seed
        _ => spec.default_value(),
    };
    let mut values: Vec<Value> = KNOBS
        .iter()
        .enumerate()
        .map(|(i, spec)| {
            if flags >> i & 1 == 1 {
                value(b, spec, vocab)
            } else {
                default(spec)
            }
        })
        .collect();
    for _ in 0..2 * KNOBS.len() {
        match Knobs::from_values(values.clone()) {
            Ok(k) => return k,
            Err(CoreError::InvalidOption { field, .. }) => {
                let i = KNOBS
                    .iter()
                    .position(|k| k.name == field)
                    .unwrap_or_else(|| panic!("refused knob {field:?} is not in the table"));
                if values[i] != default(&KNOBS[i]) {
                    values[i] = default(&KNOBS[i]);
                } else {
                    let readers: Vec<&str> = STAGES
                        .iter()
                        .filter(|s| s.knobs.contains(&KNOBS[i].name))
                        .flat_map(|s| s.knobs.iter().copied())
                        .collect();
                    assert!(!readers.is_empty(), "{field} refused at its default");
                    for (j, spec) in KNOBS.iter().enumerate() {
                        if readers.contains(&spec.name) {
                            values[j] = default(spec);
                        }
                    }
                }
            }
            Err(e) => panic!("knobs refused with an untyped error: {e}"),
        }
    }
    panic!("knobs still refused after resetting every one the core named: {values:?}")
}

fn order(b: &mut Bytes<'_>) -> OrderSpec {
    if b.u8() % 5 < 4 {
        return OrderSpec::Preset(b.pick(&PRESETS).to_owned());
    }
    let mut names: Vec<&str> = STAGES.iter().map(|s| s.name).collect();
    // A permutation from the input (Fisher-Yates).
    for i in (1..names.len()).rev() {
        names.swap(i, b.u8() as usize % (i + 1));
    }
    OrderSpec::Custom(names.into_iter().map(str::to_owned).collect())
}

fn row(b: &mut Bytes<'_>, vocab: usize) -> Vec<f32> {
    let scale = b.pick(&SCALES);
    let mode = b.u8();
    (0..vocab)
        .map(|i| match b.u8() % 16 {
            0 => b.pick(&SPECIAL),
            1 if mode & 1 == 1 => f32::NAN,
            2 => f32::from_bits(b.u32()),
            // Ties: a few coarse levels.
            3..=5 => (b.u8() % 4) as f32 * scale,
            _ => ((b.u8() as f32 - 128.0) / 64.0 + (i % 3) as f32 * 1e-3) * scale,
        })
        .collect()
}

fn check(chain: &SamplerChain, row: &[f32], history: History<'_>, k: &Knobs) {
    let mut scratch = Scratch::default();
    let first = chain.sample_row(row, history, chain.sequence, None, None, &mut scratch);
    let token = match first {
        Err(e) => {
            assert!(!matches!(e, CoreError::Internal(_)), "{e}");
            return;
        }
        Ok(s) => s.token,
    };
    let t = token as usize;
    assert!(t < row.len(), "token {t} of {}", row.len());
    assert!(!row[t].is_nan(), "NaN token {t}");
    assert!(row[t] > f32::NEG_INFINITY, "a -inf token {t}");
    assert!(
        k.logit_bias
            .iter()
            .all(|&(u, b)| u != token || b > f32::NEG_INFINITY),
        "token {t} is banned by its bias"
    );
    // Pure: again with the used scratch, and with a fresh one.
    let again = chain.sample_row(row, history, chain.sequence, None, None, &mut scratch);
    assert_eq!(again.map(|s| s.token), Ok(token));
    let greedy = k.temperature <= 0.0
        && k.dynamic_temp.is_none()
        && k.mirostat == Mirostat::Off
        && chain.stages().len() <= 1
        && k.logit_bias.is_empty();
    if greedy {
        assert_eq!(t, rlx_lm::argmax::argmax(row).unwrap(), "greedy is the argmax");
    }
    for mode in [LogprobMode::Raw, LogprobMode::Penalized, LogprobMode::Final] {
        let s = chain
            .sample_row(
                row,
                history,
                chain.sequence,
                None,
                Some((5, mode)),
                &mut Scratch::default(),
            )
            .expect("the same row samples again");
        assert_eq!(s.token, token, "{mode:?}: logprobs change the token");
        let lp = s.logprobs.expect("logprobs asked for");
        assert!(lp.logprob <= 0.0, "{mode:?}: logprob {}", lp.logprob);
        if mode == LogprobMode::Final {
            assert!(lp.logprob.is_finite(), "final logprob {}", lp.logprob);
        }
        for w in lp.top.windows(2) {
            assert!(w[0].1 >= w[1].1, "{mode:?}: top not sorted {:?}", lp.top);
        }
        for &(_, l) in &lp.top {
            assert!(l <= 0.0 && !l.is_nan(), "{mode:?}: top logprob {l}");
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let mut b = Bytes(data);
    let vocab = match b.u8() % 8 {
        0 => 1,
        7 => 1500 + b.u8() as usize * 4,
        v => 2 + v as usize * 5,
    };
    let k = knobs(&mut b, vocab);
    let order = order(&mut b);
    let Ok(mut chain) = SamplerChain::new(k.clone(), &order, b.u8() as u64) else {
        return;
    };
    let steps = 1 + b.u8() % 3;
    let hist_len = b.pick(&[0usize, 1, 5, 40, 300]);
    let history: Vec<u32> = (0..hist_len)
        .map(|_| {
            let v = b.u8() as u32;
            // Mostly a small alphabet (repeats for DRY), sometimes out of range.
            if v == 255 {
                vocab as u32
            } else {
                v % (vocab as u32).min(7)
            }
        })
        .collect();
    let prompt_len = b.u8() as usize % (history.len() + 1);
    let history = History {
        tokens: &history,
        prompt_len,
    };
    for _ in 0..steps {
        let r = row(&mut b, vocab);
        check(&chain, &r, history, &k);
        let step = chain.step;
        if chain
            .sample(&r, history, None, None, &mut Scratch::default())
            .is_ok()
        {
            assert_eq!(chain.step, step + 1, "sample accepts");
            assert!(chain.mu().is_none_or(f32::is_finite), "mu {:?}", chain.mu());
        }
    }
});
