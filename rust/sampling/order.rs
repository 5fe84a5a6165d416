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

/// A preset's stage sequence (from each stage's place in it, see
/// [`super::stages::StageSpec::places`]) and its boundary rules.
pub(crate) fn preset_order(name: &str) -> Option<(Vec<Stage>, Flavor)> {
    let flavor = match name {
        "default" => Flavor::OURS,
        "llama.cpp" => Flavor::default(),
        "hf" => Flavor {
            top_k_keep_ties: true,
            top_k_min_keep: true,
            typical: TypicalRule {
                inclusive: true,
                keep_ties: true,
            },
            whole_context: true,
            output_only_counts: false,
        },
        "vllm" => Flavor {
            top_k_keep_ties: true,
            top_k_min_keep: false,
            typical: TypicalRule::default(),
            whole_context: true,
            output_only_counts: true,
        },
        _ => return None,
    };
    let index = PRESETS.iter().position(|&p| p == name)?;
    Some((Stage::preset_sequence(index), flavor))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sequences as the engines run them (docs/samplers.md's table):
    /// the places in each `StageSpec` must spell these. Only these ten
    /// stages' relative order is pinned, so a new stage needs no edit here.
    #[test]
    fn the_preset_sequences_are_the_engines_orders() {
        let known = [
            "logit_bias",
            "penalties",
            "dry",
            "temperature",
            "top_k",
            "typical",
            "top_p",
            "min_p",
            "top_n_sigma",
            "xtc",
        ];
        let seq = |p: &str| -> Vec<&str> {
            preset_order(p)
                .unwrap()
                .0
                .iter()
                .map(|s| s.name())
                .filter(|n| known.contains(n))
                .collect()
        };
        let head = ["logit_bias", "penalties", "dry"];
        let tail =
            |t: &[&'static str]| -> Vec<&'static str> { head.iter().chain(t).copied().collect() };
        assert_eq!(
            seq("default"),
            tail(&[
                "temperature",
                "top_k",
                "typical",
                "top_p",
                "min_p",
                "top_n_sigma",
                "xtc"
            ])
        );
        assert_eq!(
            seq("llama.cpp"),
            tail(&[
                "top_n_sigma",
                "top_k",
                "typical",
                "top_p",
                "min_p",
                "xtc",
                "temperature"
            ])
        );
        assert_eq!(
            seq("hf"),
            tail(&[
                "temperature",
                "top_k",
                "top_p",
                "min_p",
                "typical",
                "top_n_sigma",
                "xtc"
            ])
        );
        assert_eq!(
            seq("vllm"),
            tail(&[
                "temperature",
                "min_p",
                "top_k",
                "top_p",
                "typical",
                "top_n_sigma",
                "xtc"
            ])
        );
        assert!(preset_order("nope").is_none());
    }
}
