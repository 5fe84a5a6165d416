//! `rlx_lm._core.Engine`: a model run in place on its stored weights, with a
//! thread pool of its own. Every call releases the GIL for the whole forward
//! pass and hands the logits to numpy without copying them.

use std::path::PathBuf;
use std::sync::Arc;

use numpy::{Ix1, PyArray1, PyArray2, PyArrayMethods, PyReadonlyArray1};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyInt};

use super::arrays::borrow;
use super::errors::{catch_panics, IntoPyResult};
use super::gil::{detached, pin, Pin};
use super::kv::PyKvCache;
use crate::engine::{
    Activations, BlockVariant, Config, Experts, Gating, LocalRope, Model, Residency, RopeStyle,
    Step, Store, TensorEntry,
};
use crate::kv::KvCache;
use crate::per_process::PerProcess;
use crate::CoreError;

/// A loaded model and the threads that run it.
#[pyclass(frozen, module = "rlx_lm._core", name = "Engine")]
pub struct PyEngine {
    model: Arc<Model>,
    /// Made again in a forked child (see `crate::per_process`).
    pool: PerProcess<rayon::ThreadPool>,
    threads: usize,
}

fn engine_pool(threads: usize) -> Result<rayon::ThreadPool, CoreError> {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(|i| format!("rlx-engine-{i}"))
        .build()
        .map_err(|e| CoreError::option("threads", e.to_string()))
}

fn describe(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "object".to_owned())
}

fn item<'py, T: FromPyObjectOwned<'py>>(cfg: &Bound<'py, PyDict>, key: &str) -> PyResult<T> {
    let Some(value) = cfg.get_item(key)? else {
        return Err(CoreError::option("config", format!("missing {key:?}"))).py();
    };
    value
        .extract::<T>()
        .map_err(|_| {
            let shown = value
                .repr()
                .map(|r| r.to_string())
                .unwrap_or_else(|_| "?".into());
            let shown: String = shown.chars().take(80).collect();
            CoreError::option(
                "config",
                format!(
                    "{key:?} has the wrong type or is out of range ({} {shown})",
                    describe(&value)
                ),
            )
        })
        .py()
}

/// `cfg[key]`, or `default` when the key is absent (keys later families added).
fn item_or<'py, T: FromPyObjectOwned<'py>>(
    cfg: &Bound<'py, PyDict>,
    key: &str,
    default: T,
) -> PyResult<T> {
    if cfg.contains(key)? {
        item(cfg, key)
    } else {
        Ok(default)
    }
}

