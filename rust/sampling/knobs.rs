//! The chain's knobs, their validation, and which stages they switch on.

use super::dry::Dry;
use super::order::Flavor;
use super::penalties::Penalties;
use super::stages::{MinKeep, Stage, STAGES};
use crate::error::{CoreError, CoreResult};

/// Which mirostat, if any, replaces the final draw.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Mirostat {
    #[default]
    Off,
    V1,
    V2,
}

/// Which history tokens the penalties look at.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Window {
    /// The order's default: the last 64 (default, llama.cpp's
    /// `penalty_last_n`), or the whole context (Hugging Face, vLLM).
    #[default]
    Preset,
    /// The whole history.
    All,
    /// The most recent `n` tokens.
    Last(usize),
}

impl Window {
    /// The number of recent tokens (`None`: all) under an order whose
    /// default is the whole context (`whole`) or the last 64.
    pub fn resolve(self, whole: bool) -> Option<usize> {
        match self {
            Window::Preset if whole => None,
            Window::Preset => Some(64),
            Window::All => None,
            Window::Last(n) => Some(n),
        }
    }
}

/// Every knob of the chain (defaults: greedy, every other stage off).
#[derive(Clone, Debug, PartialEq)]
pub struct Knobs {
    pub temperature: f32,
    pub top_k: usize,
    pub top_p: f32,
    pub min_p: f32,
    pub typical_p: f32,
    pub top_n_sigma: f32,
    pub repetition_penalty: f32,
    pub frequency_penalty: f32,
    pub presence_penalty: f32,
    /// Which history tokens the penalties look at.
    pub repetition_window: Window,
    pub dynamic_temp: Option<(f32, f32)>,
    pub dynamic_temp_exponent: f32,
    pub xtc_threshold: f32,
    pub xtc_prob: f32,
    pub dry_multiplier: f32,
    pub dry_base: f32,
    pub dry_allowed_length: usize,
    pub dry_max_ngram: usize,
    pub dry_sequence_breakers: Vec<u32>,
    pub mirostat: Mirostat,
    pub mirostat_tau: f32,
    pub mirostat_eta: f32,
    pub mirostat_m: usize,
    pub min_keep: usize,
    pub seed: u64,
    /// `(token, bias)`, any order, one entry per token.
    pub logit_bias: Vec<(u32, f32)>,
}

impl Default for Knobs {
    fn default() -> Self {
        Knobs {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            typical_p: 1.0,
            top_n_sigma: 0.0,
            repetition_penalty: 1.0,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            repetition_window: Window::Preset,
            dynamic_temp: None,
            dynamic_temp_exponent: 1.0,
            xtc_threshold: 0.0,
            xtc_prob: 0.0,
            dry_multiplier: 0.0,
            dry_base: 1.75,
            dry_allowed_length: 2,
            dry_max_ngram: 32,
            dry_sequence_breakers: Vec::new(),
            mirostat: Mirostat::Off,
            mirostat_tau: 5.0,
            mirostat_eta: 0.1,
            mirostat_m: 100,
            min_keep: 1,
            seed: 0,
            logit_bias: Vec::new(),
        }
    }
}

/// How a knob's value is given (from Python: its type there).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A number, computed in float32.
    Float,
    /// An integer.
    Int,
    /// An integer, or None (the knob's own meaning: off, or the order's default).
    OptInt,
    /// A `(min, max)` pair of numbers, or None.
    Pair,
    /// A sequence of token ids.
    Tokens,
    /// A mode by its number.
    Mode,
    /// An integer in `0..2**64`, or None (a random seed).
    Seed,
    /// A mapping of token id to bias (finite, or -inf to ban).
    Bias,
}

impl Kind {
    /// The kind's name in the exported table.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Float => "float",
            Kind::Int => "int",
            Kind::OptInt => "int | None",
            Kind::Pair => "pair | None",
            Kind::Tokens => "tokens",
            Kind::Mode => "mode",
            Kind::Seed => "seed",
            Kind::Bias => "bias",
        }
    }
}

/// A knob's value as given, before it is checked and narrowed.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    None,
    Float(f64),
    Int(i128),
    Pair(f64, f64),
    Tokens(Vec<i128>),
    Bias(Vec<(i128, f64)>),
    /// A value of a type no knob takes; the string names the type.
    Other(String),
}

/// One end of a knob's valid range.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Bound {
    Open,
    /// Inclusive.
    Incl(f64),
    /// Exclusive.
    Excl(f64),
}

