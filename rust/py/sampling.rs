//! `rlx_lm.SamplerChain` and `rlx_lm.SampleResult`: the sampler chain over
//! numpy rows, with the batch path running rows in parallel off the GIL.

use numpy::{
    PyArray1, PyArray2, PyArrayMethods, PyReadonlyArray2, PyUntypedArray, PyUntypedArrayMethods,
};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyByteArray, PyBytes, PyDict, PyFloat, PyMemoryView, PyString, PyTuple};

use super::arrays::{f32_row, refuse_masked};
use super::errors::{catch_panics, to_py, IntoPyResult};
use super::gil::{detached, pin};
use crate::sampling::batch::Batch;
use crate::sampling::chain::{
    ChainState, History, Knobs, LogprobMode, OrderSpec, Sampled, SamplerChain, Selector,
};
use crate::sampling::handle::ChainHandle;
use crate::sampling::knobs::{Bound as End, Kind, Value, KNOBS};
use crate::sampling::order::{preset_order, PRESETS};
use crate::sampling::stages::{MinKeep, STAGES};
use crate::CoreError;

// Every exception goes through the one mapping (`errors::to_py`).
fn bad(field: &str, reason: impl std::fmt::Display) -> PyErr {
    to_py(CoreError::option(field, reason.to_string()))
}

fn dtype_err(msg: impl Into<String>) -> PyErr {
    to_py(CoreError::Dtype(msg.into()))
}

fn shape_err(msg: impl Into<String>) -> PyErr {
    to_py(CoreError::Shape(msg.into()))
}

fn token_err(msg: impl Into<String>) -> PyErr {
    to_py(CoreError::TokenId(msg.into()))
}

/// The attribute `field` of an options object; a missing one is refused by name
/// (not Python's bare `AttributeError`), saying what the chain expects.
fn knob<'py>(opts: &Bound<'py, PyAny>, field: &str) -> PyResult<Bound<'py, PyAny>> {
    opts.getattr(field).map_err(|e| {
        if !e.is_instance_of::<pyo3::exceptions::PyAttributeError>(opts.py()) {
            return e; // a property that raised: its own error, untouched
        }
        bad(
            field,
            format!(
                "missing (the {} passed has no such attribute); pass a SampleOpts",
                describe(opts)
            ),
        )
    })
}

/// A Python number (never a bool) as given.
fn number(obj: &Bound<'_, PyAny>) -> Value {
    if obj.is_instance_of::<PyBool>() {
        return Value::Other("bool".to_owned());
    }
    obj.extract::<f64>()
        .map_or_else(|_| Value::Other(describe(obj)), Value::Float)
}

/// A Python integer (never a bool or a float) as given.
fn integer(obj: &Bound<'_, PyAny>) -> Value {
    if obj.is_instance_of::<PyBool>() || obj.is_instance_of::<PyFloat>() {
        return Value::Other(describe(obj));
    }
    if let Ok(v) = obj.extract::<i64>() {
        return Value::Int(v.into());
    }
    obj.extract::<u64>()
        .map_or_else(|_| Value::Other(describe(obj)), |v| Value::Int(v.into()))
}

