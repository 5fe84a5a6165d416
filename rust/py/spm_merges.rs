//! `spm_merges`: the merges of a SentencePiece GGUF vocabulary, derived by the core.

use pyo3::prelude::*;

use super::errors::catch_panics;
use super::gil::detached;

/// [`crate::spm_merges::spm_merges`] over Python lists, with the GIL released.
#[pyfunction]
pub fn spm_merges(
    py: Python<'_>,
    tokens: Vec<String>,
    mergeable: Vec<bool>,
    scores: Vec<f64>,
) -> PyResult<Vec<(usize, usize)>> {
    catch_panics(|| {
        // Owned copies: nothing Python is touched while detached.
        Ok(detached(py, &[], || {
            let refs: Vec<&str> = tokens.iter().map(String::as_str).collect();
            crate::spm_merges::spm_merges(&refs, &mergeable, &scores)
        }))
    })
}
