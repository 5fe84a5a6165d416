//! `rlx_lm._core.quant_matmul` and `quant_rows`: GGUF weights used in place
//! (see `crate::quant`).
//!
//! Inputs are borrowed, not copied: each array is checked (type, dtype,
//! rank, layout) with a typed error naming the fix, borrowed read-only, and
//! pinned (`super::gil::pin`) while the GIL is released, so numpy refuses to
//! resize (free) its buffer until the call returns.

use std::sync::{Arc, Mutex};

use numpy::ndarray::Dimension;
use numpy::{Element, PyArray1, PyArray2, PyArrayMethods, PyReadonlyArray, PyUntypedArrayMethods};
use pyo3::prelude::*;

use super::arrays::borrow;
use super::errors::{catch_panics, IntoPyResult};
use super::gil::{detached, pin, Pin};
use crate::engine::Activations;
use crate::per_process::PerProcess;
use crate::quant::{self, QuantType};
use crate::CoreError;

/// The borrowed slice of a checked array, and its pin for a detached call.
fn pinned<'a, 'py, T: Element, D: Dimension>(
    arr: &'a PyReadonlyArray<'py, T, D>,
) -> PyResult<(&'a [T], Pin<'py>)> {
    let held = pin(arr.as_any())?;
    let slice = arr
        .as_slice()
        .map_err(|e| CoreError::Dtype(e.to_string()))
        .py()?;
    Ok((slice, held))
}

/// A zeroed output of `len` floats, or `MemoryError` (never an abort).
fn output(len: Option<usize>) -> PyResult<Vec<f32>> {
    let mut v = Vec::new();
    len.and_then(|len| v.try_reserve_exact(len).ok().map(|()| len))
        .map(|len| {
            v.resize(len, 0.0);
            v
        })
        .ok_or_else(|| CoreError::OutOfMemory("the result does not fit in memory".into()))
        .py()
}

/// Pools by thread count.
type Pools = Mutex<Vec<(usize, Arc<rayon::ThreadPool>)>>;

/// Pools built for an explicit `threads` argument, kept for reuse (per
/// process: a forked child makes its own).
fn pool(threads: usize) -> PyResult<Arc<rayon::ThreadPool>> {
    static POOLS: PerProcess<Pools> = PerProcess::new();
    let pools = POOLS.get(|| Ok(Mutex::default())).py()?;
    let mut pools = pools.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, p)) = pools.iter().find(|(t, _)| *t == threads) {
        return Ok(Arc::clone(p));
    }
    let p = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .map_err(|e| CoreError::OutOfMemory(format!("cannot start {threads} threads: {e}")))
        .py()?;
    let p = Arc::new(p);
    pools.push((threads, Arc::clone(&p)));
    Ok(p)
}

/// The checked weight: format, row count and the raw bytes (a whole number
/// of `cols`-value rows).
fn weight(raw: &[u8], rows: usize, qtype: u32, cols: usize) -> PyResult<QuantType> {
    let qtype = QuantType::from_ggml(qtype).py()?;
    let rb = qtype.row_bytes(cols).py()?;
    if rows.checked_mul(rb) != Some(raw.len()) {
        return Err(CoreError::Shape(format!(
            "{} bytes of {} data do not hold {rows} rows of {cols} values ({rb} bytes a row)",
            raw.len(),
            qtype.name()
        )))
        .py();
    }
    Ok(qtype)
}

/// `x @ W.T` for `W` stored as GGUF blocks: `raw` is `[rows, row_bytes]`
/// uint8, `qtype` the ggml type id, `x` float32 `[n, cols]`; float32
/// `[n, rows]`. `threads` runs it on a pool of that many threads (1: on the
/// calling thread; default: the process's shared pool). `activations="q8"`
/// quantises `x` to 8 bits first (`crate::quant::q8`, the fast mode).
#[pyfunction]
#[pyo3(signature = (raw, qtype, cols, x, *, threads = None, activations = "exact"))]
#[allow(clippy::too_many_arguments)]
pub fn quant_matmul<'py>(
    py: Python<'py>,
    raw: &Bound<'py, PyAny>,
    qtype: u32,
    cols: usize,
    x: &Bound<'py, PyAny>,
    threads: Option<usize>,
    activations: &str,
) -> PyResult<Bound<'py, PyArray2<f32>>> {
    catch_panics(|| {
        let fast = Activations::from_name(activations).py()? == Activations::Q8;
        let raw = borrow::<u8, numpy::Ix2>(raw, "raw", "uint8")?;
        let x = borrow::<f32, numpy::Ix2>(x, "x", "float32")?;
        let (rows, (n, xc)) = (raw.shape()[0], (x.shape()[0], x.shape()[1]));
        let (raw_s, raw_pin) = pinned(&raw)?;
        let qtype = weight(raw_s, rows, qtype, cols)?;
        if xc != cols {
            return Err(CoreError::Shape(format!(
                "activations have {xc} columns, the weight has {cols}"
            )))
            .py();
        }
        let (x_s, x_pin) = pinned(&x)?;
        let mut out = output(n.checked_mul(rows))?;
        let pool = match threads {
            Some(1) => None,
            Some(t) => Some(pool(t)?),
            None => Some(crate::per_process::shared_pool().py()?),
        };
        detached(py, &[&raw_pin, &x_pin], || {
            let mut go = |parallel| {
                if fast {
                    quant::q8::matmul_parallel(parallel, qtype, raw_s, rows, cols, x_s, &mut out)
                } else if parallel {
                    quant::matmul(qtype, raw_s, rows, cols, x_s, &mut out)
                } else {
                    quant::matmul_serial(qtype, raw_s, rows, cols, x_s, &mut out)
                }
            };
            match &pool {
                Some(p) => p.install(|| go(true)),
                None => go(false),
            }
        })
        .py()?;
        PyArray1::from_vec(py, out).reshape([n, rows])
    })
}

/// The dequantised rows `ids` of a GGUF block-quantised `W`; float32 `[len(ids), cols]`.
#[pyfunction]
pub fn quant_rows<'py>(
    py: Python<'py>,
    raw: &Bound<'py, PyAny>,
    qtype: u32,
    cols: usize,
    ids: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyArray2<f32>>> {
    catch_panics(|| {
        let raw = borrow::<u8, numpy::Ix2>(raw, "raw", "uint8")?;
        let ids = borrow::<i64, numpy::Ix1>(ids, "ids", "int64")?;
        let rows = raw.shape()[0];
        let (raw_s, raw_pin) = pinned(&raw)?;
        let qtype = weight(raw_s, rows, qtype, cols)?;
        let (ids_s, ids_pin) = pinned(&ids)?;
        let mut out = output(ids_s.len().checked_mul(cols))?;
        detached(py, &[&raw_pin, &ids_pin], || {
            quant::gather_rows(qtype, raw_s, rows, cols, ids_s, &mut out)
        })
        .py()?;
        PyArray1::from_vec(py, out).reshape([ids_s.len(), cols])
    })
}

/// The kernel build this process runs: `"avx512"`, `"avx2"`, `"neon"` or
/// `"portable"` (the widest the CPU has, or a narrower one named by `RLX_SIMD`).
#[pyfunction]
pub fn quant_simd() -> PyResult<&'static str> {
    catch_panics(|| Ok(quant::simd_name()))
}