/// One knob's Python value as the core's [`Value`]; the core checks it.
fn value_of(obj: &Bound<'_, PyAny>, kind: Kind) -> PyResult<Value> {
    if obj.is_none() {
        return Ok(Value::None);
    }
    Ok(match kind {
        Kind::Float => number(obj),
        Kind::Int | Kind::OptInt | Kind::Mode | Kind::Seed => integer(obj),
        Kind::Pair => match obj.extract::<(Bound<'_, PyAny>, Bound<'_, PyAny>)>() {
            Ok((a, b)) => match (number(&a), number(&b)) {
                (Value::Float(lo), Value::Float(hi)) => Value::Pair(lo, hi),
                (Value::Other(t), _) | (_, Value::Other(t)) => {
                    Value::Other(format!("a pair holding {t}"))
                }
                _ => Value::Other(describe(obj)),
            },
            Err(_) => Value::Other(describe(obj)),
        },
        Kind::Tokens => {
            let Ok(items) = obj.try_iter() else {
                return Ok(Value::Other(describe(obj)));
            };
            if obj.is_instance_of::<PyString>() || obj.is_instance_of::<PyBytes>() {
                return Ok(Value::Other(describe(obj)));
            }
            let mut out = Vec::new();
            for item in items {
                match integer(&item?) {
                    Value::Int(t) => out.push(t),
                    other => return Ok(other),
                }
            }
            Value::Tokens(out)
        }
        Kind::Bias => {
            let Ok(items) = obj.call_method0("items") else {
                return Ok(Value::Other(describe(obj)));
            };
            let mut out = Vec::new();
            for item in items.try_iter()? {
                let (t, b): (Bound<'_, PyAny>, Bound<'_, PyAny>) = item?.extract()?;
                match (integer(&t), number(&b)) {
                    (Value::Int(t), Value::Float(b)) => out.push((t, b)),
                    (Value::Int(t), _) => {
                        return Err(bad(
                            "logit_bias",
                            format!("bias for token {t} must be a number, got {}", describe(&b)),
                        ))
                    }
                    _ => {
                        return Err(bad(
                            "logit_bias",
                            format!("keys must be token ids, got {}", describe(&t)),
                        ))
                    }
                }
            }
            Value::Bias(out)
        }
    })
}

/// Read the knobs from any object with `SampleOpts`' attributes: one
/// attribute per entry of the core's knob table, checked by the core.
fn knobs_from(opts: &Bound<'_, PyAny>) -> PyResult<Knobs> {
    let values = KNOBS
        .iter()
        .map(|spec| value_of(&knob(opts, spec.name)?, spec.kind))
        .collect::<PyResult<Vec<Value>>>()?;
    Knobs::from_values(values).py()
}

fn order_from(order: Option<&Bound<'_, PyAny>>) -> PyResult<OrderSpec> {
    let Some(order) = order.filter(|o| !o.is_none()) else {
        return Ok(OrderSpec::Preset("default".to_owned()));
    };
    if let Ok(name) = order.extract::<String>() {
        return Ok(OrderSpec::Preset(name));
    }
    let names: Vec<String> = order.extract().map_err(|_| {
        bad(
            "order",
            "must be a preset name or a sequence of stage names",
        )
    })?;
    Ok(OrderSpec::Custom(names))
}

/// Convert a history (None, a sequence of ints, or a 1-D numpy integer array).
fn history_from(obj: Option<&Bound<'_, PyAny>>, what: &str) -> PyResult<Vec<u32>> {
    let Some(obj) = obj.filter(|o| !o.is_none()) else {
        return Ok(Vec::new());
    };
    if obj.is_instance_of::<PyBytes>()
        || obj.is_instance_of::<PyByteArray>()
        || obj.is_instance_of::<PyString>()
        || obj.is_instance_of::<PyMemoryView>()
    {
        return Err(dtype_err(format!(
            "{what} must be token ids (a sequence of ints or a 1-D integer array), got {}; \
             bytes are not read as ids: pass list(b) if they are",
            describe(obj)
        )));
    }
    let values: Vec<i64> = if let Ok(arr) = obj.cast::<PyUntypedArray>() {
        refuse_masked(obj, what)?;
        if arr.ndim() != 1 {
            return Err(shape_err(format!(
                "{what} must be 1-D (one sequence of token ids), got an array of shape {:?}",
                arr.shape()
            )));
        }
        if let Ok(a) = obj.cast::<PyArray1<i64>>() {
            let ro = a.readonly();
            if let Ok(s) = ro.as_slice() {
                // The common case, converted without an intermediate copy.
                // An id fits in u32 exactly when its top 32 bits are clear
                // (negative ids have them set): an OR over the row, which
                // vectorises where a signed min/max does not.
                let high = s.iter().fold(0u64, |acc, &t| acc | (t as u64 >> 32));
                if high == 0 {
                    return Ok(s.iter().map(|&t| t as u32).collect());
                }
            }
            a.to_vec()?
        } else if let Ok(a) = obj.cast::<PyArray1<i32>>() {
            a.to_vec()?.into_iter().map(i64::from).collect()
        } else if let Ok(a) = obj.cast::<PyArray1<u32>>() {
            a.to_vec()?.into_iter().map(i64::from).collect()
        } else if let Ok(a) = obj.cast::<PyArray1<u16>>() {
            a.to_vec()?.into_iter().map(i64::from).collect()
        } else {
            return Err(dtype_err(format!(
                "{what} must hold integer token ids (int32, int64, uint16 or uint32), got dtype {}; \
                 convert with x.astype(np.int64)",
                arr.dtype()
            )));
        }
    } else {
        let items = obj.try_iter().map_err(|_| {
            dtype_err(format!(
                "{what} must be a sequence of token ids or a 1-D numpy integer array, got {}",
                describe(obj)
            ))
        })?;
        let mut v = Vec::with_capacity(obj.len().unwrap_or(0));
        for (i, item) in items.enumerate() {
            v.push(token_value(&item?, &format!("{what}[{i}]"))?);
        }
        v
    };
    values
        .into_iter()
        .map(|t| {
            u32::try_from(t)
                .map_err(|_| token_err(format!("{what}: token id {t} is negative or too large")))
        })
        .collect()
}

