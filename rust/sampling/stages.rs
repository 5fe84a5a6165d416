//! One description per stage: its name, the knobs it reads, when it is on,
//! whether it edits logits or truncates, and how it runs. [`STAGES`] lists
//! them in the default order; ordering, validation, the sampling loop, the
//! Python binding and `SampleOpts` all iterate it.

use super::candidates::Work;
use super::chain::{SamplerChain, Scratch};
use super::dist::{self, Stream};
use super::knobs::{Knobs, Mirostat};
use super::{logit_bias, min_p, temperature, top_k, top_n_sigma, top_p, typical, xtc};
use crate::error::CoreResult;

/// One stage of the chain, by its public name. The discriminant is the
/// stage's index in [`STAGES`].
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

/// Whether a stage keeps at least `min_keep` tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MinKeep {
    Never,
    Always,
    /// Where the order's flavour says so (top-k: Hugging Face and the default order).
    Flavor,
}

/// What one stage sees while it runs.
pub struct Pass<'p, 'a> {
    pub work: &'p mut Work<'a>,
    pub history: &'p [u32],
    pub prompt_len: usize,
    pub sequence: u64,
    pub step: u64,
    pub scratch: &'p mut Scratch,
    /// Whether this stage is the last before the seeded draw.
    pub last: bool,
}

/// Run the stage on the candidates; true when it left their masses for the draw.
pub type Apply = fn(&SamplerChain, &mut Pass<'_, '_>) -> CoreResult<bool>;

/// One stage's description.
pub struct StageSpec {
    pub stage: Stage,
    /// The name in order lists (`order=[...]`, `--samplers`).
    pub name: &'static str,
    /// The knobs it reads (names in [`super::knobs::KNOBS`]); the first is the one
    /// that turns it on.
    pub knobs: &'static [&'static str],
    /// Its place in each preset of [`super::order::PRESETS`] (same index):
    /// a preset runs its stages by ascending place. Places are spaced by
    /// ten so that a new stage slots in without renumbering the others;
    /// the default order's places follow [`STAGES`]' own order.
    pub places: [u16; 4],
    /// Its names in llama.cpp's `--samplers` list (the CLI's), none when
    /// llama.cpp's list cannot name it (logit bias always runs first there).
    pub llama_cpp_names: &'static [&'static str],
    /// Its letter in llama.cpp's `--sampling-seq` and llama-server's
    /// `samplers` string, where it has one.
    pub llama_cpp_letter: Option<char>,
    /// It edits logits in place (bias, penalties, DRY) rather than truncating
    /// or rescaling: it runs on the whole row, and the penalised
    /// log-probabilities replay it.
    pub edits: bool,
    pub min_keep: MinKeep,
    /// Whether these knobs make it change anything (an inactive stage is left out).
    pub active: fn(&Knobs) -> bool,
    pub apply: Apply,
}