impl Bound {
    fn above(self, v: f64) -> bool {
        match self {
            Bound::Open => true,
            Bound::Incl(b) => v >= b,
            Bound::Excl(b) => v > b,
        }
    }

    fn below(self, v: f64) -> bool {
        match self {
            Bound::Open => true,
            Bound::Incl(b) => v <= b,
            Bound::Excl(b) => v < b,
        }
    }
}

/// One knob: its name, how it is given, its valid range, what it does, and
/// where it lives in [`Knobs`]. [`KNOBS`] lists every one; validation, the
/// Python binding, `SampleOpts`, the CLI and the docs iterate it.
pub struct KnobSpec {
    pub name: &'static str,
    pub kind: Kind,
    /// The valid range of the value (of each number of a pair).
    pub lo: Bound,
    pub hi: Bound,
    /// The range as the error says it ("in (0, 1]", ">= 0 (0 = greedy)").
    pub expect: &'static str,
    /// One sentence for `--help` and the docs.
    pub help: &'static str,
    /// llama.cpp's command-line flag for it, where it has one.
    pub flag: Option<&'static str>,
    /// Its fields in a request body to the server (`rlx_lm.server`): the
    /// names llama-server, OpenAI or vLLM give it (the knob's own name
    /// unless they spell it otherwise), each parsed by its [`Kind`].
    pub server_fields: &'static [&'static str],
    /// The range tests and fuzzers draw it from (hypothesis strategies, the
    /// fuzz harnesses): a bounded part of the valid range where its stage
    /// visibly acts. For token ids and biases, the bias values' range; for
    /// the seed, unused. Drawing from the table is what lets a new knob be
    /// fuzzed without an edit to any harness.
    pub probe: (f64, f64),
    /// The knob's value in a [`Knobs`].
    pub get: fn(&Knobs) -> Value,
    /// Store a value [`KnobSpec::check`] accepted.
    set: fn(&mut Knobs, &Value),
}

fn f(v: &Value) -> f32 {
    match *v {
        Value::Float(x) => x as f32,
        Value::Int(n) => n as f32,
        _ => 0.0,
    }
}

fn n(v: &Value) -> usize {
    match *v {
        Value::Int(n) => usize::try_from(n).unwrap_or(usize::MAX),
        _ => 0,
    }
}

fn token(v: i128) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX)
}

/// A knob's server fields: the ones given, else its own name.
macro_rules! server_fields {
    ($name:ident) => {
        &[stringify!($name)]
    };
    ($name:ident, $fields:expr) => {
        $fields
    };
}

macro_rules! float_knob {
    ($name:ident, $lo:expr, $hi:expr, $expect:expr, $flag:expr, $probe:expr, $help:expr
     $(, server = $fields:expr)?) => {
        KnobSpec {
            name: stringify!($name),
            kind: Kind::Float,
            lo: $lo,
            hi: $hi,
            expect: $expect,
            help: $help,
            flag: $flag,
            server_fields: server_fields!($name $(, $fields)?),
            probe: $probe,
            get: |k| Value::Float(k.$name as f64),
            set: |k, v| k.$name = f(v),
        }
    };
}

macro_rules! int_knob {
    ($name:ident, $lo:expr, $expect:expr, $flag:expr, $probe:expr, $help:expr) => {
        KnobSpec {
            name: stringify!($name),
            kind: Kind::Int,
            lo: $lo,
            hi: Bound::Open,
            expect: $expect,
            help: $help,
            flag: $flag,
            server_fields: &[stringify!($name)],
            probe: $probe,
            get: |k| Value::Int(k.$name as i128),
            set: |k, v| k.$name = n(v),
        }
    };
}

use Bound::{Excl, Incl, Open};

