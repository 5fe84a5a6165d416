//! Releasing the GIL: the one helper every binding uses ([`detached`]), and
//! the pins that keep the numpy arrays a detached call reads alive.

use pyo3::marker::Ungil;
use pyo3::prelude::*;
use pyo3::types::PyWeakrefReference;

/// Numpy arrays pinned for a detached call: a strong and a weak reference to
/// the array and to every array it is a view of (its `.base` chain).
///
/// The strong reference keeps the memory alive; the weak reference makes
/// numpy refuse `ndarray.resize` on any of them, even with `refcheck=False`
/// ("cannot resize an array that references or is referenced by another
/// object"), which would otherwise free the buffer under the detached call.
pub struct Pin<'py> {
    _arrays: Vec<Bound<'py, PyAny>>,
    _weak: Vec<Bound<'py, PyWeakrefReference>>,
}

/// Pin `obj` (a numpy array already checked by the caller) and its bases.
pub fn pin<'py>(obj: &Bound<'py, PyAny>) -> PyResult<Pin<'py>> {
    let mut arrays = Vec::new();
    let mut weak = Vec::new();
    let mut cur = Some(obj.clone());
    // A view chain is short; the bound only guards against a cycle.
    for _ in 0..64 {
        let Some(a) = cur.take() else { break };
        if a.cast::<numpy::PyUntypedArray>().is_err() {
            // A non-array base (bytes, mmap, a buffer exporter) cannot be
            // freed while numpy holds its buffer export.
            arrays.push(a);
            break;
        }
        weak.push(PyWeakrefReference::new(&a)?);
        let base = a.getattr(pyo3::intern!(a.py(), "base"))?;
        arrays.push(a);
        cur = (!base.is_none()).then_some(base);
    }
    Ok(Pin {
        _arrays: arrays,
        _weak: weak,
    })
}

/// Run `f` with the GIL released, so other Python threads run meanwhile.
///
/// **The rule.** A detached call may read only memory that nothing can free
/// or move while it runs: Rust-owned buffers, or numpy arrays that the caller
/// has checked, borrowed (a `PyReadonlyArray` held across the call) and
/// pinned with [`pin`], listed in `pins` so the rule is visible at every call
/// site. Pinned arrays cannot be resized (numpy refuses while a weak reference
/// exists), and their memory stays alive. What pinning cannot stop is other
/// threads *writing* the values (or replacing the buffer with the raw
/// `ndarray.__setstate__`): a caller that mutates an array while a call
/// reads it gets a result computed from a mix of old and new values, a race
/// of its own making. A detached call never touches Python objects, never
/// writes into a caller's array, and must not panic past this helper (the
/// bindings catch panics at their boundary, [`super::errors::catch_panics`]).
pub fn detached<T, F>(py: Python<'_>, pins: &[&Pin<'_>], f: F) -> T
where
    F: Ungil + FnOnce() -> T,
    T: Ungil,
{
    let _held = pins;
    py.detach(f)
}
