//! `rlx_lm.KvCache` and `rlx_lm.KvSnapshot`: the core cache with numpy views.

use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::sync::Arc;

use numpy::npyffi::{self, PY_ARRAY_API};
use numpy::{
    PyArray3, PyArrayDescr, PyArrayDescrMethods, PyArrayMethods, PyReadonlyArray3, PyUntypedArray,
    PyUntypedArrayMethods,
};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple};

use super::errors::{catch_panics, IntoPyResult};
use super::gil::detached;
use crate::kv::{self, Claim, Dtype, Geometry, Half};
use crate::{CoreError, CoreResult};

/// Keeps the rows a numpy view shows alive and unchanged (its `base`).
#[pyclass(frozen, module = "rlx_lm._core", name = "_KvRows")]
pub struct KvRows {
    _claim: Claim,
}

fn parse_dtype(obj: &Bound<'_, PyAny>) -> PyResult<Dtype> {
    let name = match obj.extract::<String>() {
        Ok(s) => s,
        Err(_) => {
            let numpy = obj.py().import("numpy")?;
            numpy
                .call_method1("dtype", (obj,))?
                .getattr("name")?
                .extract()?
        }
    };
    Dtype::parse(&name).py()
}

fn index(value: i64, field: &str) -> PyResult<usize> {
    usize::try_from(value)
        .map_err(|_| CoreError::option(field, format!("must be non-negative, got {value}")))
        .py()
}

/// Borrow a 3-D float32 array (any strides) with typed errors.
fn f32_rows<'py>(obj: &Bound<'py, PyAny>, what: &str) -> PyResult<PyReadonlyArray3<'py, f32>> {
    let Ok(untyped) = obj.cast::<PyUntypedArray>() else {
        return Err(CoreError::Dtype(format!(
            "{what} must be a numpy float32 array of shape [n_kv_heads, n_new, head_dim]; \
             convert with np.asarray(x, dtype=np.float32)"
        )))
        .py();
    };
    if untyped.ndim() != 3 {
        return Err(CoreError::Shape(format!(
            "{what} must be 3-D [n_kv_heads, n_new, head_dim], got shape {:?}",
            untyped.shape()
        )))
        .py();
    }
    let Ok(arr) = obj.cast::<PyArray3<f32>>() else {
        return Err(CoreError::Dtype(format!(
            "{what} must have dtype float32, got {}; convert with x.astype(np.float32)",
            untyped.dtype()
        )))
        .py();
    };
    Ok(arr.readonly())
}

/// A read-only `[n_kv_heads, len, head_dim]` numpy view of one half of the
/// claimed rows, owning the claim through its `base`.
fn rows_view<'py>(
    py: Python<'py>,
    geometry: Geometry,
    claim: Option<Claim>,
    half: Half,
) -> PyResult<Bound<'py, PyAny>> {
    let descr = match geometry.dtype {
        Dtype::F32 => PyArrayDescr::of::<f32>(py),
        Dtype::F16 => PyArrayDescr::new(py, "float16")?,
    };
    let (h, d) = (geometry.n_kv_heads, geometry.head_dim);
    let Some(claim) = claim.filter(|c| !c.is_empty()) else {
        let numpy = py.import("numpy")?;
        let empty = numpy.call_method1("empty", ((h, 0, d), descr))?;
        empty.call_method1("setflags", (false,))?;
        return Ok(empty);
    };
    let mut dims: [npyffi::npy_intp; 3] = [h as _, claim.len() as _, d as _];
    let [s0, s1, s2] = claim.slab().strides();
    let mut strides: [npyffi::npy_intp; 3] = [s0 as _, s1 as _, s2 as _];
    let data = claim.slab().row_ptr(half, 0, 0);
    let owner = Bound::new(py, KvRows { _claim: claim })?;
    // SAFETY: `data` with these dims and strides stays inside the slab; the
    // owner keeps the slab alive and its claim keeps the rows unchanged. The
    // array is created read-only (flags 0) so Python cannot write shared rows.
    unsafe {
        let array = PY_ARRAY_API.PyArray_NewFromDescr(
            py,
            npyffi::get_type_object(py, npyffi::NpyTypes::PyArray_Type),
            descr.into_dtype_ptr(),
            3,
            dims.as_mut_ptr(),
            strides.as_mut_ptr(),
            data.cast(),
            0,
            std::ptr::null_mut(),
        );
        if array.is_null() {
            return Err(PyErr::fetch(py));
        }
        let array = Bound::from_owned_ptr(py, array);
        if PY_ARRAY_API.PyArray_SetBaseObject(py, array.as_ptr().cast(), owner.into_ptr()) != 0 {
            return Err(PyErr::fetch(py));
        }
        Ok(array)
    }
}

