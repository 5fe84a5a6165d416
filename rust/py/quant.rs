//! `rlx_lm._core.quant_matmul` and `quant_rows`: GGUF block-quantised
//! weights used in place (see `crate::quant`).

use numpy::{PyArray2, PyArrayMethods, PyReadonlyArray1, PyReadonlyArray2, PyUntypedArrayMethods};
use pyo3::prelude::*;

use super::errors::{IntoPyResult, ShapeError};
use crate::quant::{self, QuantType};

/// The checked weight arguments: format, row count and the raw bytes.
fn weight<'a>(
    raw: &'a PyReadonlyArray2<'_, u8>,
    qtype: u32,
) -> PyResult<(QuantType, usize, &'a [u8])> {
    let qtype = QuantType::from_ggml(qtype).py()?;
    Ok((qtype, raw.shape()[0], contiguous(raw, "raw")?))
}

fn contiguous<'a, T: numpy::Element>(
    a: &'a PyReadonlyArray2<'_, T>,
    what: &str,
) -> PyResult<&'a [T]> {
    a.as_slice().map_err(|_| {
        ShapeError::new_err(format!(
            "{what} must be C-contiguous (np.ascontiguousarray)"
        ))
    })
}

/// `x @ W.T` for `W` stored as GGUF blocks: `raw` is `[rows, row_bytes]`
/// uint8, `qtype` the ggml type id, `x` float32 `[n, cols]`; float32 `[n, rows]`.
#[pyfunction]
pub fn quant_matmul<'py>(
    py: Python<'py>,
    raw: PyReadonlyArray2<'py, u8>,
    qtype: u32,
    cols: usize,
    x: PyReadonlyArray2<'py, f32>,
) -> PyResult<Bound<'py, PyArray2<f32>>> {
    let (qtype, rows, raw_s) = weight(&raw, qtype)?;
    let (n, xc) = (x.shape()[0], x.shape()[1]);
    if xc != cols {
        return Err(ShapeError::new_err(format!(
            "activations have {xc} columns, the weight has {cols}"
        )));
    }
    let x_s = contiguous(&x, "x")?;
    let out = py
        .detach(|| {
            let mut out = vec![0.0f32; n * rows];
            quant::matmul(qtype, raw_s, rows, cols, x_s, &mut out).map(|()| out)
        })
        .py()?;
    numpy::PyArray1::from_vec(py, out).reshape([n, rows])
}

/// The dequantised rows `ids` of a GGUF block-quantised `W`; float32 `[len(ids), cols]`.
#[pyfunction]
pub fn quant_rows<'py>(
    py: Python<'py>,
    raw: PyReadonlyArray2<'py, u8>,
    qtype: u32,
    cols: usize,
    ids: PyReadonlyArray1<'py, i64>,
) -> PyResult<Bound<'py, PyArray2<f32>>> {
    let (qtype, rows, raw_s) = weight(&raw, qtype)?;
    let ids = ids
        .as_slice()
        .map_err(|_| ShapeError::new_err("ids must be contiguous"))?;
    let mut out = vec![0.0f32; ids.len() * cols];
    quant::gather_rows(qtype, raw_s, rows, cols, ids, &mut out).py()?;
    numpy::PyArray1::from_vec(py, out).reshape([ids.len(), cols])
}
