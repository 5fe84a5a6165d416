//! The sampler chain: the knobs, the stage orders (presets and custom lists),
//! and one sampling call from a logits row to a token.

use super::candidates::{top_k_sparse, Cand, RowRef, Work};
use super::dense;
use super::dist::{self, Stream};
use super::dry::Dry;
use super::mirostat::{self, Surprises};
use super::penalties::Penalties;
use super::{logit_bias, min_p, temperature, top_k, top_n_sigma, top_p, typical, xtc};
use crate::error::{CoreError, CoreResult};

/// Which mirostat, if any, replaces the final draw.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Mirostat {
    #[default]
    Off,
    V1,
    V2,
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
    /// Most recent history tokens the penalties look at (`None`: all).
    pub repetition_window: Option<usize>,
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
            repetition_window: Some(64),
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

fn finite(field: &str, v: f32) -> CoreResult<()> {
    if v.is_finite() {
        Ok(())
    } else {
        Err(CoreError::option(
            field,
            format!("must be a finite number, got {v}"),
        ))
    }
}

fn check(ok: bool, field: &str, reason: impl Into<String>) -> CoreResult<()> {
    if ok {
        Ok(())
    } else {
        Err(CoreError::option(field, reason))
    }
}

impl Knobs {
    /// Refuse values no stage can honour, naming the field.
    pub fn validate(&self) -> CoreResult<()> {
        for (f, v) in [
            ("temperature", self.temperature),
            ("top_p", self.top_p),
            ("min_p", self.min_p),
            ("typical_p", self.typical_p),
            ("top_n_sigma", self.top_n_sigma),
            ("repetition_penalty", self.repetition_penalty),
            ("frequency_penalty", self.frequency_penalty),
            ("presence_penalty", self.presence_penalty),
            ("dynamic_temp_exponent", self.dynamic_temp_exponent),
            ("xtc_threshold", self.xtc_threshold),
            ("xtc_prob", self.xtc_prob),
            ("dry_multiplier", self.dry_multiplier),
            ("dry_base", self.dry_base),
            ("mirostat_tau", self.mirostat_tau),
            ("mirostat_eta", self.mirostat_eta),
        ] {
            finite(f, v)?;
        }
        let t = self.temperature;
        check(
            t >= 0.0,
            "temperature",
            format!("must be >= 0 (0 = greedy), got {t}"),
        )?;
        let p = self.top_p;
        check(
            p > 0.0 && p <= 1.0,
            "top_p",
            format!("must be in (0, 1], got {p}"),
        )?;
        let p = self.min_p;
        check(
            (0.0..=1.0).contains(&p),
            "min_p",
            format!("must be in [0, 1], got {p}"),
        )?;
        let p = self.typical_p;
        check(
            p > 0.0 && p <= 1.0,
            "typical_p",
            format!("must be in (0, 1], got {p}"),
        )?;
        let n = self.top_n_sigma;
        check(
            n >= 0.0,
            "top_n_sigma",
            format!("must be >= 0 (0 = off), got {n}"),
        )?;
        let r = self.repetition_penalty;
        check(
            r > 0.0,
            "repetition_penalty",
            format!("must be > 0 (1 = off), got {r}"),
        )?;
        check(
            self.repetition_window != Some(0),
            "repetition_window",
            "must be >= 1 (or -1 for the whole history); use repetition_penalty=1 to turn penalties off",
        )?;
        if let Some((lo, hi)) = self.dynamic_temp {
            finite("dynamic_temp", lo)?;
            finite("dynamic_temp", hi)?;
            check(
                lo >= 0.0,
                "dynamic_temp",
                format!("min must be >= 0, got {lo}"),
            )?;
            check(
                lo <= hi,
                "dynamic_temp",
                format!("min {lo} is greater than max {hi}"),
            )?;
        }
        let e = self.dynamic_temp_exponent;
        check(
            e >= 0.0,
            "dynamic_temp_exponent",
            format!("must be >= 0, got {e}"),
        )?;
        let x = self.xtc_prob;
        check(
            (0.0..=1.0).contains(&x),
            "xtc_prob",
            format!("must be in [0, 1], got {x}"),
        )?;
        let x = self.xtc_threshold;
        check(
            (0.0..=1.0).contains(&x),
            "xtc_threshold",
            format!("must be in [0, 1], got {x}"),
        )?;
        check(
            self.xtc_prob == 0.0 || self.xtc_threshold > 0.0,
            "xtc_threshold",
            "must be > 0 when xtc_prob > 0 (0 would remove every token but one)",
        )?;
        let m = self.dry_multiplier;
        check(
            m >= 0.0,
            "dry_multiplier",
            format!("must be >= 0 (0 = off), got {m}"),
        )?;
        let b = self.dry_base;
        check(b >= 1.0, "dry_base", format!("must be >= 1, got {b}"))?;
        check(
            self.dry_allowed_length >= 1,
            "dry_allowed_length",
            "must be >= 1 (0 would penalise every token seen, like a presence penalty)",
        )?;
        let tau = self.mirostat_tau;
        check(
            tau >= 0.0,
            "mirostat_tau",
            format!("must be >= 0, got {tau}"),
        )?;
        let eta = self.mirostat_eta;
        check(
            eta >= 0.0,
            "mirostat_eta",
            format!("must be >= 0, got {eta}"),
        )?;
        check(
            self.mirostat_m >= 2,
            "mirostat_m",
            format!(
                "must be >= 2 (the Zipf fit needs two ranks), got {}",
                self.mirostat_m
            ),
        )?;
        check(
            self.min_keep >= 1,
            "min_keep",
            "must be >= 1: a stage must keep at least one token",
        )?;
        let mut seen: Vec<u32> = self.logit_bias.iter().map(|&(t, _)| t).collect();
        seen.sort_unstable();
        check(
            seen.windows(2).all(|w| w[0] != w[1]),
            "logit_bias",
            "a token appears twice",
        )?;
        for &(tok, b) in &self.logit_bias {
            check(
                !b.is_nan() && b != f32::INFINITY,
                "logit_bias",
                format!("bias for token {tok} must be finite or -inf (ban), got {b}"),
            )?;
        }
        Ok(())
    }

