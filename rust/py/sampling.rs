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
    ChainState, History, Knobs, LogprobMode, Mirostat, OrderSpec, Sampled, SamplerChain, Scratch,
    Selector,
};
use crate::sampling::knobs::Window;
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

/// A knob as the float32 the chain computes with. Rounding to the nearest
/// float32 is the documented contract; a value float32 cannot hold at all
/// (finite but beyond its range, or nonzero but below its smallest
/// subnormal) is refused rather than turned into inf or 0.
fn narrow(field: &str, v: f64) -> PyResult<f32> {
    let x = v as f32;
    if (x.is_infinite() && v.is_finite()) || (x == 0.0 && v != 0.0) {
        return Err(bad(
            field,
            format!("{v} does not fit float32, which the sampler chain computes in"),
        ));
    }
    Ok(x)
}

/// The attribute `field` of an options object; a missing one is refused by name
/// (not Python's bare `AttributeError`), saying what the chain expects.
fn knob<'py>(opts: &Bound<'py, PyAny>, field: &str) -> PyResult<Bound<'py, PyAny>> {
    opts.getattr(field).map_err(|e| {
        if !e.is_instance_of::<pyo3::exceptions::PyAttributeError>(opts.py()) {
            return e; // a property that raised: its own error, untouched
        }
        let kind = opts
            .get_type()
            .name()
            .map(|n| n.to_string())
            .unwrap_or_else(|_| "object".to_owned());
        bad(
            field,
            format!("missing (the {kind} passed has no such attribute); pass a SampleOpts"),
        )
    })
}

fn get_f32(opts: &Bound<'_, PyAny>, field: &str) -> PyResult<f32> {
    let v = knob(opts, field)?
        .extract::<f64>()
        .map_err(|_| bad(field, "must be a number"))?;
    narrow(field, v)
}

fn get_usize(opts: &Bound<'_, PyAny>, field: &str) -> PyResult<usize> {
    let v: i64 = knob(opts, field)?
        .extract()
        .map_err(|_| bad(field, "must be an integer"))?;
    usize::try_from(v).map_err(|_| bad(field, format!("must be >= 0, got {v}")))
}

fn token_id(field: &str, v: i64) -> PyResult<u32> {
    u32::try_from(v).map_err(|_| bad(field, format!("token ids must be in 0..2**32, got {v}")))
}