/// Every stage, in the default order.
pub const STAGES: [StageSpec; 10] = [
    StageSpec {
        stage: Stage::LogitBias,
        places: [0, 0, 0, 0],
        llama_cpp_names: &[],
        llama_cpp_letter: None,
        name: "logit_bias",
        knobs: &["logit_bias"],
        edits: true,
        min_keep: MinKeep::Never,
        active: |k| !k.logit_bias.is_empty(),
        apply: |c, p| logit_bias::apply(p.work, &c.bias).map(|_| false),
    },
    StageSpec {
        stage: Stage::Penalties,
        places: [10, 10, 10, 10],
        llama_cpp_names: &["penalties"],
        llama_cpp_letter: Some('e'),
        name: "penalties",
        knobs: &[
            "repetition_penalty",
            "frequency_penalty",
            "presence_penalty",
            "repetition_window",
        ],
        edits: true,
        min_keep: MinKeep::Never,
        active: |k| {
            !(k.repetition_penalty == 1.0
                && k.frequency_penalty == 0.0
                && k.presence_penalty == 0.0)
        },
        apply: |c, p| {
            c.penalties
                .apply_split(p.work, p.history, p.prompt_len, &mut p.scratch.counts)
                .map(|_| false)
        },
    },
    StageSpec {
        stage: Stage::Dry,
        places: [20, 20, 20, 20],
        llama_cpp_names: &["dry"],
        llama_cpp_letter: Some('d'),
        name: "dry",
        knobs: &[
            "dry_multiplier",
            "dry_base",
            "dry_allowed_length",
            "dry_max_ngram",
            "dry_sequence_breakers",
        ],
        edits: true,
        min_keep: MinKeep::Never,
        active: |k| k.dry_multiplier > 0.0,
        apply: |c, p| {
            c.dry
                .apply(p.work, p.history, &mut p.scratch.counts)
                .map(|_| false)
        },
    },
    StageSpec {
        stage: Stage::Temperature,
        places: [30, 90, 30, 30],
        llama_cpp_names: &["temperature", "temp"],
        llama_cpp_letter: Some('t'),
        name: "temperature",
        knobs: &["temperature", "dynamic_temp", "dynamic_temp_exponent"],
        edits: false,
        min_keep: MinKeep::Never,
        // On unless mirostat replaces the draw with a greedy temperature
        // (at 0 without mirostat it marks the chain as the argmax).
        active: |k| k.dynamic_temp.is_some() || k.mirostat == Mirostat::Off || k.temperature > 0.0,
        apply: |c, p| {
            let k = c.knobs();
            match k.dynamic_temp {
                Some((lo, hi)) => {
                    temperature::apply_dynamic(
                        p.work,
                        lo,
                        hi,
                        k.dynamic_temp_exponent,
                        &mut p.scratch.probs,
                    );
                }
                None => temperature::apply(p.work, k.temperature),
            }
            Ok(false)
        },
    },
    StageSpec {
        stage: Stage::TopK,
        places: [40, 40, 40, 50],
        llama_cpp_names: &["top_k", "top-k"],
        llama_cpp_letter: Some('k'),
        name: "top_k",
        knobs: &["top_k", "min_keep"],
        edits: false,
        min_keep: MinKeep::Flavor,
        active: |k| k.top_k > 0,
        apply: |c, p| {
            top_k::apply(
                p.work,
                c.top_k,
                c.flavor.top_k_keep_ties,
                &mut p.scratch.delta_top_k,
            );
            Ok(false)
        },
    },
    StageSpec {
        stage: Stage::Typical,
        places: [50, 50, 70, 70],
        llama_cpp_names: &["typ_p", "typ-p", "typ", "typical_p", "typical-p", "typical"],
        llama_cpp_letter: Some('y'),
        name: "typical",
        knobs: &["typical_p", "min_keep"],
        edits: false,
        min_keep: MinKeep::Always,
        active: |k| k.typical_p < 1.0,
        apply: |c, p| {
            let k = c.knobs();
            typical::apply(
                p.work,
                k.typical_p,
                k.min_keep,
                c.flavor.typical,
                &mut p.scratch.probs,
            );
            Ok(false)
        },
    },
    StageSpec {
        stage: Stage::TopP,
        places: [60, 60, 50, 60],
        llama_cpp_names: &["top_p", "top-p", "nucleus"],
        llama_cpp_letter: Some('p'),
        name: "top_p",
        knobs: &["top_p", "min_keep"],
        edits: false,
        min_keep: MinKeep::Always,
        active: |k| k.top_p < 1.0,
        apply: |c, p| {
            // As the last stage, top-p hands its masses to the draw.
            let k = c.knobs();
            let s = &mut *p.scratch;
            Ok(top_p::apply(
                p.work,
                k.top_p,
                k.min_keep,
                &mut s.delta_top_p,
                p.last.then_some(&mut s.masses),
            ))
        },
    },
    StageSpec {
        stage: Stage::MinP,
        places: [70, 70, 60, 40],
        llama_cpp_names: &["min_p", "min-p"],
        llama_cpp_letter: Some('m'),
        name: "min_p",
        knobs: &["min_p", "min_keep"],
        edits: false,
        min_keep: MinKeep::Always,
        active: |k| k.min_p > 0.0,
        apply: |c, p| {
            let k = c.knobs();
            min_p::apply(p.work, k.min_p, k.min_keep, &mut p.scratch.delta_top_k);
            Ok(false)
        },
    },
    StageSpec {
        stage: Stage::TopNSigma,
        places: [80, 30, 80, 80],
        llama_cpp_names: &["top_n_sigma", "top-n-sigma"],
        llama_cpp_letter: Some('s'),
        name: "top_n_sigma",
        knobs: &["top_n_sigma"],
        edits: false,
        min_keep: MinKeep::Never,
        active: |k| k.top_n_sigma > 0.0,
        apply: |c, p| {
            top_n_sigma::apply(p.work, c.knobs().top_n_sigma);
            Ok(false)
        },
    },
    StageSpec {
        stage: Stage::Xtc,
        places: [90, 80, 90, 90],
        llama_cpp_names: &["xtc"],
        llama_cpp_letter: Some('x'),
        name: "xtc",
        knobs: &["xtc_prob", "xtc_threshold", "min_keep"],
        edits: false,
        min_keep: MinKeep::Always,
        active: |k| k.xtc_prob > 0.0,
        apply: |c, p| {
            let k = c.knobs();
            let coin = dist::uniform(k.seed, p.sequence, p.step, Stream::Xtc);
            xtc::apply(
                p.work,
                k.xtc_threshold,
                k.xtc_prob,
                k.min_keep,
                coin,
                &mut p.scratch.probs,
            );
            Ok(false)
        },
    },
];