    fn penalties(&self) -> Penalties {
        Penalties {
            repeat: self.repetition_penalty,
            frequency: self.frequency_penalty,
            presence: self.presence_penalty,
            window: self.repetition_window,
        }
    }

    fn dry(&self) -> Dry {
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
        match stage {
            Stage::LogitBias => !self.logit_bias.is_empty(),
            Stage::Penalties => !self.penalties().is_neutral(),
            Stage::Dry => self.dry_multiplier > 0.0,
            Stage::Temperature => {
                self.dynamic_temp.is_some()
                    || self.mirostat == Mirostat::Off
                    || self.temperature > 0.0
            }
            Stage::TopK => self.top_k > 0,
            Stage::Typical => self.typical_p < 1.0,
            Stage::TopP => self.top_p < 1.0,
            Stage::MinP => self.min_p > 0.0,
            Stage::TopNSigma => self.top_n_sigma > 0.0,
            Stage::Xtc => self.xtc_prob > 0.0,
        }
    }
}

/// One stage of the chain, by its public name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    LogitBias,
    Penalties,
    Dry,
    Temperature,
    TopK,
    Typical,
    TopP,
    MinP,
    TopNSigma,
    Xtc,
}

impl Stage {
    /// Every stage, in the default order.
    pub const DEFAULT_ORDER: [Stage; 10] = [
        Stage::LogitBias,
        Stage::Penalties,
        Stage::Dry,
        Stage::Temperature,
        Stage::TopK,
        Stage::Typical,
        Stage::TopP,
        Stage::MinP,
        Stage::TopNSigma,
        Stage::Xtc,
    ];

    /// The stage's name in order lists.
    pub fn name(self) -> &'static str {
        match self {
            Stage::LogitBias => "logit_bias",
            Stage::Penalties => "penalties",
            Stage::Dry => "dry",
            Stage::Temperature => "temperature",
            Stage::TopK => "top_k",
            Stage::Typical => "typical",
            Stage::TopP => "top_p",
            Stage::MinP => "min_p",
            Stage::TopNSigma => "top_n_sigma",
            Stage::Xtc => "xtc",
        }
    }

    /// The stage with this name.
    pub fn parse(name: &str) -> Option<Stage> {
        Stage::DEFAULT_ORDER.into_iter().find(|s| s.name() == name)
    }
}