/// Read the knobs from any object with `SampleOpts`' attributes.
fn knobs_from(opts: &Bound<'_, PyAny>) -> PyResult<Knobs> {
    let top_k: Option<i64> = knob(opts, "top_k")?
        .extract()
        .map_err(|_| bad("top_k", "must be an integer or None"))?;
    let top_k = match top_k {
        None => 0,
        Some(k) => {
            usize::try_from(k).map_err(|_| bad("top_k", format!("must be >= 0, got {k}")))?
        }
    };
    let window: Option<i64> = knob(opts, "repetition_window")?
        .extract()
        .map_err(|_| bad("repetition_window", "must be an integer or None"))?;
    let repetition_window = match window {
        None => Window::Preset,
        Some(-1) => Window::All,
        Some(w) if w >= 1 => Window::Last(w as usize),
        Some(w) => {
            return Err(bad(
                "repetition_window",
                format!("must be >= 1, -1 (whole history) or None (the order's default), got {w}"),
            ))
        }
    };
    let dynamic_temp: Option<(f64, f64)> = knob(opts, "dynamic_temp")?
        .extract()
        .map_err(|_| bad("dynamic_temp", "must be a (min, max) pair or None"))?;
    let mirostat: i64 = knob(opts, "mirostat")?
        .extract()
        .map_err(|_| bad("mirostat", "must be a MirostatMode"))?;
    let mirostat = match mirostat {
        0 => Mirostat::Off,
        1 => Mirostat::V1,
        2 => Mirostat::V2,
        m => return Err(bad("mirostat", format!("must be 0 (off), 1 or 2, got {m}"))),
    };
    let breakers: Vec<i64> = knob(opts, "dry_sequence_breakers")?
        .extract()
        .map_err(|_| bad("dry_sequence_breakers", "must be a sequence of token ids"))?;
    let breakers = breakers
        .into_iter()
        .map(|t| token_id("dry_sequence_breakers", t))
        .collect::<PyResult<Vec<u32>>>()?;
    let seed: Option<u64> = knob(opts, "seed")?
        .extract()
        .map_err(|_| bad("seed", "must be an integer in 0..2**64 or None"))?;
    let seed = seed.unwrap_or_else(random_seed);
    let mut logit_bias = Vec::new();
    let bias_obj = knob(opts, "logit_bias")?;
    if !bias_obj.is_none() {
        let items = bias_obj
            .call_method0("items")
            .map_err(|_| bad("logit_bias", "must be a mapping of token id to bias"))?;
        for item in items.try_iter()? {
            let (t, b): (i64, f64) = item?
                .extract()
                .map_err(|_| bad("logit_bias", "keys must be token ids and values numbers"))?;
            logit_bias.push((token_id("logit_bias", t)?, narrow("logit_bias", b)?));
        }
    }
    Ok(Knobs {
        temperature: get_f32(opts, "temperature")?,
        top_k,
        top_p: get_f32(opts, "top_p")?,
        min_p: get_f32(opts, "min_p")?,
        typical_p: get_f32(opts, "typical_p")?,
        top_n_sigma: get_f32(opts, "top_n_sigma")?,
        repetition_penalty: get_f32(opts, "repetition_penalty")?,
        frequency_penalty: get_f32(opts, "frequency_penalty")?,
        presence_penalty: get_f32(opts, "presence_penalty")?,
        repetition_window,
        dynamic_temp: dynamic_temp
            .map(|(a, b)| Ok::<_, PyErr>((narrow("dynamic_temp", a)?, narrow("dynamic_temp", b)?)))
            .transpose()?,
        dynamic_temp_exponent: get_f32(opts, "dynamic_temp_exponent")?,
        xtc_threshold: get_f32(opts, "xtc_threshold")?,
        xtc_prob: get_f32(opts, "xtc_prob")?,
        dry_multiplier: get_f32(opts, "dry_multiplier")?,
        dry_base: get_f32(opts, "dry_base")?,
        dry_allowed_length: get_usize(opts, "dry_allowed_length")?,
        dry_max_ngram: get_usize(opts, "dry_max_ngram")?,
        dry_sequence_breakers: breakers,
        mirostat,
        mirostat_tau: get_f32(opts, "mirostat_tau")?,
        mirostat_eta: get_f32(opts, "mirostat_eta")?,
        mirostat_m: get_usize(opts, "mirostat_m")?,
        min_keep: get_usize(opts, "min_keep")?,
        seed,
        logit_bias,
    })
}

/// A seed from the OS-seeded hasher keys, for chains built without one.
fn random_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64),
    );
    h.finish()
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

/// A history with its prompt length, which must not exceed it.
fn history_of(tokens: &[u32], prompt_len: usize) -> PyResult<History<'_>> {
    if prompt_len > tokens.len() {
        return Err(bad(
            "prompt_len",
            format!(
                "{prompt_len} is longer than the history ({} tokens)",
                tokens.len()
            ),
        ));
    }
    Ok(History { tokens, prompt_len })
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

/// A sampler chain built from `SampleOpts`: stages, order and per-sequence state.
#[pyclass(name = "SamplerChain", module = "rlx_lm._core")]
pub struct PySamplerChain {
    chain: SamplerChain,
    scratch: Scratch,
    batch_scratch: Vec<Scratch>,
}

impl PySamplerChain {
    fn wrap(chain: SamplerChain) -> Self {
        PySamplerChain {
            chain,
            scratch: Scratch::default(),
            batch_scratch: Vec::new(),
        }
    }