fn describe(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "object".to_owned())
}

/// One token id given as a Python object: an int (or anything with
/// `__index__`, such as numpy integers), never a bool or a float.
fn token_value(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<i64> {
    if obj.is_instance_of::<PyBool>() || obj.is_instance_of::<PyFloat>() {
        return Err(dtype_err(format!(
            "{what}: token ids are integers, got {} {obj}",
            describe(obj)
        )));
    }
    obj.extract::<i64>().map_err(|_| {
        dtype_err(format!(
            "{what}: token ids are integers, got {}",
            describe(obj)
        ))
    })
}

/// Sequence ids (ints in `0..2**64`, never bools or floats).
fn sequence_ids_from(obj: &Bound<'_, PyAny>) -> PyResult<Vec<u64>> {
    let items = obj
        .try_iter()
        .map_err(|_| dtype_err("sequence_ids must be a sequence of integers"))?;
    let mut out = Vec::new();
    for (i, item) in items.enumerate() {
        let item = item?;
        if item.is_instance_of::<PyBool>() || item.is_instance_of::<PyFloat>() {
            return Err(dtype_err(format!(
                "sequence_ids[{i}] must be an integer, got {}",
                describe(&item)
            )));
        }
        out.push(item.extract::<u64>().map_err(|_| {
            bad(
                &format!("sequence_ids[{i}]"),
                "must be an integer in 0..2**64",
            )
        })?);
    }
    Ok(out)
}

fn mode_from(mode: &str) -> PyResult<LogprobMode> {
    match mode {
        "raw" => Ok(LogprobMode::Raw),
        "penalized" => Ok(LogprobMode::Penalized),
        "final" => Ok(LogprobMode::Final),
        m => Err(bad(
            "mode",
            format!("expected \"raw\", \"penalized\" or \"final\", got {m:?}"),
        )),
    }
}

/// A sampled token with its log-probability and the most likely alternatives.
#[pyclass(frozen, name = "SampleResult", module = "rlx_lm._core")]
#[derive(Clone, Debug)]
pub struct SampleResult {
    token: u32,
    logprob: f64,
    top: Vec<(u32, f64)>,
    mode: &'static str,
}

#[pymethods]
impl SampleResult {
    /// The sampled token id.
    #[getter]
    fn token(&self) -> PyResult<u32> {
        catch_panics(|| Ok(self.token))
    }

    /// Its natural-log probability under the chosen distribution.
    #[getter]
    fn logprob(&self) -> PyResult<f64> {
        catch_panics(|| Ok(self.logprob))
    }

    /// The `top_n` most likely tokens as `(token, logprob)`, best first.
    #[getter]
    fn top(&self) -> PyResult<Vec<(u32, f64)>> {
        catch_panics(|| Ok(self.top.clone()))
    }

    /// Which distribution the log-probabilities describe.
    #[getter]
    fn mode(&self) -> PyResult<&'static str> {
        catch_panics(|| Ok(self.mode))
    }

    fn __repr__(&self) -> PyResult<String> {
        catch_panics(|| {
            Ok(format!(
                "SampleResult(token={}, logprob={:.6}, top={:?}, mode={:?})",
                self.token, self.logprob, self.top, self.mode
            ))
        })
    }
}