/// Every knob, in `SampleOpts`' field order.
pub const KNOBS: [KnobSpec; 26] = [
    float_knob!(
        temperature,
        Incl(0.0),
        Open,
        ">= 0 (0 = greedy)",
        Some("--temp"),
        (0.05, 2.0),
        "Divide the logits by this before sampling; 0 picks the most likely token."
    ),
    float_knob!(
        top_p,
        Excl(0.0),
        Incl(1.0),
        "in (0, 1]",
        Some("--top-p"),
        (0.01, 1.0),
        "Keep the smallest set of tokens whose probabilities add up to P."
    ),
    KnobSpec {
        name: "top_k",
        kind: Kind::OptInt,
        lo: Incl(0.0),
        hi: Open,
        expect: ">= 0 (0 or None = off)",
        help: "Keep only the K most likely tokens; unset or 0 keeps them all.",
        flag: Some("--top-k"),
        server_fields: &["top_k"],
        probe: (1.0, 300.0),
        get: |k| match k.top_k {
            0 => Value::None,
            n => Value::Int(n as i128),
        },
        set: |k, v| k.top_k = n(v),
    },
    float_knob!(
        repetition_penalty,
        Excl(0.0),
        Open,
        "> 0 (1 = off)",
        Some("--repeat-penalty"),
        (0.5, 2.0),
        "Divide the logits of tokens seen in the last window by this.",
        server = &["repeat_penalty", "repetition_penalty"]
    ),
    KnobSpec {
        name: "dynamic_temp",
        kind: Kind::Pair,
        lo: Incl(0.0),
        hi: Open,
        expect: "a (min, max) range with min >= 0",
        help: "Entropy-scaled temperature between min and max (replaces temperature).",
        flag: None,
        server_fields: &["dynatemp_range"],
        probe: (0.1, 2.0),
        get: |k| match k.dynamic_temp {
            None => Value::None,
            Some((lo, hi)) => Value::Pair(lo as f64, hi as f64),
        },
        set: |k, v| {
            k.dynamic_temp = match *v {
                Value::Pair(lo, hi) => Some((lo as f32, hi as f32)),
                _ => None,
            }
        },
    },
    float_knob!(
        dynamic_temp_exponent,
        Incl(0.0),
        Open,
        ">= 0",
        None,
        (0.0, 2.0),
        "The exponent of dynamic temperature's entropy scaling.",
        server = &["dynatemp_exponent"]
    ),
    float_knob!(
        typical_p,
        Excl(0.0),
        Incl(1.0),
        "in (0, 1]",
        Some("--typical"),
        (0.01, 1.0),
        "Locally typical sampling: keep tokens close to the expected surprise, mass P."
    ),
    float_knob!(
        top_n_sigma,
        Incl(0.0),
        Open,
        ">= 0 (0 = off)",
        Some("--top-nsigma"),
        (0.0, 3.0),
        "Keep tokens within N standard deviations of the top logit; 0 is off."
    ),
    float_knob!(
        min_p,
        Incl(0.0),
        Incl(1.0),
        "in [0, 1]",
        Some("--min-p"),
        (0.0, 1.0),
        "Drop tokens less likely than P times the most likely one."
    ),
    float_knob!(
        xtc_threshold,
        Incl(0.0),
        Incl(1.0),
        "in [0, 1]",
        Some("--xtc-threshold"),
        (0.01, 1.0),
        "Probability a token needs for XTC to consider removing it."
    ),
    float_knob!(
        xtc_prob,
        Incl(0.0),
        Incl(1.0),
        "in [0, 1]",
        Some("--xtc-probability"),
        (0.0, 1.0),
        "Chance per step that XTC removes the most likely tokens above the threshold.",
        server = &["xtc_probability"]
    ),
    float_knob!(
        dry_multiplier,
        Incl(0.0),
        Open,
        ">= 0 (0 = off)",
        Some("--dry-multiplier"),
        (0.0, 2.0),
        "Strength of the DRY penalty on repeated sequences; 0 turns DRY off."
    ),
    float_knob!(
        dry_base,
        Incl(1.0),
        Open,
        ">= 1",
        Some("--dry-base"),
        (1.0, 3.0),
        "Growth base of the DRY penalty with the repeated sequence's length."
    ),
    int_knob!(
        dry_allowed_length,
        Incl(1.0),
        ">= 1 (0 would penalise every token seen, like a presence penalty)",
        Some("--dry-allowed-length"),
        (1.0, 4.0),
        "Longest repetition DRY lets through unpenalised."
    ),
    int_knob!(
        dry_max_ngram,
        Incl(0.0),
        ">= 0 (0 = no cap)",
        None,
        (0.0, 32.0),
        "Longest repeated sequence DRY looks back for (0: no cap)."
    ),
    KnobSpec {
        name: "dry_sequence_breakers",
        kind: Kind::Tokens,
        lo: Incl(0.0),
        hi: Excl(4294967296.0),
        expect: "token ids in 0..2**32",
        help: "Token ids that end a repeated sequence for DRY.",
        flag: None,
        server_fields: &["dry_sequence_breakers"],
        probe: (0.0, 0.0),
        get: |k| Value::Tokens(k.dry_sequence_breakers.iter().map(|&t| t as i128).collect()),
        set: |k, v| {
            if let Value::Tokens(t) = v {
                k.dry_sequence_breakers = t.iter().map(|&t| token(t)).collect();
            }
        },
    },
    KnobSpec {
        name: "mirostat",
        kind: Kind::Mode,
        lo: Incl(0.0),
        hi: Incl(2.0),
        expect: "a MirostatMode (0, 1, 2)",
        help: "Mirostat sampling: 0 off, 1 Mirostat, 2 Mirostat 2.0.",
        flag: Some("--mirostat"),
        server_fields: &["mirostat"],
        probe: (0.0, 2.0),
        get: |k| {
            Value::Int(match k.mirostat {
                Mirostat::Off => 0,
                Mirostat::V1 => 1,
                Mirostat::V2 => 2,
            })
        },
        set: |k, v| {
            k.mirostat = match v {
                Value::Int(1) => Mirostat::V1,
                Value::Int(2) => Mirostat::V2,
                _ => Mirostat::Off,
            }
        },
    },
    float_knob!(
        mirostat_tau,
        Incl(0.0),
        Open,
        ">= 0",
        Some("--mirostat-ent"),
        (0.0, 10.0),
        "Mirostat's target surprise (entropy) per token."
    ),
    float_knob!(
        mirostat_eta,
        Incl(0.0),
        Open,
        ">= 0",
        Some("--mirostat-lr"),
        (0.0, 1.0),
        "Mirostat's learning rate."
    ),
    int_knob!(
        mirostat_m,
        Incl(2.0),
        ">= 2 (the Zipf fit needs two ranks)",
        None,
        (2.0, 200.0),
        "How many top tokens Mirostat 1 fits its Zipf exponent on."
    ),
    float_knob!(
        frequency_penalty,
        Open,
        Open,
        "a finite number",
        Some("--frequency-penalty"),
        (-2.0, 2.0),
        "Subtract this times a token's count so far from its logit."
    ),
    float_knob!(
        presence_penalty,
        Open,
        Open,
        "a finite number",
        Some("--presence-penalty"),
        (-2.0, 2.0),
        "Subtract this from the logit of every token already seen."
    ),
    KnobSpec {
        name: "repetition_window",
        kind: Kind::OptInt,
        lo: Incl(-1.0),
        hi: Open,
        expect: ">= 1, -1 for the whole history, or None for the order's default",
        help:
            "How many recent tokens the penalties look at (-1: all); unset takes the \
               order's default (64 under llama.cpp's and the default order, all under hf and vllm).",
        flag: Some("--repeat-last-n"),
        server_fields: &["repeat_last_n"],
        probe: (-1.0, 128.0),
        get: |k| match k.repetition_window {
            Window::Preset => Value::None,
            Window::All => Value::Int(-1),
            Window::Last(n) => Value::Int(n as i128),
        },
        set: |k, v| {
            k.repetition_window = match *v {
                Value::Int(-1) => Window::All,
                Value::Int(w) => Window::Last(usize::try_from(w).unwrap_or(0)),
                _ => Window::Preset,
            }
        },
    },
    int_knob!(
        min_keep,
        Incl(1.0),
        ">= 1 (a stage must keep at least one token)",
        None,
        (1.0, 4.0),
        "The fewest tokens a truncating stage keeps."
    ),
    KnobSpec {
        name: "seed",
        kind: Kind::Seed,
        lo: Incl(0.0),
        hi: Excl(18446744073709551616.0),
        expect: "in 0..2**64 or None",
        help: "The draw's seed; unset picks a random one (reported by the chain).",
        flag: None,
        server_fields: &["seed"],
        probe: (0.0, 0.0),
        get: |k| Value::Int(k.seed as i128),
        set: |k, v| {
            k.seed = match *v {
                Value::Int(s) => u64::try_from(s).unwrap_or(0),
                _ => random_seed(),
            }
        },
    },
    KnobSpec {
        name: "logit_bias",
        kind: Kind::Bias,
        lo: Open,
        hi: Excl(f64::INFINITY),
        expect: "finite or -inf (ban)",
        help: "Token id -> value added to its logit; -inf bans the token.",
        flag: None,
        server_fields: &["logit_bias"],
        probe: (-10.0, 10.0),
        get: |k| {
            let mut b: Vec<(i128, f64)> = k
                .logit_bias
                .iter()
                .map(|&(t, b)| (t as i128, b as f64))
                .collect();
            b.sort_by_key(|&(t, _)| t);
            Value::Bias(b)
        },
        set: |k, v| {
            if let Value::Bias(b) = v {
                k.logit_bias = b.iter().map(|&(t, b)| (token(t), b as f32)).collect();
            }
        },
    },
];