/// Per-layer key/value cache for attention, with cheap snapshots.
#[pyclass(module = "rlx_lm._core", name = "KvCache")]
pub struct PyKvCache {
    pub(crate) inner: kv::KvCache,
}

#[pymethods]
impl PyKvCache {
    #[new]
    #[pyo3(signature = (*, n_layers, n_kv_heads, head_dim, max_seq, dtype = None))]
    fn new(
        n_layers: i64,
        n_kv_heads: i64,
        head_dim: i64,
        max_seq: i64,
        dtype: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        catch_panics(|| {
            let dtype = match dtype {
                Some(obj) => parse_dtype(obj)?,
                None => Dtype::F32,
            };
            let geometry = Geometry {
                n_layers: index(n_layers, "n_layers")?,
                n_kv_heads: index(n_kv_heads, "n_kv_heads")?,
                head_dim: index(head_dim, "head_dim")?,
                dtype,
            };
            let inner = kv::KvCache::new(geometry, index(max_seq, "max_seq")?).py()?;
            Ok(Self { inner })
        })
    }

    /// Append rows `k`, `v` (float32 `[n_kv_heads, n_new, head_dim]`) to one layer.
    fn append(&mut self, layer: i64, k: &Bound<'_, PyAny>, v: &Bound<'_, PyAny>) -> PyResult<()> {
        catch_panics(|| {
            let layer = index(layer, "layer")?;
            let k = f32_rows(k, "k")?;
            let v = f32_rows(v, "v")?;
            self.inner.append(layer, k.as_array(), v.as_array()).py()
        })
    }

    /// The keys of one layer as a read-only view `[n_kv_heads, len, head_dim]`.
    fn keys<'py>(&self, py: Python<'py>, layer: i64) -> PyResult<Bound<'py, PyAny>> {
        catch_panics(|| {
            let claim = self.inner.claim_layer(index(layer, "layer")?).py()?;
            rows_view(py, self.inner.geometry(), claim, Half::Keys)
        })
    }

    /// The values of one layer as a read-only view `[n_kv_heads, len, head_dim]`.
    fn values<'py>(&self, py: Python<'py>, layer: i64) -> PyResult<Bound<'py, PyAny>> {
        catch_panics(|| {
            let claim = self.inner.claim_layer(index(layer, "layer")?).py()?;
            rows_view(py, self.inner.geometry(), claim, Half::Values)
        })
    }

    /// Keep the first `n` tokens (at most `len()`).
    fn truncate(&mut self, n: i64) -> PyResult<()> {
        catch_panics(|| self.inner.truncate(index(n, "n")?).py())
    }

    /// Drop every token.
    fn clear(&mut self) -> PyResult<()> {
        catch_panics(|| {
            self.inner.clear();
            Ok(())
        })
    }

    /// Freeze the current contents; costs one reference per layer, copies nothing.
    fn snapshot(&self) -> PyResult<PyKvSnapshot> {
        catch_panics(|| {
            Ok(PyKvSnapshot {
                inner: Arc::new(self.inner.snapshot().py()?),
            })
        })
    }

    /// Replace the contents with a snapshot's; copies nothing.
    fn restore(&mut self, snapshot: &Bound<'_, PyAny>) -> PyResult<()> {
        catch_panics(|| {
            let Ok(snap) = snapshot.cast::<PyKvSnapshot>() else {
                return Err(CoreError::Type(format!(
                    "restore needs a KvSnapshot, got {}",
                    snapshot.get_type().name()?
                )))
                .py();
            };
            self.inner.restore(&snap.get().inner).py()
        })
    }

    /// Tokens every layer holds.
    fn len(&self) -> PyResult<usize> {
        catch_panics(|| Ok(self.inner.len()))
    }

    /// `len(cache)`: tokens every layer holds.
    fn __len__(&self) -> PyResult<usize> {
        catch_panics(|| Ok(self.inner.len()))
    }

    /// Tokens held by one layer (differs from `len()` only mid forward pass).
    fn layer_len(&self, layer: i64) -> PyResult<usize> {
        catch_panics(|| self.inner.layer_len(index(layer, "layer")?).py())
    }

    /// Bytes of the stored rows (keys and values, all layers).
    #[getter]
    fn nbytes(&self) -> PyResult<usize> {
        catch_panics(|| Ok(self.inner.nbytes()))
    }

    /// Number of layers.
    #[getter]
    fn n_layers(&self) -> PyResult<usize> {
        catch_panics(|| Ok(self.inner.geometry().n_layers))
    }

    /// Key/value heads per layer.
    #[getter]
    fn n_kv_heads(&self) -> PyResult<usize> {
        catch_panics(|| Ok(self.inner.geometry().n_kv_heads))
    }

    /// Elements per head.
    #[getter]
    fn head_dim(&self) -> PyResult<usize> {
        catch_panics(|| Ok(self.inner.geometry().head_dim))
    }

    /// Tokens each layer can hold.
    #[getter]
    fn max_seq(&self) -> PyResult<usize> {
        catch_panics(|| Ok(self.inner.max_seq()))
    }

    /// Storage dtype name, "float32" or "float16".
    #[getter]
    fn dtype(&self) -> PyResult<&'static str> {
        catch_panics(|| Ok(self.inner.geometry().dtype.name()))
    }

    fn __repr__(&self) -> PyResult<String> {
        catch_panics(|| {
            let g = self.inner.geometry();
            Ok(format!(
                "KvCache(n_layers={}, n_kv_heads={}, head_dim={}, max_seq={}, dtype='{}', len={})",
                g.n_layers,
                g.n_kv_heads,
                g.head_dim,
                self.inner.max_seq(),
                g.dtype.name(),
                self.inner.len()
            ))
        })
    }
}