/// A sampler chain built from `SampleOpts`: stages, order and per-sequence
/// state, with its buffers (the core's [`ChainHandle`]).
#[pyclass(name = "SamplerChain", module = "rlx_lm._core")]
pub struct PySamplerChain {
    handle: ChainHandle,
}

impl PySamplerChain {
    fn wrap(chain: SamplerChain) -> Self {
        PySamplerChain {
            handle: ChainHandle::new(chain),
        }
    }

    fn chain(&self) -> &SamplerChain {
        self.handle.chain()
    }
}

/// The chain, borrowed for a call that runs no Python code while it holds
/// it. Calls from several threads are serialised by the GIL and none keeps
/// the borrow across a GIL release (sample_batch works on a copy), so this
/// fails only when a call re-enters the same chain from inside its own
/// argument conversion: a typed error, not PyO3's "Already borrowed".
fn borrow_chain<'py>(slf: &Bound<'py, PySamplerChain>) -> PyResult<PyRefMut<'py, PySamplerChain>> {
    slf.try_borrow_mut().map_err(|_| {
        to_py(CoreError::SequenceState(
            "this SamplerChain is in use by a call that has not returned \
             (a call re-entered it from its own arguments)"
                .to_owned(),
        ))
    })
}

/// One row: convert the inputs, then borrow the chain for the core's
/// sample (advancing) or peek. Inputs are converted before the chain is
/// borrowed: converting may run Python code (a history's iterator), during
/// which another thread may use this chain.
fn run_row(
    slf: &Bound<'_, PySamplerChain>,
    logits: &Bound<'_, PyAny>,
    history: Option<&Bound<'_, PyAny>>,
    prompt_len: usize,
    uniform: Option<f64>,
    logprobs: Option<(usize, LogprobMode)>,
    advance: bool,
) -> PyResult<Sampled> {
    let row = f32_row(logits, "logits")?;
    let tokens = history_from(history, "history")?;
    let hist = History::with_prompt(&tokens, prompt_len).py()?;
    let row = row.as_slice()?;
    borrow_chain(slf)?
        .handle
        .sample(row, hist, uniform, logprobs, advance)
        .py()
}

#[pymethods]
impl PySamplerChain {
    #[new]
    #[pyo3(signature = (opts, order=None, sequence_id=0))]
    fn new(
        opts: &Bound<'_, PyAny>,
        order: Option<&Bound<'_, PyAny>>,
        sequence_id: u64,
    ) -> PyResult<Self> {
        catch_panics(|| {
            let knobs = knobs_from(opts)?;
            let order = order_from(order)?;
            Ok(Self::wrap(
                SamplerChain::new(knobs, &order, sequence_id).py()?,
            ))
        })
    }

    /// Sample one token from a float32 logits row given the history so far,
    /// and accept it (the step and mirostat's mu move on) unless `advance`
    /// is false.
    #[pyo3(signature = (logits, history=None, *, prompt_len=0, uniform=None, advance=true))]
    fn sample(
        slf: &Bound<'_, Self>,
        logits: &Bound<'_, PyAny>,
        history: Option<&Bound<'_, PyAny>>,
        prompt_len: usize,
        uniform: Option<f64>,
        advance: bool,
    ) -> PyResult<u32> {
        catch_panics(|| {
            Ok(run_row(slf, logits, history, prompt_len, uniform, None, advance)?.token)
        })
    }

    /// The token `sample` would return, without moving the chain on.
    #[pyo3(signature = (logits, history=None, *, prompt_len=0, uniform=None))]
    fn peek(
        slf: &Bound<'_, Self>,
        logits: &Bound<'_, PyAny>,
        history: Option<&Bound<'_, PyAny>>,
        prompt_len: usize,
        uniform: Option<f64>,
    ) -> PyResult<u32> {
        catch_panics(|| Ok(run_row(slf, logits, history, prompt_len, uniform, None, false)?.token))
    }