/// The stage that picks the token at the end of the chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Selector {
    /// An argmax over the raw row: the chain is pure greedy.
    Argmax,
    /// The seeded draw.
    Dist,
    MirostatV1,
    MirostatV2,
}

/// How a sampling call first reads the row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FirstPass {
    /// Find the maximum (and NaN).
    Scan,
    /// The first stage edits logits: copy the row while scanning it.
    Copy,
}

/// Boundary rules that differ between engines.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Flavor {
    /// Top-k keeps every candidate tied with the k-th (Hugging Face, vLLM).
    pub top_k_keep_ties: bool,
    /// Typical stops at cumulative mass `>= p` (Hugging Face) rather than `> p`.
    pub typical_inclusive: bool,
}

/// How the stages are ordered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OrderSpec {
    /// A named preset: "default", "llama.cpp", "hf" or "vllm".
    Preset(String),
    /// Stage names in the order to run them; the draw always comes last.
    Custom(Vec<String>),
}

/// The preset names.
pub const PRESETS: [&str; 4] = ["default", "llama.cpp", "hf", "vllm"];

fn preset_order(name: &str) -> Option<(Vec<Stage>, Flavor)> {
    use Stage::*;
    Some(match name {
        "default" => (Stage::DEFAULT_ORDER.to_vec(), Flavor::default()),
        "llama.cpp" => (
            vec![
                LogitBias,
                Penalties,
                Dry,
                TopNSigma,
                TopK,
                Typical,
                TopP,
                MinP,
                Xtc,
                Temperature,
            ],
            Flavor::default(),
        ),
        "hf" => (
            vec![
                LogitBias,
                Penalties,
                Dry,
                Temperature,
                TopK,
                TopP,
                MinP,
                Typical,
                TopNSigma,
                Xtc,
            ],
            Flavor {
                top_k_keep_ties: true,
                typical_inclusive: true,
            },
        ),
        "vllm" => (
            vec![
                LogitBias,
                Penalties,
                Dry,
                Temperature,
                MinP,
                TopK,
                TopP,
                Typical,
                TopNSigma,
                Xtc,
            ],
            Flavor {
                top_k_keep_ties: true,
                typical_inclusive: false,
            },
        ),
        _ => return None,
    })
}

/// Which distribution `sample_with_logprobs` reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogprobMode {
    /// The softmax of the logits as given.
    Raw,
    /// After logit bias, penalties and DRY, before temperature and truncation.
    Penalized,
    /// The distribution the token was drawn from.
    Final,
}

/// Log-probabilities reported with a token.
#[derive(Clone, Debug, PartialEq)]
pub struct Logprobs {
    pub logprob: f64,
    pub top: Vec<(u32, f64)>,
}

/// The result of one sampling call.
#[derive(Clone, Debug, PartialEq)]
pub struct Sampled {
    pub token: u32,
    /// Mirostat's surprises, for `accept`.
    pub surprises: Option<Surprises>,
    pub logprobs: Option<Logprobs>,
}

/// Reusable buffers for sampling calls (one per thread); contents never
/// affect results.
#[derive(Debug, Default, Clone)]
pub struct Scratch {
    row: Vec<f32>,
    exps: Vec<f32>,
    cands: Vec<Cand>,
    cands2: Vec<Cand>,
    counts: Vec<u32>,
    probs: Vec<f64>,
    delta_top_k: f32,
    delta_top_p: f32,
}

/// A built chain: knobs, stage order, selector, and the per-sequence state
/// (`step`, mirostat's `mu`).
#[derive(Clone, Debug)]
pub struct SamplerChain {
    knobs: Knobs,
    stages: Vec<Stage>,
    selector: Selector,
    flavor: Flavor,
    order_name: String,
    penalties: Penalties,
    dry: Dry,
    bias: Vec<(u32, f32)>,
    max_bias_token: Option<u32>,
    /// Tokens accepted so far (the draw's counter).
    pub step: u64,
    /// The sequence id keyed into the draw.
    pub sequence: u64,
    mu: f32,
    pending: Option<Surprises>,
    first_pass: FirstPass,
}