fn config(cfg: &Bound<'_, PyDict>) -> PyResult<Config> {
    let style: String = item(cfg, "rope_style")?;
    let rope_style = match style.as_str() {
        "halves" => RopeStyle::Halves,
        "interleaved" => RopeStyle::Interleaved,
        other => {
            return Err(CoreError::option(
                "rope_style",
                format!("{other:?} is not \"halves\" or \"interleaved\""),
            ))
            .py()
        }
    };
    Ok(Config {
        arch: item(cfg, "arch")?,
        vocab_size: item(cfg, "vocab_size")?,
        hidden_size: item(cfg, "hidden_size")?,
        intermediate_size: item(cfg, "intermediate_size")?,
        n_layers: item(cfg, "n_layers")?,
        n_heads: item(cfg, "n_heads")?,
        n_kv_heads: item(cfg, "n_kv_heads")?,
        head_dim: item(cfg, "head_dim")?,
        rms_norm_eps: item::<f64>(cfg, "rms_norm_eps")? as f32,
        rope_inv_freq: item(cfg, "rope_inv_freq")?,
        rope_position_scale: item(cfg, "rope_position_scale")?,
        rope_mscale: item_or(cfg, "rope_mscale", 1.0)?,
        rope_style,
        sliding_window: item(cfg, "sliding_window")?,
        window_layers: item_or(cfg, "window_layers", Vec::new())?,
        rope_local: match item_or::<Option<Vec<f64>>>(cfg, "rope_local_inv_freq", None)? {
            Some(inv_freq) => Some(LocalRope {
                inv_freq,
                position_scale: item_or(cfg, "rope_local_position_scale", 1.0)?,
            }),
            None => None,
        },
        embed_scale: item_or::<f64>(cfg, "embed_scale", 1.0)? as f32,
        attn_scale: match item_or::<Option<f64>>(cfg, "attn_scale", None)? {
            Some(s) => s as f32,
            None => 1.0 / (item::<usize>(cfg, "head_dim")? as f32).sqrt(),
        },
        attn_softcap: item_or::<Option<f64>>(cfg, "attn_softcap", None)?.map(|c| c as f32),
        final_softcap: item_or::<Option<f64>>(cfg, "final_softcap", None)?.map(|c| c as f32),
        residual_scale: item_or::<f64>(cfg, "residual_scale", 1.0)? as f32,
        logit_scale: item_or::<f64>(cfg, "logit_scale", 1.0)? as f32,
        nope_layers: item_or(cfg, "nope_layers", Vec::new())?,
        block: BlockVariant {
            qkv_bias: item(cfg, "qkv_bias")?,
            qk_norm: item(cfg, "qk_norm")?,
            gelu: item_or(cfg, "gelu", false)?,
            post_norms: item_or(cfg, "post_norms", false)?,
            no_pre_norms: item_or(cfg, "no_pre_norms", false)?,
            qk_norm_full: item_or(cfg, "qk_norm_full", false)?,
            o_bias: item_or(cfg, "o_bias", false)?,
            attn_sinks: item_or(cfg, "attn_sinks", false)?,
            oai_glu: item_or(cfg, "oai_glu", false)?,
        },
        experts: match item_or::<usize>(cfg, "n_experts", 0)? {
            0 => None,
            count => Some(Experts {
                count,
                used: item(cfg, "n_experts_used")?,
                ff: item(cfg, "expert_ff")?,
                norm_weights: item(cfg, "experts_norm")?,
                shared_ff: item_or(cfg, "shared_expert_ff", 0)?,
                gating: match item_or::<String>(cfg, "expert_gating", "softmax".into())?.as_str() {
                    "softmax" => Gating::Softmax,
                    "softmax_picked" => Gating::SoftmaxPicked,
                    other => {
                        return Err(CoreError::option(
                            "expert_gating",
                            format!("{other:?} is not \"softmax\" or \"softmax_picked\""),
                        ))
                        .py()
                    }
                },
                biases: item_or(cfg, "expert_biases", false)?,
            }),
        },
    })
}

/// `obj` as a `KvCache`, or a `TypeError` naming what it is.
fn kv_cache<'py>(obj: &Bound<'py, PyAny>, what: &str) -> PyResult<Bound<'py, PyKvCache>> {
    obj.cast::<PyKvCache>()
        .cloned()
        .map_err(|_| {
            CoreError::Type(format!(
                "{what} must be a rlx_lm.KvCache, got {}",
                describe(obj)
            ))
        })
        .py()
}

fn borrow_all<'py>(caches: &[Bound<'py, PyKvCache>]) -> PyResult<Vec<PyRefMut<'py, PyKvCache>>> {
    caches
        .iter()
        .enumerate()
        .map(|(i, c)| {
            c.try_borrow_mut()
                .map_err(|_| {
                    CoreError::option(
                        "caches",
                        format!("cache #{i} is in use (the same KvCache given twice?)"),
                    )
                })
                .py()
        })
        .collect()
}

/// A token id given as an integer (a Python int or a numpy integer; not a
/// bool, not a float). One beyond 64 bits is refused naming its size.
fn token_id(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<i64> {
    let not_int = || {
        CoreError::Type(format!(
            "{what} must be an integer token id, got {}",
            describe(obj)
        ))
    };
    if obj.is_instance_of::<PyBool>() {
        return Err(not_int()).py();
    }
    let index = if obj.is_instance_of::<PyInt>() {
        obj.clone()
    } else {
        // numpy integer scalars are integers by `__index__`, not by class.
        obj.call_method0(pyo3::intern!(obj.py(), "__index__"))
            .map_err(|_| not_int())
            .py()?
    };
    index
        .extract::<i64>()
        .map_err(|_| CoreError::option(what, "token id does not fit in 64 bits"))
        .py()
}

/// A 1-D int64 array of token ids, borrowed (typed errors otherwise).
fn ids_array<'py>(obj: &Bound<'py, PyAny>) -> PyResult<PyReadonlyArray1<'py, i64>> {
    borrow::<i64, Ix1>(obj, "ids", "int64")
}

