//! What the engine needs to know about a model: its geometry and numerics
//! (the config mapping) and its block variant (which optional pieces each
//! transformer block has).

use crate::{CoreError, CoreResult};

/// How query/key dimensions pair up for rotary embeddings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// Pair `i` is `(x[i], x[i + d/2])` (Hugging Face "rotate half", NEOX).
    Halves,
    /// Pair `i` is `(x[2i], x[2i + 1])` (llama.cpp's NORM RoPE). Llama and
    /// Mistral GGUF files store q/k rows permuted for it, so using it on the
    /// rows as stored equals rotate-half on the original rows, with no copy.
    Interleaved,
}

/// The optional pieces of a block, beyond the Llama core (pre-norm
/// attention with RoPE and GQA, pre-norm SwiGLU MLP).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlockVariant {
    /// Biases on the q, k and v projections (Qwen2).
    pub qkv_bias: bool,
    /// RMS norms over each head of q and k before RoPE (Qwen3).
    pub qk_norm: bool,
}

/// Geometry and numerics of one model.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// Architecture name (`llama`, `mistral`, `qwen2`, `qwen3`), for messages.
    pub arch: String,
    /// Logits per position.
    pub vocab_size: usize,
    /// Width of the residual stream.
    pub hidden_size: usize,
    /// Width of the MLP.
    pub intermediate_size: usize,
    /// Transformer blocks.
    pub n_layers: usize,
    /// Query heads.
    pub n_heads: usize,
    /// Key/value heads (divides `n_heads`).
    pub n_kv_heads: usize,
    /// Elements per head (even).
    pub head_dim: usize,
    /// RMS norm epsilon.
    pub rms_norm_eps: f32,
    /// Per-pair RoPE inverse frequencies, scaling already applied (`head_dim / 2`).
    pub rope_inv_freq: Vec<f64>,
    /// Positions are divided by this before RoPE (linear scaling), else 1.
    pub rope_position_scale: f64,
    /// Pairing convention of the q/k rows as stored.
    pub rope_style: RopeStyle,
    /// Each query sees only its last `w` positions (Mistral), if set.
    pub sliding_window: Option<usize>,
    /// Optional block pieces.
    pub block: BlockVariant,
}

impl Config {
    /// Refuse inconsistent or absurd geometry before anything is built.
    pub fn validate(&self) -> CoreResult<()> {
        for (field, value) in [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("n_layers", self.n_layers),
            ("n_heads", self.n_heads),
            ("n_kv_heads", self.n_kv_heads),
            ("head_dim", self.head_dim),
        ] {
            if value == 0 || value > 1 << 24 {
                return Err(CoreError::option(
                    field,
                    format!("must be between 1 and 2^24, got {value}"),
                ));
            }
        }
        if !self.n_heads.is_multiple_of(self.n_kv_heads) {
            return Err(CoreError::option(
                "n_kv_heads",
                format!(
                    "n_heads={} is not a multiple of n_kv_heads={}",
                    self.n_heads, self.n_kv_heads
                ),
            ));
        }
        if !self.head_dim.is_multiple_of(2) {
            return Err(CoreError::option(
                "head_dim",
                format!("must be even, got {}", self.head_dim),
            ));
        }
        if self.rope_inv_freq.len() != self.head_dim / 2 {
            return Err(CoreError::option(
                "rope_inv_freq",
                format!(
                    "has {} frequencies, head_dim {} needs {}",
                    self.rope_inv_freq.len(),
                    self.head_dim,
                    self.head_dim / 2
                ),
            ));
        }
        if !(self.rope_position_scale.is_finite() && self.rope_position_scale > 0.0) {
            return Err(CoreError::option(
                "rope_position_scale",
                format!("must be positive, got {}", self.rope_position_scale),
            ));
        }
        if !(self.rms_norm_eps.is_finite() && self.rms_norm_eps >= 0.0) {
            return Err(CoreError::option(
                "rms_norm_eps",
                format!("must be finite and >= 0, got {}", self.rms_norm_eps),
            ));
        }
        if self.sliding_window == Some(0) {
            return Err(CoreError::option("sliding_window", "must be positive"));
        }
        Ok(())
    }

    /// Query heads per key/value head.
    pub fn group(&self) -> usize {
        self.n_heads / self.n_kv_heads
    }

    /// Width of the query projection.
    pub fn q_width(&self) -> usize {
        self.n_heads * self.head_dim
    }

    /// Width of the key (and value) projection.
    pub fn kv_width(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }
}

#[cfg(test)]
pub(crate) fn tiny(arch: &str) -> Config {
    let head_dim = 8;
    Config {
        arch: arch.into(),
        vocab_size: 40,
        hidden_size: 32,
        intermediate_size: 48,
        n_layers: 2,
        n_heads: 4,
        n_kv_heads: 2,
        head_dim,
        rms_norm_eps: 1e-5,
        rope_inv_freq: (0..head_dim / 2)
            .map(|i| 1.0 / 10000f64.powf(2.0 * i as f64 / head_dim as f64))
            .collect(),
        rope_position_scale: 1.0,
        rope_style: RopeStyle::Halves,
        sliding_window: None,
        block: BlockVariant::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inconsistent_geometry_is_refused() {
        assert!(tiny("llama").validate().is_ok());
        let mut c = tiny("llama");
        c.n_kv_heads = 3;
        assert!(c.validate().is_err());
        let mut c = tiny("llama");
        c.rope_inv_freq.pop();
        assert!(c.validate().is_err());
        let mut c = tiny("llama");
        c.sliding_window = Some(0);
        assert!(c.validate().is_err());
    }
}
