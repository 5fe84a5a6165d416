//! The inference engine: a Llama-family model run in place on its stored
//! weights, one call per decode step (or per prefill chunk, or per batch of
//! sequences), appending to the sequences' [`crate::kv::KvCache`]s.
//!
//! - [`config`]: a family as its config mapping plus its block variant.
//! - [`weights`]: memory-mapped tensors, bounds-checked, gathered by name.
//! - [`linear`]: products with stored weights (`crate::quant`'s kernels).
//! - `attention`: query heads over cached keys and values, read in place, in spans.
//! - [`forward`]: the forward pass.
//! - `experts`: a mixture of experts in place of the dense MLP (routing, the picked
//!   experts' products, their weighted sum).
//! - `glu`: the feed-forward gate, `act(gate) * up` (SiLU or GELU), one `exp` polynomial in every build.
//! - `decode`: a one-token step of one or more sequences as one elastic job of a
//!   [`team::Team`].
//! - [`team`]: the engine's own threads (barrier jobs, and elastic jobs that wait
//!   for work done).
//!
//! `docs/llama_runner.md` says how to add a family.

mod attention;
pub mod config;
mod decode;
mod experts;
pub mod forward;
mod glu;
pub mod linear;
pub mod team;
pub mod weights;

pub use config::{BlockVariant, Config, Experts, Gating, LocalRope, RopeStyle};
pub use forward::{Model, Step};
pub use linear::Activations;
pub use weights::{Residency, Store, TensorEntry, AUTO_COPY_MAX};

#[cfg(test)]
mod tests;