    /// The running stages' names, then the selector's.
    fn stage_names(&self) -> Vec<&'static str> {
        let mut names: Vec<&'static str> = self.chain.stages().iter().map(|s| s.name()).collect();
        names.push(match self.chain.selector() {
            Selector::Argmax => "argmax",
            Selector::Dist => "dist",
            Selector::MirostatV1 => "mirostat_v1",
            Selector::MirostatV2 => "mirostat_v2",
        });
        names
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
    let hist = history_of(&tokens, prompt_len)?;
    let row = row.as_slice()?;
    let mut me = borrow_chain(slf)?;
    let me = &mut *me;
    if advance {
        me.chain
            .sample(row, hist, uniform, logprobs, &mut me.scratch)
    } else {
        me.chain.peek(row, hist, uniform, logprobs, &mut me.scratch)
    }
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
            let (chain, mut scratches) = {
                let mut me = borrow_chain(slf)?;
                (me.chain.clone(), std::mem::take(&mut me.batch_scratch))
            };
            let arr: PyReadonlyArray2<'py, f32> = batch_rows(logits)?;
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
                None => (0..rows as u64)
                    .map(|r| chain.sequence.wrapping_add(r))
                    .collect(),
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
            let pinned = pin(logits)?;
            let result = detached(py, &[&pinned], || chain.sample_rows(&batch, &mut scratches));
            drop(pinned);
            let mut me = borrow_chain(slf)?;
            if me.batch_scratch.len() < scratches.len() {
                me.batch_scratch = scratches;
            }
            let out = result.py()?;
            if advance {
                me.chain.advance(vocab);
            }
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
            self.chain.accept(t).py()
        })
    }

    /// Return to step 0 and the initial mirostat mu (same seed, same tokens).
    fn reset(&mut self) -> PyResult<()> {
        catch_panics(|| {
            self.chain.reset();
            Ok(())
        })
    }

    /// An independent copy with the same knobs, seed and state.
    fn clone(&self) -> PyResult<Self> {
        catch_panics(|| Ok(Self::wrap(self.chain.clone())))
    }

    fn __copy__(&self) -> PyResult<Self> {
        catch_panics(|| Ok(Self::wrap(self.chain.clone())))
    }

    fn __deepcopy__(&self, _memo: &Bound<'_, PyDict>) -> PyResult<Self> {
        catch_panics(|| Ok(Self::wrap(self.chain.clone())))
    }

    /// Pickles as its state (knobs, order, sequence, step, mu, pending).
    fn __reduce__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        catch_panics(|| {
            let state = self.chain.state().to_bytes();
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
        catch_panics(|| Ok(self.chain.step))
    }

    /// The seed of the draw (chosen at random when the options had none).
    #[getter]
    fn seed(&self) -> PyResult<u64> {
        catch_panics(|| Ok(self.chain.knobs().seed))
    }

    /// The sequence id keyed into the draw.
    #[getter]
    fn sequence_id(&self) -> PyResult<u64> {
        catch_panics(|| Ok(self.chain.sequence))
    }

    /// Mirostat's current mu, or None without mirostat.
    #[getter]
    fn mu(&self) -> PyResult<Option<f32>> {
        catch_panics(|| Ok(self.chain.mu()))
    }

    /// The stages that run, in order (stages whose knobs are off are left out).
    #[getter]
    fn stages(&self) -> PyResult<Vec<&'static str>> {
        catch_panics(|| Ok(self.stage_names()))
    }

    /// The order's name: "default", a preset, or "custom".
    #[getter]
    fn order(&self) -> PyResult<String> {
        catch_panics(|| Ok(self.chain.order_name().to_owned()))
    }

    /// Whether the chain is a plain argmax (no RNG).
    #[getter]
    fn is_greedy(&self) -> PyResult<bool> {
        catch_panics(|| Ok(self.chain.selector() == Selector::Argmax))
    }

    fn __repr__(&self) -> PyResult<String> {
        catch_panics(|| {
            Ok(format!(
                "SamplerChain(order={:?}, stages=[{}], step={}, seed={})",
                self.chain.order_name(),
                self.stage_names().join(" -> "),
                self.chain.step,
                self.chain.knobs().seed
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
fn batch_rows<'py>(obj: &Bound<'py, PyAny>) -> PyResult<PyReadonlyArray2<'py, f32>> {
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
    Ok(arr.readonly())
}
