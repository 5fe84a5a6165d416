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
    /// RMS norms over each head of q and k before RoPE (Qwen3, Gemma 3).
    pub qk_norm: bool,
    /// GeGLU: `gelu(gate) * up` with GELU's tanh form, instead of SwiGLU (Gemma).
    pub gelu: bool,
    /// RMS norms of the attention output and of the MLP output before each
    /// is added to the residual stream (`attn_post_norm`, `ffn_post_norm`:
    /// Gemma 2 and 3).
    pub post_norms: bool,
    /// No RMS norm before attention and before the MLP (OLMo 2, whose
    /// blocks norm only their outputs: `post_norms`).
    pub no_pre_norms: bool,
    /// q and k are RMS-normed over the whole projection (`q_width`,
    /// `kv_width` weights: OLMo 2, OLMoE), not head by head.
    pub qk_norm_full: bool,
    /// A bias on the attention's output projection (gpt-oss).
    pub o_bias: bool,
    /// A learned logit a query head (`attn_sinks`: gpt-oss) joins each
    /// head's softmax as one more key whose value is zero, so the head can
    /// attend to "nothing".
    pub attn_sinks: bool,
    /// gpt-oss's gate: `min(g, 7) * sigmoid(1.702 min(g, 7)) * (clamp(u, -7, 7) + 1)`
    /// instead of SwiGLU (llama.cpp's `swiglu_oai`).
    pub oai_glu: bool,
}

/// A mixture of experts in place of each block's dense MLP (Mixtral, Qwen2-MoE,
/// Qwen3-MoE): a router picks `used` of `count` gated MLPs for every token,
/// weighted by their softmax probabilities (renormalised over the picked ones
/// when `norm_weights`), as llama.cpp's `build_moe_ffn` with softmax gating.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Experts {
    /// Experts a block has.
    pub count: usize,
    /// Experts each token runs (top-k).
    pub used: usize,
    /// Width of each expert's MLP.
    pub ff: usize,
    /// Divide the picked experts' weights by their sum.
    pub norm_weights: bool,
    /// Width of the shared expert every token also runs, gated by a sigmoid
    /// (Qwen2-MoE); 0 for none.
    pub shared_ff: usize,
    /// How the router's logits become the picks' weights.
    pub gating: Gating,
    /// Biases on the router and on every expert's gate, up and down
    /// (gpt-oss: `ffn_gate_inp.bias`, `ffn_{gate,up,down}_exps.bias`).
    pub biases: bool,
}

/// How a router's logits become the picked experts' weights.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Gating {
    /// The softmax over all experts (renormalised over the picks when
    /// `norm_weights`): llama.cpp's softmax gating.
    #[default]
    Softmax,
    /// The top `used` logits, then the softmax over those only (gpt-oss:
    /// llama.cpp's `SOFTMAX_WEIGHT` gating).
    SoftmaxPicked,
}

/// The most experts a block may declare (llama.cpp's `LLAMA_MAX_EXPERTS`).
pub const MAX_EXPERTS: usize = 512;

