//! The inference engine: a Llama-family model run in place on its stored
//! weights, one call per decode step (or per prefill chunk, or per batch of
//! sequences), appending to the sequences' [`crate::kv::KvCache`]s.
//!
//! - [`config`]: a family as its config mapping plus its block variant.
//! - [`weights`]: memory-mapped tensors, bounds-checked, gathered by name.
//! - [`linear`]: products with stored weights (`crate::quant`'s kernels).
//! - [`forward`]: the forward pass.
//!
//! `docs/llama_runner.md` says how to add a family.

pub mod config;
pub mod forward;
pub mod linear;
pub mod weights;

pub use config::{BlockVariant, Config, RopeStyle};
pub use forward::{Model, Step};
pub use linear::Activations;
pub use weights::{Store, TensorEntry};

#[cfg(test)]
mod tests;