impl SamplerChain {
    /// Build a chain from knobs and an order.
    pub fn new(knobs: Knobs, order: &OrderSpec, sequence: u64) -> CoreResult<Self> {
        knobs.validate()?;
        let (stages, flavor, order_name) = match order {
            OrderSpec::Preset(name) => {
                let (all, flavor) = preset_order(name).ok_or_else(|| {
                    CoreError::option(
                        "order",
                        format!(
                            "unknown preset {name:?}; expected one of {} or a list of stage names",
                            PRESETS.map(|p| format!("{p:?}")).join(", ")
                        ),
                    )
                })?;
                let stages = if name == "llama.cpp" && knobs.mirostat != Mirostat::Off {
                    let dropped: Vec<&str> = all
                        .iter()
                        .filter(|s| {
                            !matches!(s, Stage::LogitBias | Stage::Temperature)
                                && knobs.enables(**s)
                        })
                        .map(|s| s.name())
                        .collect();
                    if !dropped.is_empty() || knobs.dynamic_temp.is_some() {
                        return Err(CoreError::option(
                            "order",
                            format!(
                                "llama.cpp runs mirostat after temperature alone; these knobs would be ignored: {}",
                                if dropped.is_empty() { "dynamic_temp".to_owned() } else { dropped.join(", ") }
                            ),
                        ));
                    }
                    vec![Stage::LogitBias, Stage::Temperature]
                } else {
                    all
                };
                (stages, flavor, name.clone())
            }
            OrderSpec::Custom(names) => {
                let mut stages = Vec::new();
                for n in names {
                    let s = Stage::parse(n).ok_or_else(|| {
                        CoreError::option(
                            "order",
                            format!(
                                "unknown stage {n:?}; stages are {}",
                                Stage::DEFAULT_ORDER.map(|s| s.name()).join(", ")
                            ),
                        )
                    })?;
                    if stages.contains(&s) {
                        return Err(CoreError::option(
                            "order",
                            format!("stage {n:?} is listed twice"),
                        ));
                    }
                    stages.push(s);
                }
                for s in Stage::DEFAULT_ORDER {
                    if knobs.enables(s) && !stages.contains(&s) {
                        return Err(CoreError::option(
                            "order",
                            format!(
                                "stage {:?} is set by the options but missing from the order",
                                s.name()
                            ),
                        ));
                    }
                }
                (stages, Flavor::default(), "custom".to_owned())
            }
        };
        let stages: Vec<Stage> = stages.into_iter().filter(|s| knobs.enables(*s)).collect();
        let selector = match knobs.mirostat {
            Mirostat::V1 => Selector::MirostatV1,
            Mirostat::V2 => Selector::MirostatV2,
            Mirostat::Off => {
                if stages == [Stage::Temperature]
                    && knobs.temperature <= 0.0
                    && knobs.dynamic_temp.is_none()
                {
                    Selector::Argmax
                } else {
                    Selector::Dist
                }
            }
        };
        let first_pass = match stages.first() {
            Some(Stage::LogitBias | Stage::Penalties | Stage::Dry) => FirstPass::Copy,
            _ => FirstPass::Scan,
        };
        let mut bias = knobs.logit_bias.clone();
        bias.sort_unstable_by_key(|&(t, _)| t);
        let max_bias_token = bias.last().map(|&(t, _)| t);
        Ok(SamplerChain {
            penalties: knobs.penalties(),
            dry: knobs.dry(),
            bias,
            max_bias_token,
            mu: 2.0 * knobs.mirostat_tau,
            knobs,
            stages,
            selector,
            flavor,
            order_name,
            step: 0,
            sequence,
            pending: None,
            first_pass,
        })
    }

    /// The knobs the chain was built from.
    pub fn knobs(&self) -> &Knobs {
        &self.knobs
    }

