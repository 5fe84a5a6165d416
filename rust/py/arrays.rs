//! Borrowing numpy inputs as slices without copying, with errors that say how
//! to convert when the array is not what the core needs.

use numpy::{PyArray1, PyArrayMethods, PyReadonlyArray1, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;

use super::errors::{DtypeError, ShapeError};

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
    let py = obj.py();
    let masked = MASKED.import(py, "numpy.ma", "MaskedArray")?;
    if obj.is_instance(masked)? {
        return Err(DtypeError::new_err(format!(
            "{what} is a numpy masked array, whose mask would be ignored; fill it \
             first, e.g. np.ma.filled(x, -np.inf) to ban the masked entries"
        )));
    }
    Ok(())
}

/// Borrow a 1-D, C-contiguous float32 numpy array read-only.
///
/// `what` names the argument in error messages. Any other dtype, rank or
/// layout raises `DtypeError`/`ShapeError` naming the conversion to apply;
/// nothing is converted silently.
pub fn f32_row<'py>(obj: &Bound<'py, PyAny>, what: &str) -> PyResult<PyReadonlyArray1<'py, f32>> {
    let Ok(untyped) = obj.cast::<PyUntypedArray>() else {
        return Err(DtypeError::new_err(format!(
            "{what} must be a numpy float32 array, got {}; \
             convert with np.asarray(x, dtype=np.float32)",
            describe(obj)
        )));
    };
    if untyped.ndim() != 1 {
        return Err(ShapeError::new_err(format!(
            "{what} must be 1-D (one row of logits), got an array of shape {:?}",
            untyped.shape()
        )));
    }
    let Ok(arr) = obj.cast::<PyArray1<f32>>() else {
        let dtype = untyped.dtype();
        return Err(DtypeError::new_err(format!(
            "{what} must have dtype float32, got {dtype}; \
             convert with x.astype(np.float32)"
        )));
    };
    if !untyped.is_c_contiguous() {
        return Err(DtypeError::new_err(format!(
            "{what} must be C-contiguous (got a strided view); \
             convert with np.ascontiguousarray(x)"
        )));
    }
    refuse_masked(obj, what)?;
    Ok(arr.readonly())
}
