//! Stage names and the order presets ("default", "llama.cpp", "hf", "vllm").

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

pub(crate) fn preset_order(name: &str) -> Option<(Vec<Stage>, Flavor)> {
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