    /// The stages that run, in order (disabled ones are left out).
    pub fn stages(&self) -> &[Stage] {
        &self.stages
    }

    /// The selector at the end of the chain.
    pub fn selector(&self) -> Selector {
        self.selector
    }

    /// The order's name ("default", a preset, or "custom").
    pub fn order_name(&self) -> &str {
        &self.order_name
    }

    /// Mirostat's current `mu` (`None` without mirostat).
    pub fn mu(&self) -> Option<f32> {
        (self.knobs.mirostat != Mirostat::Off).then_some(self.mu)
    }

    /// Record that `token` was emitted: advance the step and mirostat's `mu`.
    ///
    /// `mu` learns from the surprise of `token` under the distribution of the
    /// last `sample` call; a token outside that distribution leaves `mu` as is.
    pub fn accept(&mut self, token: u32) {
        if let Some(s) = self.pending.take() {
            if let Ok(i) = s.binary_search_by_key(&token, |&(t, _)| t) {
                self.mu -= self.knobs.mirostat_eta * (s[i].1 - self.knobs.mirostat_tau);
            }
        }
        self.step += 1;
    }

    /// Back to step 0 and the initial `mu` (the seed is kept, so the same
    /// tokens come out again).
    pub fn reset(&mut self) {
        self.step = 0;
        self.mu = 2.0 * self.knobs.mirostat_tau;
        self.pending = None;
    }

    /// Keep what a `sample` call left for `accept`.
    pub fn set_pending(&mut self, s: Option<Surprises>) {
        self.pending = s;
    }

    /// Sample one row as sequence `sequence` at the chain's current step.
    ///
    /// Pure with respect to the chain: the state is read, never written
    /// (scratch buffers aside), so calling it twice gives the same token.
    /// `uniform`, when given, replaces the generator's draw.
    pub fn sample_row(
        &self,
        row: &[f32],
        history: &[u32],
        sequence: u64,
        uniform: Option<f64>,
        logprobs: Option<(usize, LogprobMode)>,
        scratch: &mut Scratch,
    ) -> CoreResult<Sampled> {
        if row.is_empty() {
            return Err(CoreError::EmptyLogits);
        }
        let mut cands = std::mem::take(&mut scratch.cands);
        cands.clear();
        let mut copy = None;
        let (best, max, nan) = match self.first_pass {
            FirstPass::Scan => dense::argmax_nan(row),
            FirstPass::Copy => {
                let mut v = std::mem::take(&mut scratch.row);
                let r = dense::copy_argmax_nan(row, &mut v);
                copy = Some(v);
                r
            }
        };
        let restore = |scratch: &mut Scratch, cands: Vec<Cand>, copy: Option<Vec<f32>>| {
            scratch.cands = cands;
            if let Some(v) = copy {
                scratch.row = v;
            }
        };
        if nan {
            restore(scratch, cands, copy);
            let index = row.iter().position(|v| v.is_nan()).unwrap_or(0);
            return Err(CoreError::NanLogit { index });
        }
        if max == f32::NEG_INFINITY {
            restore(scratch, cands, copy);
            return Err(CoreError::AllBanned);
        }
        let vocab = row.len();
        let hist_max = history.iter().fold(0u32, |m, &t| m.max(t));
        let bad_token = if hist_max as usize >= vocab {
            history.iter().copied().find(|&t| t as usize >= vocab)
        } else {
            None
        }
        .or(self.max_bias_token.filter(|&t| t as usize >= vocab));
        if let Some(t) = bad_token {
            restore(scratch, cands, copy);
            return Err(CoreError::TokenOutOfRange {
                token: t as i64,
                vocab,
            });
        }
        if let Some(u) = uniform {
            if !(0.0..1.0).contains(&u) {
                restore(scratch, cands, copy);
                return Err(CoreError::option(
                    "uniform",
                    format!("must be in [0, 1), got {u}"),
                ));
            }
        }
        if self.selector == Selector::Argmax && logprobs.is_none() {
            restore(scratch, cands, copy);
            return Ok(Sampled {
                token: best as u32,
                surprises: None,
                logprobs: None,
            });
        }
        if scratch.counts.len() < vocab {
            scratch.counts.resize(vocab, 0);
        }
        let row_ref = match copy {
            Some(v) => RowRef::Owned(v),
            None => RowRef::Borrowed(row),
        };
        let mut work = Work::from_row(row_ref, best, max, cands);
        work.spare_row = Some(std::mem::take(&mut scratch.row));
        work.spare_cands = std::mem::take(&mut scratch.cands2);
        if max == f32::INFINITY {
            // +inf logits hold all the mass, shared equally.
            work.cands.clear();
            for (i, &v) in row.iter().enumerate() {
                if v == f32::INFINITY {
                    work.cands.push(Cand {
                        id: i as u32,
                        logit: 0.0,
                    });
                }
            }
            work.release_dense();
        }
        let result = self.run(
            &mut work, history, sequence, uniform, logprobs, row, scratch,
        );
        let (cands, spare, spare_cands) = work.into_buffers();
        scratch.cands = cands;
        scratch.cands2 = spare_cands;
        if let Some(v) = spare {
            scratch.row = v;
        }
        result
    }

