//! Stage names and the order presets ("default", "llama.cpp", "hf", "vllm").

pub use super::stages::Stage;
pub use super::typical::Rule as TypicalRule;

/// Boundary rules that differ between engines.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Flavor {
    /// Top-k keeps every candidate tied with the k-th (Hugging Face, vLLM).
    pub top_k_keep_ties: bool,
    /// Top-k keeps at least `min_keep` (Hugging Face's `max(top_k, min_tokens_to_keep)`).
    pub top_k_min_keep: bool,
    /// Typical's boundary rule (Hugging Face: `>= p`, ties with the boundary kept).
    pub typical: TypicalRule,
    /// Penalties look at the whole context unless a window is given
    /// (Hugging Face, vLLM); otherwise at the last 64 tokens (llama.cpp).
    pub whole_context: bool,
    /// Frequency and presence count the output only (the history after
    /// `prompt_len`), the repetition penalty prompt and output (vLLM).
    pub output_only_counts: bool,
}

impl Flavor {
    /// The default order's rules (also a custom order's): ties to the lowest
    /// id, and top-k keeps at least `min_keep`.
    pub const OURS: Flavor = Flavor {
        top_k_keep_ties: false,
        top_k_min_keep: true,
        typical: TypicalRule {
            inclusive: false,
            keep_ties: false,
        },
        whole_context: false,
        output_only_counts: false,
    };
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
        "default" => (Stage::DEFAULT_ORDER.to_vec(), Flavor::OURS),
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
                top_k_min_keep: true,
                typical: TypicalRule {
                    inclusive: true,
                    keep_ties: true,
                },
                whole_context: true,
                output_only_counts: false,
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
                top_k_min_keep: false,
                typical: TypicalRule::default(),
                whole_context: true,
                output_only_counts: true,
            },
        ),
        _ => return None,
    })
}