impl Stage {
    /// Every stage, in the default order.
    pub const DEFAULT_ORDER: [Stage; 10] = {
        let mut out = [Stage::LogitBias; 10];
        let mut i = 0;
        while i < STAGES.len() {
            out[i] = STAGES[i].stage;
            i += 1;
        }
        out
    };

    /// The stage's description.
    pub fn spec(self) -> &'static StageSpec {
        &STAGES[self as usize]
    }

    /// The stage's name in order lists.
    pub fn name(self) -> &'static str {
        self.spec().name
    }

    /// The stage with this name.
    pub fn parse(name: &str) -> Option<Stage> {
        STAGES.iter().find(|s| s.name == name).map(|s| s.stage)
    }

    /// Every stage in the order of preset number `preset` (an index in
    /// [`super::order::PRESETS`]): by ascending place.
    pub fn preset_sequence(preset: usize) -> Vec<Stage> {
        let mut specs: Vec<&StageSpec> = STAGES.iter().collect();
        specs.sort_by_key(|s| s.places[preset]);
        specs.into_iter().map(|s| s.stage).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::super::knobs::{knob, KNOBS};
    use super::*;

    #[test]
    fn each_stage_sits_at_its_own_index_and_names_real_knobs() {
        for (i, s) in STAGES.iter().enumerate() {
            assert_eq!(s.stage as usize, i, "{}", s.name);
            assert_eq!(Stage::parse(s.name), Some(s.stage));
            for k in s.knobs {
                assert!(knob(k).is_some(), "{}: no knob {k}", s.name);
            }
        }
        let mut names: Vec<&str> = KNOBS.iter().map(|k| k.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), KNOBS.len(), "a knob is listed twice");
        let mut aliases: Vec<&str> = STAGES
            .iter()
            .flat_map(|s| s.llama_cpp_names)
            .copied()
            .collect();
        let n = aliases.len();
        aliases.sort_unstable();
        aliases.dedup();
        assert_eq!(aliases.len(), n, "a llama.cpp name is given to two stages");
        let mut letters: Vec<char> = STAGES.iter().filter_map(|s| s.llama_cpp_letter).collect();
        let n = letters.len();
        letters.sort_unstable();
        letters.dedup();
        assert_eq!(
            letters.len(),
            n,
            "a llama.cpp letter is given to two stages"
        );
    }

    #[test]
    fn each_preset_places_every_stage_once_and_default_follows_the_table() {
        use super::super::order::PRESETS;
        for (p, name) in PRESETS.iter().enumerate() {
            let mut places: Vec<u16> = STAGES.iter().map(|s| s.places[p]).collect();
            places.sort_unstable();
            places.dedup();
            assert_eq!(
                places.len(),
                STAGES.len(),
                "{name}: two stages share a place"
            );
            assert_eq!(Stage::preset_sequence(p).len(), STAGES.len());
        }
        assert_eq!(Stage::preset_sequence(0), Stage::DEFAULT_ORDER.to_vec());
    }

    #[test]
    fn the_defaults_turn_every_stage_off_but_temperature() {
        let k = Knobs::default();
        let on: Vec<&str> = STAGES
            .iter()
            .filter(|s| (s.active)(&k))
            .map(|s| s.name)
            .collect();
        assert_eq!(on, ["temperature"]);
        assert_eq!(k.validate(), Ok(()));
        for spec in &KNOBS {
            assert_eq!(spec.check(&spec.default_value()), Ok(()), "{}", spec.name);
        }
    }
}