/// A seed from the OS-seeded hasher keys, for chains built without one.
pub fn random_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64),
    );
    h.finish()
}

fn check(ok: bool, field: &str, reason: impl Into<String>) -> CoreResult<()> {
    if ok {
        Ok(())
    } else {
        Err(CoreError::option(field, reason))
    }
}

/// A number the chain computes in float32: finite, and one float32 can
/// hold (rounding to the nearest is the contract; a value beyond float32's
/// range, or nonzero below its smallest subnormal, is refused rather than
/// turned into inf or 0).
fn float32(field: &str, v: f64) -> CoreResult<()> {
    check(
        !v.is_nan() && v.is_finite(),
        field,
        format!("must be a finite number, got {v}"),
    )?;
    let x = v as f32;
    check(
        !((x.is_infinite() && v.is_finite()) || (x == 0.0 && v != 0.0)),
        field,
        format!("{v} does not fit float32, which the sampler chain computes in"),
    )
}

fn token_id(field: &str, t: i128) -> CoreResult<()> {
    check(
        (0..1i128 << 32).contains(&t),
        field,
        format!("token ids must be in 0..2**32, got {t}"),
    )
}

impl KnobSpec {
    fn in_range(&self, v: f64) -> CoreResult<()> {
        check(
            self.lo.above(v) && self.hi.below(v),
            self.name,
            format!("must be {}, got {v}", self.expect),
        )
    }

