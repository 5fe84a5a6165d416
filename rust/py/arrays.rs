//! Borrowing numpy inputs as slices without copying, with errors that say how
//! to convert when the array is not what the core needs.
//!
//! One rule for every binding: not an array or the wrong dtype or layout
//! (a strided view) is a `DtypeError`, the wrong rank a `ShapeError`; each
//! error is a [`CoreError`] mapped in `errors.rs`.

use numpy::ndarray::Dimension;
use numpy::{
    Element, PyArray, PyArrayMethods, PyReadonlyArray, PyReadonlyArray1, PyUntypedArray,
    PyUntypedArrayMethods,
};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;

use super::errors::IntoPyResult;
use crate::CoreError;

fn describe(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "object".to_owned())
}

/// Refuse a `numpy.ma.MaskedArray`: its data would be read and its mask
/// ignored, so masked entries would count as ordinary values.
pub fn refuse_masked(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<()> {
    static MASKED: PyOnceLock<Py<PyType>> = PyOnceLock::new();
    let masked = MASKED.import(obj.py(), "numpy.ma", "MaskedArray")?;
    if obj.is_instance(masked)? {
        return Err(CoreError::Dtype(format!(
            "{what} is a numpy masked array, whose mask would be ignored; fill it \
             first, e.g. np.ma.filled(x, -np.inf) to ban the masked entries"
        )))
        .py();
    }
    Ok(())
}

/// A read-only borrow of a C-contiguous `T` array of rank `D` (`dtype` names
/// `T` for numpy), or the typed error that says what to change.
pub fn borrow<'py, T: Element, D: Dimension>(
    obj: &Bound<'py, PyAny>,
    what: &str,
    dtype: &str,
) -> PyResult<PyReadonlyArray<'py, T, D>> {
    let Ok(untyped) = obj.cast::<PyUntypedArray>() else {
        return Err(CoreError::Dtype(format!(
            "{what} must be a numpy {dtype} array, got {}; \
             convert with np.asarray(x, dtype=np.{dtype})",
            describe(obj)
        )))
        .py();
    };
    let ndim = D::NDIM.unwrap_or(0);
    if untyped.ndim() != ndim {
        return Err(CoreError::Shape(format!(
            "{what} must be {ndim}-D, got an array of shape {:?}",
            untyped.shape()
        )))
        .py();
    }
    let Ok(arr) = obj.cast::<PyArray<T, D>>() else {
        return Err(CoreError::Dtype(format!(
            "{what} must have dtype {dtype}, got {}; convert with x.astype(np.{dtype})",
            untyped.dtype()
        )))
        .py();
    };
    if !untyped.is_c_contiguous() {
        return Err(CoreError::Dtype(format!(
            "{what} must be C-contiguous (got a strided view); \
             convert with np.ascontiguousarray(x)"
        )))
        .py();
    }
    refuse_masked(obj, what)?;
    arr.try_readonly()
        .map_err(|e| CoreError::Dtype(format!("{what} cannot be read now: {e}")))
        .py()
}

/// Borrow a 1-D, C-contiguous float32 numpy array read-only.
///
/// `what` names the argument in error messages. Any other dtype, rank or
/// layout raises `DtypeError`/`ShapeError` naming the conversion to apply;
/// nothing is converted silently.
pub fn f32_row<'py>(obj: &Bound<'py, PyAny>, what: &str) -> PyResult<PyReadonlyArray1<'py, f32>> {
    borrow::<f32, numpy::Ix1>(obj, what, "float32")
}
