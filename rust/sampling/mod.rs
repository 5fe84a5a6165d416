//! The sampler chain: from one logits row (and the token history) to a token.
//!
//! Stages work on a sparse candidate set. The chain starts from the whole row
//! without copying it; the first stage that truncates gathers its survivors in
//! one pass over the row (a threshold or a partial selection, never a sort of
//! the whole vocabulary), and every later stage works on those only.

pub mod batch;
pub mod candidates;
pub mod chain;
pub mod deferred;
pub mod dense;
pub mod dist;
pub mod dry;
pub mod handle;
pub mod knobs;
pub mod logit_bias;
pub mod logprobs;
pub mod min_p;
pub mod mirostat;
pub mod order;
pub mod penalties;
pub mod stages;
pub mod state;
pub mod temperature;
pub mod top_k;
pub mod top_n_sigma;
pub mod top_p;
pub mod typical;
pub mod window_counts;
pub mod xtc;

pub use chain::{
    Knobs, LogprobMode, Logprobs, Mirostat, OrderSpec, Sampled, SamplerChain, Scratch, Stage,
};