/// An immutable copy-on-write snapshot of a KvCache.
#[pyclass(frozen, module = "rlx_lm._core", name = "KvSnapshot")]
pub struct PyKvSnapshot {
    pub(crate) inner: Arc<kv::KvSnapshot>,
}

#[pymethods]
impl PyKvSnapshot {
    /// Tokens held.
    fn len(&self) -> PyResult<usize> {
        catch_panics(|| Ok(self.inner.len()))
    }

    /// `len(snapshot)`: tokens held.
    fn __len__(&self) -> PyResult<usize> {
        catch_panics(|| Ok(self.inner.len()))
    }

    /// The keys of one layer as a read-only view `[n_kv_heads, len, head_dim]`.
    fn keys<'py>(&self, py: Python<'py>, layer: i64) -> PyResult<Bound<'py, PyAny>> {
        catch_panics(|| {
            let claim = self.inner.claim_layer(index(layer, "layer")?).py()?;
            rows_view(py, self.inner.geometry(), claim, Half::Keys)
        })
    }

    /// The values of one layer as a read-only view `[n_kv_heads, len, head_dim]`.
    fn values<'py>(&self, py: Python<'py>, layer: i64) -> PyResult<Bound<'py, PyAny>> {
        catch_panics(|| {
            let claim = self.inner.claim_layer(index(layer, "layer")?).py()?;
            rows_view(py, self.inner.geometry(), claim, Half::Values)
        })
    }

    /// Bytes of the rows held (keys and values, all layers).
    #[getter]
    fn nbytes(&self) -> PyResult<usize> {
        catch_panics(|| Ok(self.inner.nbytes()))
    }

    /// Number of layers.
    #[getter]
    fn n_layers(&self) -> PyResult<usize> {
        catch_panics(|| Ok(self.inner.geometry().n_layers))
    }

    /// Key/value heads per layer.
    #[getter]
    fn n_kv_heads(&self) -> PyResult<usize> {
        catch_panics(|| Ok(self.inner.geometry().n_kv_heads))
    }

    /// Elements per head.
    #[getter]
    fn head_dim(&self) -> PyResult<usize> {
        catch_panics(|| Ok(self.inner.geometry().head_dim))
    }

    /// Capacity of the cache the snapshot was taken from.
    #[getter]
    fn max_seq(&self) -> PyResult<usize> {
        catch_panics(|| Ok(self.inner.max_seq()))
    }

    /// Storage dtype name, "float32" or "float16".
    #[getter]
    fn dtype(&self) -> PyResult<&'static str> {
        catch_panics(|| Ok(self.inner.geometry().dtype.name()))
    }

    /// Shared storage pinned, as `(storage_id, blocks, block_bytes)` per layer.
    fn storage(&self) -> PyResult<Vec<(u64, usize, usize)>> {
        catch_panics(|| {
            Ok(self
                .inner
                .storage()
                .into_iter()
                .map(|u| (u.slab, u.blocks, u.block_bytes))
                .collect())
        })
    }

    /// The first `n` tokens, sharing these rows (no copy).
    fn prefix(&self, n: i64) -> PyResult<Self> {
        catch_panics(|| {
            Ok(Self {
                inner: Arc::new(self.inner.prefix(index(n, "n")?).py()?),
            })
        })
    }

    /// Write the raw tensors (layer-major, keys then values) at byte `offset`
    /// of the open file `fd` (the caller keeps it open during the call).
    fn _write_data(&self, py: Python<'_>, fd: i32, offset: u64) -> PyResult<()> {
        catch_panics(|| {
            let file = dup_fd(fd).py()?;
            let inner = Arc::clone(&self.inner);
            detached(py, &[], move || -> CoreResult<()> {
                let mut out = BufWriter::with_capacity(1 << 20, At { file, pos: offset });
                inner.write_data(&mut out)?;
                out.flush().map_err(|e| CoreError::Io(e.to_string()))
            })
            .py()
        })
    }

    /// Read tensors written by `_write_data` from the open file `fd` at byte
    /// `offset` (the caller keeps it open during the call).
    #[staticmethod]
    #[allow(clippy::too_many_arguments)]
    fn _read_data(
        py: Python<'_>,
        fd: i32,
        offset: u64,
        n_layers: i64,
        n_kv_heads: i64,
        head_dim: i64,
        dtype: &Bound<'_, PyAny>,
        max_seq: i64,
        len: i64,
    ) -> PyResult<Self> {
        catch_panics(|| {
            let geometry = Geometry {
                n_layers: index(n_layers, "n_layers")?,
                n_kv_heads: index(n_kv_heads, "n_kv_heads")?,
                head_dim: index(head_dim, "head_dim")?,
                dtype: parse_dtype(dtype)?,
            };
            let (max_seq, len) = (index(max_seq, "max_seq")?, index(len, "len")?);
            let file = dup_fd(fd).py()?;
            let snap = detached(py, &[], move || {
                kv::KvSnapshot::read_data(geometry, max_seq, len, &mut At { file, pos: offset })
            })
            .py()?;
            Ok(Self {
                inner: Arc::new(snap),
            })
        })
    }

    /// Snapshots are immutable: a copy is the snapshot itself.
    fn __copy__(slf: Py<Self>) -> PyResult<Py<Self>> {
        catch_panics(|| Ok(slf))
    }

    /// Snapshots are immutable: a deep copy is the snapshot itself.
    fn __deepcopy__(slf: Py<Self>, _memo: &Bound<'_, PyAny>) -> PyResult<Py<Self>> {
        catch_panics(|| Ok(slf))
    }

    fn __reduce__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        catch_panics(|| {
            let inner = &self.inner;
            let state = PyBytes::new_with(py, inner.state_len(), |buf| {
                let mut out: &mut [u8] = buf;
                inner.write_state(&mut out).py()
            })?;
            let rebuild = py
                .import("rlx_lm._core")?
                .getattr("_kv_snapshot_from_state")?;
            PyTuple::new(py, [rebuild, PyTuple::new(py, [state])?.into_any()])
        })
    }

    fn __repr__(&self) -> PyResult<String> {
        catch_panics(|| {
            let g = self.inner.geometry();
            Ok(format!(
                "KvSnapshot(n_layers={}, n_kv_heads={}, head_dim={}, dtype='{}', len={})",
                g.n_layers,
                g.n_kv_heads,
                g.head_dim,
                g.dtype.name(),
                self.inner.len()
            ))
        })
    }
}