    /// Refuse a value this knob cannot take, naming the knob.
    pub fn check(&self, v: &Value) -> CoreResult<()> {
        let name = self.name;
        let wrong = |what: &str| {
            let got = match v {
                Value::Other(t) => format!(", got {t}"),
                _ => String::new(),
            };
            Err(CoreError::option(name, format!("must be {what}{got}")))
        };
        match (self.kind, v) {
            (Kind::Float, Value::Float(x)) => {
                float32(name, *x)?;
                self.in_range(*x)
            }
            (Kind::Float, Value::Int(n)) => self.check(&Value::Float(*n as f64)),
            // Past 2**53 an f64 comparison rounds: the seed's ends are checked exactly.
            (Kind::Seed, Value::Int(n)) => check(
                (0..1i128 << 64).contains(n),
                name,
                format!("must be {}, got {n}", self.expect),
            ),
            (Kind::Int | Kind::Mode | Kind::OptInt, Value::Int(n)) => self.in_range(*n as f64),
            (Kind::OptInt | Kind::Pair | Kind::Seed, Value::None) => Ok(()),
            (Kind::Pair, Value::Pair(lo, hi)) => {
                for x in [*lo, *hi] {
                    float32(name, x)?;
                    self.in_range(x)?;
                }
                check(lo <= hi, name, format!("min {lo} is greater than max {hi}"))
            }
            (Kind::Tokens, Value::Tokens(ts)) => ts.iter().try_for_each(|&t| token_id(name, t)),
            (Kind::Bias, Value::Bias(items)) => {
                let mut seen: Vec<i128> = items.iter().map(|&(t, _)| t).collect();
                seen.sort_unstable();
                check(
                    seen.windows(2).all(|w| w[0] != w[1]),
                    name,
                    "a token appears twice",
                )?;
                for &(t, b) in items {
                    token_id(name, t)?;
                    check(
                        !b.is_nan() && b != f64::INFINITY,
                        name,
                        format!("bias for token {t} must be {}, got {b}", self.expect),
                    )?;
                    if b.is_finite() {
                        float32(name, b)?;
                    }
                }
                Ok(())
            }
            (Kind::Float, _) => wrong("a number"),
            (Kind::Int, _) => wrong("an integer"),
            (Kind::OptInt, _) => wrong("an integer or None"),
            (Kind::Pair, _) => wrong("a (min, max) pair or None"),
            (Kind::Tokens, _) => wrong("a sequence of token ids"),
            (Kind::Mode, _) => wrong(self.expect),
            (Kind::Seed, _) => wrong("an integer in 0..2**64 or None"),
            (Kind::Bias, _) => wrong("a mapping of token id to bias"),
        }
    }