/// RoPE of the windowed layers when they differ from the rest (Gemma 3's
/// local layers: base 10000, no scaling, while its global layers use base
/// 1e6 and linear scaling).
#[derive(Clone, Debug, PartialEq)]
pub struct LocalRope {
    /// Per-pair inverse frequencies (as many as [`Config::rope_inv_freq`]).
    pub inv_freq: Vec<f64>,
    /// Positions are divided by this before RoPE.
    pub position_scale: f64,
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
    /// Per-pair RoPE inverse frequencies, scaling already applied: `head_dim / 2`
    /// of them, or fewer when only the first `2 * len` elements of each head
    /// rotate (partial RoPE: Phi-4-mini, llama.cpp's `rope.dimension_count`).
    pub rope_inv_freq: Vec<f64>,
    /// Positions are divided by this before RoPE (linear scaling), else 1.
    pub rope_position_scale: f64,
    /// Factor on cos and sin, so on the rotated elements only (LongRoPE's
    /// attention factor, as llama.cpp's `attn_factor`), else 1.
    pub rope_mscale: f64,
    /// Pairing convention of the q/k rows as stored.
    pub rope_style: RopeStyle,
    /// Each query sees only its last `w` positions (Mistral), if set: in
    /// every layer, or in the layers `window_pattern` picks.
    pub sliding_window: Option<usize>,
    /// Which layers the window applies to, one flag a layer (Gemma 2: every
    /// other layer, Gemma 3: five of every six); empty: every layer.
    pub window_layers: Vec<bool>,
    /// RoPE of the windowed layers, if not the model's own.
    pub rope_local: Option<LocalRope>,
    /// Factor on the embedding rows before the first block (Gemma: `sqrt(hidden)`), else 1.
    pub embed_scale: f32,
    /// Factor on `q . k` before the softmax (usually `1 / sqrt(head_dim)`).
    pub attn_scale: f32,
    /// Attention scores become `c * tanh(s / c)` (Gemma 2), if set.
    pub attn_softcap: Option<f32>,
    /// Logits become `c * tanh(z / c)` (Gemma 2), if set.
    pub final_softcap: Option<f32>,
    /// Factor on the attention and MLP outputs before each residual add
    /// (Granite's `residual_scale`), else 1.
    pub residual_scale: f32,
    /// Logits are divided by this, as a product with its float32 reciprocal
    /// (Granite's `logit_scale`, as llama.cpp), else 1.
    pub logit_scale: f32,
    /// Layers whose q and k are not rotated (SmolLM3's NoPE layers: every
    /// fourth), one flag a layer; empty: RoPE in every layer.
    pub nope_layers: Vec<bool>,
    /// Optional block pieces.
    pub block: BlockVariant,
    /// Experts in place of the dense MLP, if the model is a mixture of experts.
    pub experts: Option<Experts>,
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
        let pairs = self.rope_inv_freq.len();
        if pairs == 0 || pairs > self.head_dim / 2 {
            return Err(CoreError::option(
                "rope_inv_freq",
                format!(
                    "has {pairs} frequencies, head_dim {} takes 1 to {}",
                    self.head_dim,
                    self.head_dim / 2
                ),
            ));
        }
        if !(self.rope_mscale.is_finite() && self.rope_mscale > 0.0) {
            return Err(CoreError::option(
                "rope_mscale",
                format!("must be positive and finite, got {}", self.rope_mscale),
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
        if !self.window_layers.is_empty() {
            if self.sliding_window.is_none() {
                return Err(CoreError::option(
                    "window_layers",
                    "is set but the model has no sliding_window",
                ));
            }
            if self.window_layers.len() != self.n_layers {
                return Err(CoreError::option(
                    "window_layers",
                    format!(
                        "has {} flags for {} layers",
                        self.window_layers.len(),
                        self.n_layers
                    ),
                ));
            }
        }
        if !self.nope_layers.is_empty() && self.nope_layers.len() != self.n_layers {
            return Err(CoreError::option(
                "nope_layers",
                format!(
                    "has {} flags for {} layers",
                    self.nope_layers.len(),
                    self.n_layers
                ),
            ));
        }
        if let Some(e) = &self.experts {
            if e.count == 0 || e.count > MAX_EXPERTS {
                return Err(CoreError::option(
                    "experts",
                    format!("count must be 1 to {MAX_EXPERTS}, got {}", e.count),
                ));
            }
            if e.used == 0 || e.used > e.count {
                return Err(CoreError::option(
                    "experts",
                    format!("used must be 1 to count={}, got {}", e.count, e.used),
                ));
            }
            if e.ff == 0 || e.ff > 1 << 24 || e.shared_ff > 1 << 24 {
                return Err(CoreError::option(
                    "experts",
                    format!(
                        "widths must be between 1 and 2^24 (ff {}, shared_ff {})",
                        e.ff, e.shared_ff
                    ),
                ));
            }
        }
        if let Some(local) = &self.rope_local {
            if local.inv_freq.len() != pairs {
                return Err(CoreError::option(
                    "rope_local",
                    format!(
                        "has {} frequencies, the model's RoPE has {pairs}",
                        local.inv_freq.len()
                    ),
                ));
            }
            if !(local.position_scale.is_finite() && local.position_scale > 0.0) {
                return Err(CoreError::option(
                    "rope_local",
                    format!(
                        "position scale must be positive, got {}",
                        local.position_scale
                    ),
                ));
            }
        }
        for (field, value) in [
            ("embed_scale", Some(self.embed_scale)),
            ("attn_scale", Some(self.attn_scale)),
            ("attn_softcap", self.attn_softcap),
            ("residual_scale", Some(self.residual_scale)),
            ("logit_scale", Some(self.logit_scale)),
            ("final_softcap", self.final_softcap),
        ] {
            if let Some(v) = value {
                if !(v.is_finite() && v > 0.0) {
                    return Err(CoreError::option(
                        field,
                        format!("must be positive and finite, got {v}"),
                    ));
                }
            }
        }
        Ok(())
    }

    /// The window of layer `layer`'s attention, if it has one.
    pub fn window(&self, layer: usize) -> Option<usize> {
        self.sliding_window.filter(|_| self.windowed(layer))
    }

    /// Whether `layer` is one of the windowed layers (all layers when the
    /// model has a window and no pattern).
    fn windowed(&self, layer: usize) -> bool {
        self.sliding_window.is_some()
            && (self.window_layers.is_empty() || self.window_layers.get(layer) == Some(&true))
    }

    /// Whether `layer` rotates q and k (every layer but SmolLM3's NoPE ones).
    pub fn rotates(&self, layer: usize) -> bool {
        self.nope_layers.get(layer) != Some(&true)
    }

    /// Whether `layer` uses [`Config::rope_local`].
    pub fn local_rope(&self, layer: usize) -> bool {
        self.rope_local.is_some() && self.windowed(layer)
    }

    /// Whether every layer has the same attention window and RoPE (what the
    /// team's one-step decode assumes), pre norms and no post norms, and
    /// none of gpt-oss's pieces (sinks, output and expert biases, its gate).
    pub fn uniform_layers(&self) -> bool {
        !self.block.no_pre_norms
            && !self.block.o_bias
            && !self.block.attn_sinks
            && !self.block.oai_glu
            && self
                .experts
                .is_none_or(|e| !e.biases && e.gating == Gating::Softmax)
            && self.window_layers.is_empty()
            && self.rope_local.is_none()
            && !self.block.post_norms
            && self.nope_layers.is_empty()
    }

    /// Rotated pairs per head (`head_dim / 2` unless RoPE is partial).
    pub fn rope_pairs(&self) -> usize {
        self.rope_inv_freq.len()
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
        rope_mscale: 1.0,
        rope_style: RopeStyle::Halves,
        sliding_window: None,
        window_layers: Vec::new(),
        rope_local: None,
        embed_scale: 1.0,
        attn_scale: 1.0 / (head_dim as f32).sqrt(),
        attn_softcap: None,
        final_softcap: None,
        residual_scale: 1.0,
        logit_scale: 1.0,
        nope_layers: Vec::new(),
        block: BlockVariant::default(),
        experts: None,
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
        assert!(
            c.validate().is_ok(),
            "partial RoPE: fewer pairs than head_dim / 2"
        );
        c.rope_inv_freq.clear();
        assert!(c.validate().is_err(), "no pair to rotate");
        c.rope_inv_freq = vec![1.0; c.head_dim / 2 + 1];
        assert!(c.validate().is_err(), "more pairs than a head has");
        let mut c = tiny("llama");
        c.sliding_window = Some(0);
        assert!(c.validate().is_err());
        let mut c = tiny("gemma2");
        c.window_layers = vec![true, false];
        assert!(c.validate().is_err(), "windowed layers without a window");
        c.sliding_window = Some(4);
        assert!(c.validate().is_ok());
        c.window_layers.push(true);
        assert!(c.validate().is_err(), "a flag per layer");
        c.window_layers.pop();
        c.attn_softcap = Some(0.0);
        assert!(c.validate().is_err());
        let mut c = tiny("gemma3");
        c.rope_local = Some(LocalRope {
            inv_freq: vec![1.0; 3],
            position_scale: 1.0,
        });
        assert!(c.validate().is_err());
    }

    #[test]
    fn window_flags_pick_the_windowed_layers_and_their_rope() {
        let mut c = tiny("gemma3");
        c.n_layers = 4;
        c.sliding_window = Some(8);
        c.window_layers = vec![true, false, true, true];
        let windowed: Vec<usize> = (0..4).filter(|&i| c.window(i).is_some()).collect();
        assert_eq!(windowed, [0, 2, 3]);
        assert!(!c.local_rope(0), "no local RoPE given");
        c.rope_local = Some(LocalRope {
            inv_freq: c.rope_inv_freq.clone(),
            position_scale: 1.0,
        });
        let local: Vec<usize> = (0..4).filter(|&i| c.local_rope(i)).collect();
        assert_eq!(local, [0, 2, 3]);
        assert!(!c.uniform_layers());
        c.window_layers.clear();
        c.rope_local = None;
        assert!((0..4).all(|i| c.window(i) == Some(8)));
        assert!(c.uniform_layers());
        c.sliding_window = None;
        assert!((0..4).all(|i| c.window(i).is_none()));
    }
}
