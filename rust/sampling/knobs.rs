//! The chain's knobs, their validation, and which stages they switch on.

use super::dry::Dry;
use super::order::{Flavor, Stage};
use super::penalties::Penalties;
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
            self.repetition_window != Window::Last(0),
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
        match stage {
            Stage::LogitBias => !self.logit_bias.is_empty(),
            Stage::Penalties => {
                !(self.repetition_penalty == 1.0
                    && self.frequency_penalty == 0.0
                    && self.presence_penalty == 0.0)
            }
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