    #[allow(clippy::too_many_arguments)]
    fn run(
        &self,
        work: &mut Work<'_>,
        history: &[u32],
        sequence: u64,
        uniform: Option<f64>,
        logprobs: Option<(usize, LogprobMode)>,
        row: &[f32],
        scratch: &mut Scratch,
    ) -> CoreResult<Sampled> {
        let k = &self.knobs;
        let step = self.step;
        for &stage in &self.stages {
            if !matches!(stage, Stage::LogitBias | Stage::Penalties | Stage::Dry) {
                work.refresh()?;
            }
            match stage {
                Stage::LogitBias => logit_bias::apply(work, &self.bias)?,
                Stage::Penalties => self.penalties.apply(work, history, &mut scratch.counts)?,
                Stage::Dry => self.dry.apply(work, history, &mut scratch.counts)?,
                Stage::Temperature => match k.dynamic_temp {
                    Some((lo, hi)) => {
                        temperature::apply_dynamic(
                            work,
                            lo,
                            hi,
                            k.dynamic_temp_exponent,
                            &mut scratch.probs,
                        );
                    }
                    None => temperature::apply(work, k.temperature),
                },
                Stage::TopK => top_k::apply(
                    work,
                    k.top_k,
                    self.flavor.top_k_keep_ties,
                    &mut scratch.delta_top_k,
                ),
                Stage::Typical => typical::apply(
                    work,
                    k.typical_p,
                    k.min_keep,
                    self.flavor.typical_inclusive,
                    &mut scratch.probs,
                ),
                Stage::TopP => top_p::apply(
                    work,
                    k.top_p,
                    k.min_keep,
                    &mut scratch.delta_top_p,
                    &mut scratch.exps,
                ),
                Stage::MinP => min_p::apply(work, k.min_p, k.min_keep, &mut scratch.delta_top_k),
                Stage::TopNSigma => top_n_sigma::apply(work, k.top_n_sigma),
                Stage::Xtc => {
                    let coin = dist::uniform(k.seed, sequence, step, Stream::Xtc);
                    xtc::apply(
                        work,
                        k.xtc_threshold,
                        k.xtc_prob,
                        k.min_keep,
                        coin,
                        &mut scratch.probs,
                    );
                }
            }
        }
        work.refresh()?;
        let u = uniform.unwrap_or_else(|| dist::uniform(k.seed, sequence, step, Stream::Draw));
        let (chosen, surprises) = match self.selector {
            Selector::Argmax | Selector::Dist => {
                let (c, _, _) = dist::draw(work, u, &mut scratch.exps);
                (c, None)
            }
            Selector::MirostatV1 => {
                let (c, s) = mirostat::v1(
                    work,
                    self.mu,
                    k.mirostat_m,
                    row.len(),
                    u,
                    &mut scratch.delta_top_k,
                    &mut scratch.exps,
                );
                (c, Some(s))
            }
            Selector::MirostatV2 => {
                let (c, s) = mirostat::v2(
                    work,
                    self.mu,
                    u,
                    &mut scratch.delta_top_k,
                    &mut scratch.exps,
                );
                (c, Some(s))
            }
        };
        let logprobs = match logprobs {
            None => None,
            Some((n, LogprobMode::Final)) => Some(final_logprobs(work, chosen.id, n, scratch)),
            Some((n, LogprobMode::Raw)) => Some(dense_logprobs(row, 1.0, chosen.id, n, scratch)),
            Some((n, LogprobMode::Penalized)) => {
                let (am, mx, _) = dense::argmax_nan(row);
                let mut w = Work::from_row(RowRef::Borrowed(row), am, mx, Vec::new());
                if w.max_logit() == f32::INFINITY {
                    Some(dense_logprobs(row, 1.0, chosen.id, n, scratch))
                } else {
                    for &stage in &self.stages {
                        match stage {
                            Stage::LogitBias => logit_bias::apply(&mut w, &self.bias)?,
                            Stage::Penalties => {
                                self.penalties.apply(&mut w, history, &mut scratch.counts)?
                            }
                            Stage::Dry => self.dry.apply(&mut w, history, &mut scratch.counts)?,
                            _ => {}
                        }
                    }
                    w.refresh()?;
                    let d = w.dense.as_ref().map(|d| d.row.as_slice()).unwrap_or(row);
                    Some(dense_logprobs(d, 1.0, chosen.id, n, scratch))
                }
            }
        };
        Ok(Sampled {
            token: chosen.id,
            surprises,
            logprobs,
        })
    }
}

