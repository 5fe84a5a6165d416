//! `gguf_strings`: one chunk of a GGUF string array, walked by the core.

use pyo3::prelude::*;

use super::errors::catch_panics;

/// `(parsed, consumed, texts, bad_utf8)` of [`crate::gguf_strings::walk_strings`]
/// over the bytes of `chunk`.
#[pyfunction]
pub fn gguf_strings(
    chunk: &[u8],
    count: u64,
    big_endian: bool,
    keep: bool,
) -> PyResult<(u64, usize, Vec<String>, Option<u64>)> {
    catch_panics(|| {
        let s = crate::gguf_strings::walk_strings(chunk, count, big_endian, keep);
        Ok((s.parsed, s.consumed, s.texts, s.bad_utf8))
    })
}