impl PyEngine {
    fn run(
        &self,
        py: Python<'_>,
        pins: &[&Pin<'_>],
        caches: &mut [&mut KvCache],
        tokens: &[&[i64]],
        all: bool,
    ) -> PyResult<Vec<f32>> {
        let model = &self.model;
        let pool = self.pool.get(|| engine_pool(self.threads)).py()?;
        detached(py, pins, || {
            let mut steps: Vec<Step<'_>> = caches
                .iter_mut()
                .zip(tokens)
                .map(|(c, t)| Step {
                    cache: c,
                    tokens: t,
                })
                .collect();
            pool.install(|| model.forward(&mut steps, all))
        })
        .py()
    }
}

#[pymethods]
impl PyEngine {
    #[new]
    #[pyo3(signature = (*, config, files, tensors, owned, threads, activations = "exact", use_mmap = None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        config: &Bound<'_, PyDict>,
        files: Vec<PathBuf>,
        tensors: Vec<(String, usize, u64, u32, Vec<usize>)>,
        owned: Vec<(String, Vec<usize>, Bound<'_, PyAny>)>,
        threads: usize,
        activations: &str,
        use_mmap: Option<bool>,
    ) -> PyResult<Self> {
        catch_panics(|| {
            let cfg = self::config(config)?;
            let activations = Activations::from_name(activations).py()?;
            // A configuration the engine refuses comes from the model's files (or
            // an explicit config standing in for them): a format error.
            cfg.validate()
                .map_err(|e| CoreError::Format(format!("the model configuration is refused: {e}")))
                .py()?;
            if threads == 0 || threads > 1024 {
                return Err(CoreError::option(
                    "threads",
                    format!("must be between 1 and 1024, got {threads}"),
                ))
                .py();
            }
            let entries = tensors
                .into_iter()
                .map(|(name, file, offset, ggml_type, shape)| TensorEntry {
                    name,
                    file,
                    offset,
                    ggml_type,
                    shape,
                })
                .collect();
            // Owned tensors are copied here, with the GIL held, so the
            // detached load reads Rust memory only.
            let owned = owned
                .into_iter()
                .map(|(name, shape, values)| {
                    let what = format!("owned tensor {name}");
                    let v = borrow::<f32, Ix1>(&values, &what, "float32")?;
                    let copied = v.as_slice()?.to_vec();
                    Ok((name, shape, copied))
                })
                .collect::<PyResult<Vec<_>>>()?;
            let model = detached(py, &[], || {
                let mut model =
                    Store::open(&files, entries, owned).and_then(|s| Model::new(cfg, s))?;
                // Checked first, then copied (when it is): a refused file costs no copy.
                model
                    .weights
                    .store
                    .hold(Residency::from_use_mmap(use_mmap))?;
                Ok::<_, CoreError>(model)
            })
            .py()?;
            let team = crate::engine::team::Team::new(threads).py()?;
            let model = Model {
                activations,
                team: Some(team),
                ..model
            };
            let pool = engine_pool(threads).py()?;
            Ok(Self {
                model: Arc::new(model),
                pool: PerProcess::with(pool),
                threads,
            })
        })
    }

    /// Feed `ids` to `cache` from its current end; logits of the last token
    /// (`[vocab]`), or of every token (`[len(ids), vocab]`) with `all_logits`.
    #[pyo3(signature = (cache, ids, all_logits = false))]
    fn forward<'py>(
        &self,
        py: Python<'py>,
        cache: &Bound<'py, PyAny>,
        ids: &Bound<'py, PyAny>,
        all_logits: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        catch_panics(|| {
            let caches = [kv_cache(cache, "cache")?];
            let ids = ids_array(ids)?;
            let held = pin(ids.as_any())?;
            let ids_s = ids.as_slice()?;
            let mut guards = borrow_all(&caches)?;
            let mut refs: Vec<&mut KvCache> = guards.iter_mut().map(|g| &mut g.inner).collect();
            let out = self.run(py, &[&held], &mut refs, &[ids_s], all_logits)?;
            let vocab = self.model.cfg.vocab_size;
            let arr = PyArray1::from_vec(py, out);
            if all_logits {
                Ok(arr.reshape([ids_s.len(), vocab])?.into_any())
            } else {
                Ok(arr.into_any())
            }
        })
    }