/// Log-probabilities under the softmax of a whole row (`+inf` entries share
/// all the mass).
fn dense_logprobs(
    row: &[f32],
    scale: f32,
    token: u32,
    top_n: usize,
    scratch: &mut Scratch,
) -> Logprobs {
    let (max, _) = crate::argmax::max_and_nan(row);
    if max == f32::INFINITY {
        let n_inf = row.iter().filter(|&&v| v == f32::INFINITY).count() as f64;
        let lp = |t: u32| {
            if row[t as usize] == f32::INFINITY {
                -n_inf.ln()
            } else {
                f64::NEG_INFINITY
            }
        };
        let top = row
            .iter()
            .enumerate()
            .filter(|(_, &v)| v == f32::INFINITY)
            .take(top_n)
            .map(|(i, _)| (i as u32, lp(i as u32)))
            .collect();
        return Logprobs {
            logprob: lp(token),
            top,
        };
    }
    let ln_s = dense::exp_sum(row, max, scale).ln();
    // In f64 on both sides: rounding `max * scale` to f32 alone would shift
    // every log-probability when the scale is large.
    let ms = max as f64 * scale as f64;
    let lp = |l: f32| l as f64 * scale as f64 - ms - ln_s;
    let mut top = Vec::new();
    if top_n > 0 {
        dense::top_k(
            row,
            1.0,
            max,
            top_n,
            false,
            &mut scratch.delta_top_k,
            &mut top,
        );
    }
    Logprobs {
        logprob: lp(row[token as usize]),
        top: top.iter().map(|c| (c.id, lp(c.logit))).collect(),
    }
}

/// Log-probabilities under the distribution left at the draw.
fn final_logprobs(work: &Work<'_>, token: u32, top_n: usize, scratch: &mut Scratch) -> Logprobs {
    if let Some(d) = &work.dense {
        return dense_logprobs(d.row.as_slice(), d.scale, token, top_n, scratch);
    }
    let max = work.max_logit() as f64;
    let ln_s = work
        .cands
        .iter()
        .map(|c| (c.logit as f64 - max).exp())
        .sum::<f64>()
        .ln();
    let lp = |l: f32| l as f64 - max - ln_s;
    let logprob = work
        .cands
        .iter()
        .find(|c| c.id == token)
        .map_or(f64::NEG_INFINITY, |c| lp(c.logit));
    let mut top = work.cands.clone();
    if top_n > 0 {
        top_k_sparse(&mut top, top_n, false);
    } else {
        top.clear();
    }
    Logprobs {
        logprob,
        top: top.iter().map(|c| (c.id, lp(c.logit))).collect(),
    }
}