    /// Sample one token and report log-probabilities under `mode`'s distribution.
    #[pyo3(signature = (logits, history=None, top_n=0, *, mode="raw", prompt_len=0, uniform=None, advance=true))]
    #[allow(clippy::too_many_arguments)]
    fn sample_with_logprobs(
        slf: &Bound<'_, Self>,
        logits: &Bound<'_, PyAny>,
        history: Option<&Bound<'_, PyAny>>,
        top_n: i64,
        mode: &str,
        prompt_len: usize,
        uniform: Option<f64>,
        advance: bool,
    ) -> PyResult<SampleResult> {
        catch_panics(|| {
            let m = mode_from(mode)?;
            let n = usize::try_from(top_n)
                .map_err(|_| bad("top_n", format!("must be >= 0, got {top_n}")))?;
            let out = run_row(
                slf,
                logits,
                history,
                prompt_len,
                uniform,
                Some((n, m)),
                advance,
            )?;
            let lp = out.logprobs.unwrap_or(crate::sampling::Logprobs {
                logprob: 0.0,
                top: Vec::new(),
            });
            Ok(SampleResult {
                token: out.token,
                logprob: lp.logprob,
                top: lp.top,
                mode: match m {
                    LogprobMode::Raw => "raw",
                    LogprobMode::Penalized => "penalized",
                    LogprobMode::Final => "final",
                },
            })
        })
    }

