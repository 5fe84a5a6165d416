//! The single mapping from core errors to the exception classes defined in
//! `python/rlx_lm/errors.py` (they co-inherit builtins, which
//! `create_exception!` cannot express, so they are imported).

use pyo3::exceptions::{PyMemoryError, PyOSError, PyTypeError};
use pyo3::prelude::*;

use crate::CoreError;

pyo3::import_exception!(rlx_lm.errors, InternalError);
pyo3::import_exception!(rlx_lm.errors, InvalidLogitsError);
pyo3::import_exception!(rlx_lm.errors, DtypeError);
pyo3::import_exception!(rlx_lm.errors, TokenOutOfRangeError);
pyo3::import_exception!(rlx_lm.errors, InvalidOptionError);
pyo3::import_exception!(rlx_lm.errors, ShapeError);
pyo3::import_exception!(rlx_lm.errors, CapacityError);
pyo3::import_exception!(rlx_lm.errors, SnapshotMismatchError);
pyo3::import_exception!(rlx_lm.errors, WeightFormatError);
pyo3::import_exception!(rlx_lm.errors, UnsupportedError);
pyo3::import_exception!(rlx_lm.errors, SequenceStateError);

/// Convert a core error into the matching `rlx_lm.errors` exception.
pub fn to_py(err: CoreError) -> PyErr {
    let msg = err.to_string();
    match err {
        CoreError::Internal(_) => InternalError::new_err(msg),
        CoreError::EmptyLogits | CoreError::NanLogit { .. } | CoreError::AllBanned => {
            InvalidLogitsError::new_err(msg)
        }
        CoreError::TokenOutOfRange { .. } | CoreError::TokenId(_) => {
            TokenOutOfRangeError::new_err(msg)
        }
        CoreError::SequenceState(_) => SequenceStateError::new_err(msg),
        CoreError::InvalidOption { .. } => InvalidOptionError::new_err(msg),
        CoreError::Shape(_) => ShapeError::new_err(msg),
        CoreError::Capacity { .. } => CapacityError::new_err(msg),
        CoreError::SnapshotMismatch(_) => SnapshotMismatchError::new_err(msg),
        CoreError::Format(_) => WeightFormatError::new_err(msg),
        CoreError::Unsupported(_) => UnsupportedError::new_err(msg),
        CoreError::Dtype(_) => DtypeError::new_err(msg),
        CoreError::Type(_) => PyTypeError::new_err(msg),
        CoreError::Io(_) => PyOSError::new_err(msg),
        CoreError::OutOfMemory(_) => PyMemoryError::new_err(msg),
    }
}

/// Extension to turn a `CoreResult` into a `PyResult` with `?`.
pub trait IntoPyResult<T> {
    /// Map the error through [`to_py`].
    fn py(self) -> PyResult<T>;
}

impl<T> IntoPyResult<T> for crate::CoreResult<T> {
    fn py(self) -> PyResult<T> {
        self.map_err(to_py)
    }
}

/// Run a binding's body, turning a panic into `rlx_lm.errors.InternalError`
/// (through [`to_py`]) instead of PyO3's `PanicException`, which derives
/// from `BaseException` and so escapes `except Exception`. Every entry point
/// of the binding runs its body through this.
pub fn catch_panics<T>(f: impl FnOnce() -> PyResult<T>) -> PyResult<T> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(payload) => {
            let msg = payload
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic with no message".to_owned());
            Err(to_py(CoreError::Internal(msg)))
        }
    }
}

/// Panics on purpose, inside [`catch_panics`]: lets the tests check that a
/// panic in the core reaches Python as `InternalError`, not `PanicException`.
#[pyfunction]
pub fn _panic_for_tests(message: &str) -> PyResult<()> {
    catch_panics(|| panic!("{message}"))
}
