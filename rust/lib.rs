//! Rust core of `rlx_lm`.
//!
//! Everything outside `py/` is plain Rust over slices and returns
//! [`CoreError`]; it builds and tests with `cargo test` and no Python.
//! The PyO3 layer in `py/` compiles only with the `python` feature.

pub mod argmax;
pub mod engine;
pub mod error;
pub mod gguf_strings;
pub mod kv;
pub mod per_process;
pub mod quant;
pub mod sampling;
pub mod spm_merges;

#[cfg(feature = "python")]
mod py;

pub use error::{CoreError, CoreResult};