    /// Sample every row of a 2-D float32 array (rows in parallel, GIL
    /// released), then move one step on unless `advance` is false.
    ///
    /// The rows are sampled with the chain as it is when the call starts: no
    /// borrow of the chain is held while the GIL is released, so another
    /// thread may use the same chain meanwhile (its `accept` counts for the
    /// next call); the logits array is pinned until the call returns.
    #[pyo3(signature = (logits, histories=None, *, prompt_lens=None, sequence_ids=None, uniforms=None, advance=true))]
    #[allow(clippy::too_many_arguments)]
    fn sample_batch<'py>(
        slf: &Bound<'py, Self>,
        py: Python<'py>,
        logits: &Bound<'py, PyAny>,
        histories: Option<&Bound<'py, PyAny>>,
        prompt_lens: Option<Vec<usize>>,
        sequence_ids: Option<&Bound<'py, PyAny>>,
        uniforms: Option<Vec<f64>>,
        advance: bool,
    ) -> PyResult<Bound<'py, PyArray1<i64>>> {
        catch_panics(|| {
            let mut job = borrow_chain(slf)?.handle.start_batch();
            // Pinned before numpy's borrow is taken and unpinned only after it
            // is released: numpy keys the borrow by the buffer's address, so a
            // resize in a window between the two (another thread, whenever this
            // one runs Python code) made the release miss its key and panic
            // inside a destructor, an abort.
            let checked = batch_rows(logits)?;
            let pinned = pin(logits)?;
            let arr: PyReadonlyArray2<'py, f32> = checked.readonly();
            let shape = arr.shape().to_vec();
            let (rows, vocab) = (shape[0], shape[1]);
            let data = arr.as_slice()?;
            let hists: Vec<Vec<u32>> = match histories.filter(|h| !h.is_none()) {
                None => vec![Vec::new(); rows],
                Some(h) => {
                    let items: Vec<Bound<'py, PyAny>> = h
                        .try_iter()
                        .map_err(|_| {
                            dtype_err("histories must be a sequence with one history per row")
                        })?
                        .collect::<PyResult<_>>()?;
                    if items.len() != rows {
                        return Err(shape_err(format!(
                            "histories has {} entries for {rows} rows of logits",
                            items.len()
                        )));
                    }
                    items
                        .iter()
                        .enumerate()
                        .map(|(i, h)| history_from(Some(h), &format!("histories[{i}]")))
                        .collect::<PyResult<_>>()?
                }
            };
            let seqs: Vec<u64> = match sequence_ids.filter(|s| !s.is_none()) {
                None => job.default_sequences(rows),
                Some(s) => sequence_ids_from(s)?,
            };
            let batch = Batch {
                logits: data,
                vocab,
                histories: &hists,
                prompt_lens: prompt_lens.as_deref(),
                sequences: &seqs,
                uniforms: uniforms.as_deref(),
            };
            let result = detached(py, &[&pinned], || job.run(&batch));
            drop(arr);
            drop(pinned);
            let out = borrow_chain(slf)?
                .handle
                .finish_batch(job, result, vocab, advance)
                .py()?;
            Ok(PyArray1::from_vec(py, out))
        })
    }

    /// Record the emitted token after `peek`: advances the step and mirostat's mu.
    fn accept(&mut self, token: &Bound<'_, PyAny>) -> PyResult<()> {
        catch_panics(|| {
            let token = token_value(token, "accept")?;
            let t = u32::try_from(token).map_err(|_| {
                token_err(format!("accept: token id {token} is negative or too large"))
            })?;
            self.handle.chain_mut().accept(t).py()
        })
    }

    /// Return to step 0 and the initial mirostat mu (same seed, same tokens).
    fn reset(&mut self) -> PyResult<()> {
        catch_panics(|| {
            self.handle.chain_mut().reset();
            Ok(())
        })
    }

    /// An independent copy with the same knobs, seed and state.
    fn clone(&self) -> PyResult<Self> {
        catch_panics(|| Ok(Self::wrap(self.chain().clone())))
    }

    fn __copy__(&self) -> PyResult<Self> {
        catch_panics(|| Ok(Self::wrap(self.chain().clone())))
    }

    fn __deepcopy__(&self, _memo: &Bound<'_, PyDict>) -> PyResult<Self> {
        catch_panics(|| Ok(Self::wrap(self.chain().clone())))
    }

    /// Pickles as its state (knobs, order, sequence, step, mu, pending).
    fn __reduce__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        catch_panics(|| {
            let state = self.chain().state().to_bytes();
            let rebuild = py
                .import("rlx_lm._core")?
                .getattr("_sampler_chain_from_state")?;
            let args = PyTuple::new(py, [PyBytes::new(py, &state)])?;
            PyTuple::new(py, [rebuild, args.into_any()])
        })
    }

    /// Tokens accepted since construction or the last reset.
    #[getter]
    fn step(&self) -> PyResult<u64> {
        catch_panics(|| Ok(self.chain().step))
    }

    /// The seed of the draw (chosen at random when the options had none).
    #[getter]
    fn seed(&self) -> PyResult<u64> {
        catch_panics(|| Ok(self.chain().knobs().seed))
    }

    /// The sequence id keyed into the draw.
    #[getter]
    fn sequence_id(&self) -> PyResult<u64> {
        catch_panics(|| Ok(self.chain().sequence))
    }

    /// Mirostat's current mu, or None without mirostat.
    #[getter]
    fn mu(&self) -> PyResult<Option<f32>> {
        catch_panics(|| Ok(self.chain().mu()))
    }

    /// The stages that run, in order (stages whose knobs are off are left out).
    #[getter]
    fn stages(&self) -> PyResult<Vec<&'static str>> {
        catch_panics(|| Ok(self.handle.stage_names()))
    }

    /// The order's name: "default", a preset, or "custom".
    #[getter]
    fn order(&self) -> PyResult<String> {
        catch_panics(|| Ok(self.chain().order_name().to_owned()))
    }

    /// Whether the chain is a plain argmax (no RNG).
    #[getter]
    fn is_greedy(&self) -> PyResult<bool> {
        catch_panics(|| Ok(self.chain().selector() == Selector::Argmax))
    }

    fn __repr__(&self) -> PyResult<String> {
        catch_panics(|| {
            Ok(format!(
                "SamplerChain(order={:?}, stages=[{}], step={}, seed={})",
                self.chain().order_name(),
                self.handle.stage_names().join(" -> "),
                self.chain().step,
                self.chain().knobs().seed
            ))
        })
    }
}

/// Rebuild a SamplerChain from its pickled state (validated like a new chain).
#[pyfunction]
pub fn _sampler_chain_from_state(state: &[u8]) -> PyResult<PySamplerChain> {
    catch_panics(|| {
        let state = ChainState::from_bytes(state).py()?;
        Ok(PySamplerChain::wrap(SamplerChain::from_state(state).py()?))
    })
}