/// Rebuild a KvSnapshot from its pickled state.
#[pyfunction]
pub fn _kv_snapshot_from_state(state: &[u8]) -> PyResult<PyKvSnapshot> {
    catch_panics(|| {
        Ok(PyKvSnapshot {
            inner: Arc::new(kv::KvSnapshot::from_state(state).py()?),
        })
    })
}

/// A duplicate of the caller's open file descriptor, so a detached read or
/// write never depends on the Python file object (which may be closed by
/// another thread meanwhile) and the file is the one the caller opened.
#[cfg(unix)]
fn dup_fd(fd: i32) -> CoreResult<File> {
    use std::os::fd::BorrowedFd;
    if fd < 0 {
        return Err(CoreError::option(
            "fd",
            format!("must be an open file descriptor, got {fd}"),
        ));
    }
    // SAFETY: the descriptor is only duplicated here, while the caller (holding
    // the GIL) keeps its file open; a closed descriptor makes dup fail (EBADF).
    let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
    borrowed
        .try_clone_to_owned()
        .map(File::from)
        .map_err(|e| CoreError::Io(format!("file descriptor {fd}: {e}")))
}

#[cfg(not(unix))]
fn dup_fd(_fd: i32) -> CoreResult<File> {
    Err(CoreError::Io(
        "snapshot files are read and written through file descriptors on unix only".into(),
    ))
}

/// Positioned reads and writes (pread/pwrite): the shared file offset is never used.
struct At {
    file: File,
    pos: u64,
}

#[cfg(unix)]
impl Read for At {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        use std::os::unix::fs::FileExt;
        let n = self.file.read_at(buf, self.pos)?;
        self.pos += n as u64;
        Ok(n)
    }
}

#[cfg(unix)]
impl Write for At {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        use std::os::unix::fs::FileExt;
        let n = self.file.write_at(buf, self.pos)?;
        self.pos += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(not(unix))]
impl Read for At {
    fn read(&mut self, _buf: &mut [u8]) -> std::io::Result<usize> {
        Err(std::io::Error::other("unsupported platform"))
    }
}

#[cfg(not(unix))]
impl Write for At {
    fn write(&mut self, _buf: &[u8]) -> std::io::Result<usize> {
        Err(std::io::Error::other("unsupported platform"))
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
