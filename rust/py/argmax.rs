//! `rlx_lm.argmax`.

use pyo3::prelude::*;

use super::arrays::f32_row;
use super::errors::{catch_panics, IntoPyResult};

/// Index of the largest logit in a float32 row (lowest index on ties).
#[pyfunction]
pub fn argmax(logits: &Bound<'_, PyAny>) -> PyResult<usize> {
    catch_panics(|| {
        let row = f32_row(logits, "logits")?;
        crate::argmax::argmax(row.as_slice()?).py()
    })
}