/// Borrow a 2-D C-contiguous float32 array (one row of logits per sequence).
fn batch_rows<'py>(obj: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyArray2<f32>>> {
    let Ok(untyped) = obj.cast::<PyUntypedArray>() else {
        return Err(dtype_err(
            "logits must be a 2-D numpy float32 array; convert with np.asarray(x, dtype=np.float32)",
        ));
    };
    if untyped.ndim() != 2 || untyped.shape()[1] == 0 {
        return Err(shape_err(format!(
            "logits must be 2-D (rows, vocab) with vocab > 0, got shape {:?}",
            untyped.shape()
        )));
    }
    let Ok(arr) = obj.cast::<PyArray2<f32>>() else {
        return Err(dtype_err(format!(
            "logits must have dtype float32, got {}; convert with x.astype(np.float32)",
            untyped.dtype()
        )));
    };
    if !untyped.is_c_contiguous() {
        return Err(dtype_err(
            "logits must be C-contiguous; convert with np.ascontiguousarray(x)",
        ));
    }
    Ok(arr.clone())
}

/// Check options as a chain would (every knob through the core's table)
/// without building one: `SampleOpts` validates through this.
#[pyfunction]
pub fn _validate_sample_opts(opts: &Bound<'_, PyAny>) -> PyResult<()> {
    catch_panics(|| knobs_from(opts).map(|_| ()))
}

fn value_to_py<'py>(py: Python<'py>, v: &Value) -> PyResult<Bound<'py, PyAny>> {
    Ok(match v {
        Value::None | Value::Other(_) => py.None().into_bound(py),
        Value::Float(x) => PyFloat::new(py, *x).into_any(),
        Value::Int(n) => (*n).into_pyobject(py)?.into_any(),
        Value::Pair(a, b) => PyTuple::new(py, [*a, *b])?.into_any(),
        Value::Tokens(t) => PyTuple::new(py, t)?.into_any(),
        Value::Bias(b) => {
            let d = PyDict::new(py);
            for &(t, x) in b {
                d.set_item(t, x)?;
            }
            d.into_any()
        }
    })
}

fn bound_to_py<'py>(py: Python<'py>, b: End) -> PyResult<Bound<'py, PyAny>> {
    Ok(match b {
        End::Open => py.None().into_bound(py),
        End::Incl(x) => (x, true).into_pyobject(py)?.into_any(),
        End::Excl(x) => (x, false).into_pyobject(py)?.into_any(),
    })
}

/// The core's knob, stage and preset tables, as module constants for
/// `rlx_lm.sample_opts` (which derives its stage names, presets and checks
/// from them) and the CLI (flags and help).
pub fn add_tables(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    let mut knobs = Vec::new();
    for k in &KNOBS {
        let d = PyDict::new(py);
        d.set_item("name", k.name)?;
        d.set_item("kind", k.kind.name())?;
        d.set_item("default", value_to_py(py, &k.default_value())?)?;
        d.set_item("lo", bound_to_py(py, k.lo)?)?;
        d.set_item("hi", bound_to_py(py, k.hi)?)?;
        d.set_item("expect", k.expect)?;
        d.set_item("help", k.help)?;
        d.set_item("flag", k.flag)?;
        d.set_item("server_fields", PyTuple::new(py, k.server_fields)?)?;
        d.set_item("probe", k.probe)?;
        knobs.push(d);
    }
    m.add("SAMPLER_KNOBS", PyTuple::new(py, knobs)?)?;
    let mut stages = Vec::new();
    for s in &STAGES {
        let d = PyDict::new(py);
        d.set_item("name", s.name)?;
        d.set_item("knobs", PyTuple::new(py, s.knobs)?)?;
        d.set_item("edits", s.edits)?;
        d.set_item("llama_cpp_names", PyTuple::new(py, s.llama_cpp_names)?)?;
        d.set_item("llama_cpp_letter", s.llama_cpp_letter.map(String::from))?;
        d.set_item(
            "min_keep",
            match s.min_keep {
                MinKeep::Never => "never",
                MinKeep::Always => "always",
                MinKeep::Flavor => "flavor",
            },
        )?;
        stages.push(d);
    }
    m.add("SAMPLER_STAGES", PyTuple::new(py, stages)?)?;
    let presets = PyDict::new(py);
    for name in PRESETS {
        if let Some((order, _)) = preset_order(name) {
            let names: Vec<&str> = order.iter().map(|s| s.name()).collect();
            presets.set_item(name, PyTuple::new(py, names)?)?;
        }
    }
    m.add("SAMPLER_PRESETS", presets)?;
    Ok(())
}
