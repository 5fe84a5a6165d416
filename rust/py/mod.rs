//! The PyO3 binding layer: thin wrappers that check Python input, call the
//! core, and map [`crate::CoreError`] to `rlx_lm.errors` exactly once.

mod argmax;
mod arrays;
mod engine;
mod errors;
mod gguf_strings;
mod gil;
mod kv;
mod quant;
mod sampling;
mod spm_merges;

use pyo3::prelude::*;

/// The compiled half of `rlx_lm`; import the public names from `rlx_lm`.
#[pymodule]
mod _core {
    use pyo3::prelude::*;

    #[pymodule_export]
    use super::argmax::argmax;
    #[pymodule_export]
    use super::engine::{engine_kernel_types, PyEngine};
    #[pymodule_export]
    use super::errors::_panic_for_tests;
    #[pymodule_export]
    use super::gguf_strings::gguf_strings;
    #[pymodule_export]
    use super::kv::{_kv_snapshot_from_state, PyKvCache, PyKvSnapshot};
    #[pymodule_export]
    use super::quant::{quant_matmul, quant_rows, quant_simd};
    #[pymodule_export]
    use super::sampling::{
        _sampler_chain_from_state, _validate_sample_opts, PySamplerChain, SampleResult,
    };
    #[pymodule_export]
    use super::spm_merges::spm_merges;

    #[pymodule_init]
    fn init(m: &Bound<'_, PyModule>) -> PyResult<()> {
        m.add("__version__", env!("CARGO_PKG_VERSION"))?;
        m.add("build_profile", super::build_profile())?;
        // Limits and granularities defined once, in the core, for Python to read.
        m.add("KV_BLOCK_TOKENS", crate::kv::BLOCK_TOKENS)?;
        m.add("KV_MAX_SEQ", crate::kv::MAX_SEQ_LIMIT)?;
        m.add("KV_MAX_LAYERS", crate::kv::MAX_LAYERS)?;
        m.add("KV_MAX_KV_HEADS", crate::kv::MAX_KV_HEADS)?;
        m.add("KV_MAX_HEAD_DIM", crate::kv::MAX_HEAD_DIM)?;
        // The weight formats the core reads: ggml name -> (ggml type id,
        // values per block, bytes per block).
        let types = pyo3::types::PyDict::new(m.py());
        for t in crate::quant::format::ALL {
            types.set_item(t.name(), (t.ggml_id(), t.block_values(), t.block_bytes()))?;
        }
        m.add("QUANT_TYPES", types)?;
        // The sampler's knobs, stages and presets, described once in the core.
        super::sampling::add_tables(m)?;
        Ok(())
    }
}

/// `"release"` or `"debug"`, so benches can refuse a debug build.
fn build_profile() -> &'static str {
    if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    }
}