    /// Append `token` to `cache`; the next position's logits `[vocab]`.
    fn decode<'py>(
        &self,
        py: Python<'py>,
        cache: &Bound<'py, PyAny>,
        token: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyArray1<f32>>> {
        catch_panics(|| {
            let caches = [kv_cache(cache, "cache")?];
            let token = token_id(token, "token")?;
            let mut guards = borrow_all(&caches)?;
            let mut refs: Vec<&mut KvCache> = guards.iter_mut().map(|g| &mut g.inner).collect();
            let out = self.run(py, &[], &mut refs, &[&[token]], false)?;
            Ok(PyArray1::from_vec(py, out))
        })
    }

    /// Append `tokens[i]` to `caches[i]` for every i in one pass over the
    /// weights; logits `[len(caches), vocab]`. On error no cache changes.
    fn decode_batch<'py>(
        &self,
        py: Python<'py>,
        caches: Vec<Bound<'py, PyAny>>,
        tokens: Vec<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyArray2<f32>>> {
        catch_panics(|| {
            if caches.len() != tokens.len() {
                return Err(CoreError::Shape(format!(
                    "decode_batch needs one token per cache, got {} caches and {} tokens",
                    caches.len(),
                    tokens.len()
                )))
                .py();
            }
            let vocab = self.model.cfg.vocab_size;
            let caches = caches
                .iter()
                .enumerate()
                .map(|(i, c)| kv_cache(c, &format!("caches[{i}]")))
                .collect::<PyResult<Vec<_>>>()?;
            let tokens = tokens
                .iter()
                .enumerate()
                .map(|(i, t)| token_id(t, &format!("tokens[{i}]")))
                .collect::<PyResult<Vec<_>>>()?;
            let mut guards = borrow_all(&caches)?;
            let mut refs: Vec<&mut KvCache> = guards.iter_mut().map(|g| &mut g.inner).collect();
            let per: Vec<&[i64]> = tokens.iter().map(std::slice::from_ref).collect();
            let out = self.run(py, &[], &mut refs, &per, false)?;
            PyArray1::from_vec(py, out).reshape([tokens.len(), vocab])
        })
    }

    /// The float32 embedding rows of `ids` (`[len(ids), hidden]`).
    fn embed<'py>(
        &self,
        py: Python<'py>,
        ids: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyArray2<f32>>> {
        catch_panics(|| {
            let ids = ids_array(ids)?;
            let ids_s = ids.as_slice()?;
            let out = self.model.embed(ids_s).py()?;
            PyArray1::from_vec(py, out).reshape([ids_s.len(), self.model.cfg.hidden_size])
        })
    }

    /// Threads in this engine's pool.
    #[getter]
    fn threads(&self) -> PyResult<usize> {
        catch_panics(|| Ok(self.threads))
    }

    /// How the model's files are held: `"mapped"` or `"copied"` (into the
    /// process's memory, in huge pages where the OS gives them).
    #[getter]
    fn residency(&self) -> PyResult<&'static str> {
        catch_panics(|| Ok(self.model.weights.store.residency().name()))
    }

    /// How activations meet the weights: `"exact"` or `"q8"`.
    #[getter]
    fn activations(&self) -> PyResult<&'static str> {
        catch_panics(|| Ok(self.model.activations.name()))
    }

    /// Bytes of the memory-mapped weight files.
    #[getter]
    fn mapped_bytes(&self) -> PyResult<usize> {
        catch_panics(|| Ok(self.model.weights.store.nbytes()))
    }
}

/// ggml type ids the engine multiplies in place (others must be dequantised
/// at load by the caller).
#[pyfunction]
pub fn engine_kernel_types() -> PyResult<Vec<u32>> {
    catch_panics(|| {
        Ok((0..64)
            .filter(|&id| crate::engine::linear::Kind::from_ggml(id).is_ok())
            .collect())
    })
}