    /// The knob's default, as `SampleOpts` states it (the seed: None, random).
    pub fn default_value(&self) -> Value {
        match self.kind {
            Kind::Seed => Value::None,
            _ => (self.get)(&Knobs::default()),
        }
    }
}

/// The knob named `name`.
pub fn knob(name: &str) -> Option<&'static KnobSpec> {
    KNOBS.iter().find(|k| k.name == name)
}

impl Knobs {
    /// Knobs from one value per knob of [`KNOBS`], in order, each checked
    /// as [`KnobSpec::check`] does, then validated together ([`Knobs::validate`]).
    pub fn from_values(values: Vec<Value>) -> CoreResult<Knobs> {
        if values.len() != KNOBS.len() {
            return Err(CoreError::Internal(format!(
                "{} knob values for {} knobs",
                values.len(),
                KNOBS.len()
            )));
        }
        let mut k = Knobs::default();
        for (spec, v) in KNOBS.iter().zip(values) {
            spec.check(&v)?;
            (spec.set)(&mut k, &v);
        }
        k.validate()?;
        Ok(k)
    }

    /// Refuse values no stage can honour, naming the field: every knob's own
    /// range ([`KNOBS`]), then the rules between knobs.
    pub fn validate(&self) -> CoreResult<()> {
        for spec in &KNOBS {
            spec.check(&(spec.get)(self))?;
        }
        check(
            self.repetition_window != Window::Last(0),
            "repetition_window",
            "must be >= 1 (or -1 for the whole history); use repetition_penalty=1 to turn penalties off",
        )?;
        check(
            self.dynamic_temp.is_none() || self.temperature == 0.0,
            "temperature",
            "dynamic_temp replaces temperature: leave temperature at 0 when setting it",
        )?;
        check(
            self.xtc_prob == 0.0 || self.xtc_threshold > 0.0,
            "xtc_threshold",
            "must be > 0 when xtc_prob > 0 (0 would remove every token but one)",
        )?;
        if self.min_keep > 1 {
            let readers: Vec<&str> = STAGES
                .iter()
                .filter(|s| s.min_keep != MinKeep::Never)
                .map(|s| s.knobs[0])
                .collect();
            check(
                STAGES
                    .iter()
                    .any(|s| s.min_keep != MinKeep::Never && (s.active)(self)),
                "min_keep",
                format!(
                    "{} but no stage that reads it is set ({}): it would change nothing; leave it at 1",
                    self.min_keep,
                    readers.join(", ")
                ),
            )?;
        }
        Ok(())
    }

    /// The penalties under an order's scope rules.
    pub(crate) fn penalties(&self, flavor: &Flavor) -> Penalties {
        Penalties {
            repeat: self.repetition_penalty,
            frequency: self.frequency_penalty,
            presence: self.presence_penalty,
            window: self.repetition_window.resolve(flavor.whole_context),
            output_only: flavor.output_only_counts,
        }
    }

    pub(crate) fn dry(&self) -> Dry {
        let mut breakers = self.dry_sequence_breakers.clone();
        breakers.sort_unstable();
        breakers.dedup();
        Dry {
            multiplier: self.dry_multiplier,
            base: self.dry_base,
            allowed_length: self.dry_allowed_length,
            max_ngram: self.dry_max_ngram,
            breakers,
        }
    }

    /// Whether `stage` would change anything with these knobs.
    pub fn enables(&self, stage: Stage) -> bool {
        (stage.spec().active)(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What tests and fuzzers draw must be valid: both ends of every
    /// numeric knob's probe range pass the knob's own check.
    #[test]
    fn every_probe_range_is_inside_its_knobs_valid_range() {
        for spec in &KNOBS {
            let (lo, hi) = spec.probe;
            assert!(lo <= hi, "{}", spec.name);
            let ends = match spec.kind {
                Kind::Float => vec![Value::Float(lo), Value::Float(hi)],
                Kind::Int | Kind::OptInt | Kind::Mode => {
                    assert!(lo.fract() == 0.0 && hi.fract() == 0.0, "{}", spec.name);
                    vec![Value::Int(lo as i128), Value::Int(hi as i128)]
                }
                Kind::Pair => vec![Value::Pair(lo, hi)],
                Kind::Bias => vec![Value::Bias(vec![(0, lo), (1, hi)])],
                Kind::Tokens | Kind::Seed => vec![],
            };
            for v in ends {
                assert_eq!(spec.check(&v), Ok(()), "{}: {v:?}", spec.name);
            }
        }
    }
}
