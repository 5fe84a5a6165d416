//! The model's tensors, used as stored: slices of memory-mapped files (GGUF,
//! safetensors) or, for the rare tensor dequantised once at load, owned
//! float32 bytes. Every tensor is checked against its file before use.

use std::collections::HashMap;
use std::fs::File;
use std::path::PathBuf;

use memmap2::Mmap;

use crate::engine::config::Config;
use crate::engine::linear::Kind;
use crate::{CoreError, CoreResult};

/// Where one tensor's bytes are.
#[derive(Debug)]
enum Source {
    /// `len` bytes at `offset` of mapped file `file`.
    Mapped {
        file: usize,
        offset: usize,
        len: usize,
    },
    /// Bytes owned by the engine (tensors dequantised at load).
    Owned(Vec<u8>),
}

/// One entry of the tensor table a loader hands over.
#[derive(Clone, Debug)]
pub struct TensorEntry {
    /// llama.cpp's name (`blk.0.attn_q.weight`, `token_embd.weight`, ...).
    pub name: String,
    /// Index into the file list.
    pub file: usize,
    /// Absolute byte offset of the data in that file.
    pub offset: u64,
    /// ggml type id of the data.
    pub ggml_type: u32,
    /// Row-major shape: `[rows, cols]` for a matrix, `[n]` for a vector.
    pub shape: Vec<usize>,
}

/// A matrix `[rows, cols]` (or a vector: one row) in its stored type.
#[derive(Debug)]
pub struct Tensor {
    /// Storage type.
    pub kind: Kind,
    /// Rows (output features of a projection).
    pub rows: usize,
    /// Columns (input features).
    pub cols: usize,
    source: Source,
}

impl Tensor {
    /// The matrix cut into consecutive row ranges of `counts` rows (which add
    /// up to its rows): a fused projection (Phi-3's `attn_qkv`, its `ffn_up`
    /// holding gate and up) as its parts. Rows are stored whole and in order,
    /// so a mapped tensor's parts point into the same bytes, no copy.
    fn split_rows(self, counts: &[usize]) -> Vec<Tensor> {
        debug_assert_eq!(counts.iter().sum::<usize>(), self.rows);
        let row_bytes = match &self.source {
            Source::Mapped { len, .. } => len / self.rows,
            Source::Owned(v) => v.len() / self.rows,
        };
        let mut out = Vec::with_capacity(counts.len());
        let mut at = 0usize;
        for &rows in counts {
            let (lo, n) = (at * row_bytes, rows * row_bytes);
            let source = match &self.source {
                Source::Mapped { file, offset, .. } => Source::Mapped {
                    file: *file,
                    offset: offset + lo,
                    len: n,
                },
                Source::Owned(v) => Source::Owned(v[lo..lo + n].to_vec()),
            };
            out.push(Tensor {
                kind: self.kind,
                rows,
                cols: self.cols,
                source,
            });
            at += rows;
        }
        out
    }
}

/// Every tensor of a model and the mapped files they live in.
pub struct Store {
    maps: Vec<Mmap>,
    tensors: HashMap<String, Tensor>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Store({} files, {} tensors)",
            self.maps.len(),
            self.tensors.len()
        )
    }
}

fn shape_2d(name: &str, shape: &[usize]) -> CoreResult<(usize, usize)> {
    match *shape {
        [n] => Ok((1, n)),
        [r, c] => Ok((r, c)),
        _ => Err(CoreError::Format(format!(
            "tensor {name} has shape {shape:?}; the engine reads vectors and matrices only"
        ))),
    }
}

impl Store {
    /// Map `files` and check every entry lies inside its file with the size
    /// its type and shape imply. `owned` are float32 tensors `(name, shape,
    /// values)` dequantised by the loader.
    pub fn open(
        files: &[PathBuf],
        entries: Vec<TensorEntry>,
        owned: Vec<(String, Vec<usize>, Vec<f32>)>,
    ) -> CoreResult<Self> {
        let mut maps = Vec::with_capacity(files.len());
        for path in files {
            let file = File::open(path)
                .map_err(|e| CoreError::Format(format!("{}: {e}", path.display())))?;
            // SAFETY: the map is read-only. Like every mmap-based loader
            // (llama.cpp, safetensors), we rely on the file not being
            // truncated or rewritten while the model is loaded.
            let map = unsafe { Mmap::map(&file) }
                .map_err(|e| CoreError::Format(format!("{}: cannot map: {e}", path.display())))?;
            maps.push(map);
        }
        let mut tensors = HashMap::with_capacity(entries.len() + owned.len());
        for e in entries {
            let kind = Kind::from_ggml(e.ggml_type).map_err(|_| {
                CoreError::Format(format!(
                    "tensor {} has ggml type {}, which the engine has no kernel for",
                    e.name, e.ggml_type
                ))
            })?;
            let (rows, cols) = shape_2d(&e.name, &e.shape)?;
            let len = kind
                .row_bytes(cols)
                .ok()
                .and_then(|rb| rb.checked_mul(rows))
                .ok_or_else(|| {
                    CoreError::Format(format!(
                        "tensor {} of shape {:?} is not a whole number of {:?} blocks",
                        e.name, e.shape, kind
                    ))
                })?;
            let map = maps.get(e.file).ok_or_else(|| {
                CoreError::Format(format!("tensor {} names file #{}", e.name, e.file))
            })?;
            let offset = usize::try_from(e.offset).unwrap_or(usize::MAX);
            let end = offset.checked_add(len).filter(|&end| end <= map.len());
            if end.is_none() {
                return Err(CoreError::Format(format!(
                    "truncated: tensor {} needs bytes {}..{}+{len}, but {} has {} bytes",
                    e.name,
                    e.offset,
                    e.offset,
                    files[e.file].display(),
                    map.len()
                )));
            }
            let source = Source::Mapped {
                file: e.file,
                offset,
                len,
            };
            if tensors
                .insert(
                    e.name.clone(),
                    Tensor {
                        kind,
                        rows,
                        cols,
                        source,
                    },
                )
                .is_some()
            {
                return Err(CoreError::Format(format!("duplicate tensor {}", e.name)));
            }
        }
        for (name, shape, values) in owned {
            let (rows, cols) = shape_2d(&name, &shape)?;
            if values.len() != rows * cols {
                return Err(CoreError::Shape(format!(
                    "tensor {name}: {} values for shape {shape:?}",
                    values.len()
                )));
            }
            let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
            tensors.insert(
                name,
                Tensor {
                    kind: Kind::F32,
                    rows,
                    cols,
                    source: Source::Owned(bytes),
                },
            );
        }
        Ok(Self { maps, tensors })
    }

    /// The bytes of `t`.
    pub fn bytes<'a>(&'a self, t: &'a Tensor) -> &'a [u8] {
        match &t.source {
            Source::Mapped { file, offset, len } => &self.maps[*file][*offset..*offset + *len],
            Source::Owned(v) => v,
        }
    }

    /// A tensor by name, if present.
    pub fn get(&self, name: &str) -> Option<&Tensor> {
        self.tensors.get(name)
    }

    /// Remove and return a tensor (the model takes ownership of what it uses).
    pub fn take(&mut self, name: &str) -> Option<Tensor> {
        self.tensors.remove(name)
    }

    /// Bytes of mapped files and owned tensors.
    pub fn nbytes(&self) -> usize {
        self.maps.iter().map(|m| m.len()).sum::<usize>()
    }

    /// Names of the tensors still in the table (for "unused tensor" checks).
    pub fn names(&self) -> Vec<String> {
        self.tensors.keys().cloned().collect()
    }

    /// A float32 vector of `n` values from tensor `name` (any float type).
    pub fn vector(&self, name: &str, n: usize) -> CoreResult<Option<Vec<f32>>> {
        let Some(t) = self.tensors.get(name) else {
            return Ok(None);
        };
        if t.rows * t.cols != n {
            return Err(CoreError::Format(format!(
                "tensor {name} has {} values, expected {n}",
                t.rows * t.cols
            )));
        }
        let mut out = vec![0.0f32; n];
        let rows = t.rows;
        let raw = self.bytes(t);
        let ids: Vec<i64> = (0..rows as i64).collect();
        crate::engine::linear::gather(t.kind, raw, rows, t.cols, &ids, &mut out)?;
        Ok(Some(out))
    }
}

/// One block's weights.
#[derive(Debug)]
pub struct Layer {
    pub attn_norm: Vec<f32>,
    pub q: Tensor,
    pub k: Tensor,
    pub v: Tensor,
    pub o: Tensor,
    pub ffn_norm: Vec<f32>,
    pub gate: Tensor,
    pub up: Tensor,
    pub down: Tensor,
    pub q_bias: Option<Vec<f32>>,
    pub k_bias: Option<Vec<f32>>,
    pub v_bias: Option<Vec<f32>>,
    pub q_norm: Option<Vec<f32>>,
    pub k_norm: Option<Vec<f32>>,
    /// Norms of the attention and MLP outputs (`BlockVariant::post_norms`).
    pub attn_post_norm: Option<Vec<f32>>,
    pub ffn_post_norm: Option<Vec<f32>>,
}

/// All weights of a model.
#[derive(Debug)]
pub struct Weights {
    pub store: Store,
    pub embed: Tensor,
    pub layers: Vec<Layer>,
    pub norm: Vec<f32>,
    /// The output head; `None` when tied to the embedding.
    pub output: Option<Tensor>,
}

impl Weights {
    /// Collect and shape-check every tensor `cfg` needs, by llama.cpp name.
    pub fn gather(cfg: &Config, mut store: Store) -> CoreResult<Self> {
        let (h, f, hd) = (cfg.hidden_size, cfg.intermediate_size, cfg.head_dim);
        let (qw, kvw) = (cfg.q_width(), cfg.kv_width());
        fn matrix(store: &mut Store, name: &str, rows: usize, cols: usize) -> CoreResult<Tensor> {
            let t = store
                .take(name)
                .ok_or_else(|| CoreError::Format(format!("missing tensor {name}")))?;
            if (t.rows, t.cols) != (rows, cols) {
                return Err(CoreError::Format(format!(
                    "tensor {name} has shape ({}, {}), expected ({rows}, {cols})",
                    t.rows, t.cols
                )));
            }
            Ok(t)
        }
        let vector = |store: &Store, name: &str, n: usize, required: bool| {
            let v = store.vector(name, n)?;
            if v.is_none() && required {
                return Err(CoreError::Format(format!("missing tensor {name}")));
            }
            Ok::<_, CoreError>(v)
        };
        let need = |v: Option<Vec<f32>>| v.expect("required vectors are checked present");
        // Capacity grows as blocks are found: a lying block count reserves nothing.
        let mut layers = Vec::with_capacity(cfg.n_layers.min(256));
        for i in 0..cfg.n_layers {
            let p = |s: &str| format!("blk.{i}.{s}");
            let bias = cfg.block.qkv_bias;
            let qk = cfg.block.qk_norm;
            let post = cfg.block.post_norms;
            // q, k and v as one matrix (Phi-3's attn_qkv) or three.
            let [q, k, v]: [Tensor; 3] = if store.get(&p("attn_qkv.weight")).is_some() {
                let t = matrix(&mut store, &p("attn_qkv.weight"), qw + 2 * kvw, h)?;
                t.split_rows(&[qw, kvw, kvw])
                    .try_into()
                    .expect("three parts")
            } else {
                [
                    matrix(&mut store, &p("attn_q.weight"), qw, h)?,
                    matrix(&mut store, &p("attn_k.weight"), kvw, h)?,
                    matrix(&mut store, &p("attn_v.weight"), kvw, h)?,
                ]
            };
            // gate and up as one matrix of 2f rows, gate first (Phi-3), or two.
            let fused = store.get(&p("ffn_gate.weight")).is_none()
                && store
                    .get(&p("ffn_up.weight"))
                    .is_some_and(|t| t.rows == 2 * f);
            let [gate, up]: [Tensor; 2] = if fused {
                let t = matrix(&mut store, &p("ffn_up.weight"), 2 * f, h)?;
                t.split_rows(&[f, f]).try_into().expect("two parts")
            } else {
                [
                    matrix(&mut store, &p("ffn_gate.weight"), f, h)?,
                    matrix(&mut store, &p("ffn_up.weight"), f, h)?,
                ]
            };
            layers.push(Layer {
                attn_norm: need(vector(&store, &p("attn_norm.weight"), h, true)?),
                ffn_norm: need(vector(&store, &p("ffn_norm.weight"), h, true)?),
                q_bias: vector(&store, &p("attn_q.bias"), qw, bias)?,
                k_bias: vector(&store, &p("attn_k.bias"), kvw, bias)?,
                v_bias: vector(&store, &p("attn_v.bias"), kvw, bias)?,
                q_norm: vector(&store, &p("attn_q_norm.weight"), hd, qk)?,
                k_norm: vector(&store, &p("attn_k_norm.weight"), hd, qk)?,
                attn_post_norm: vector(&store, &p("post_attention_norm.weight"), h, post)?,
                ffn_post_norm: vector(&store, &p("post_ffw_norm.weight"), h, post)?,
                q,
                k,
                v,
                o: matrix(&mut store, &p("attn_output.weight"), h, qw)?,
                gate,
                up,
                down: matrix(&mut store, &p("ffn_down.weight"), h, f)?,
            });
        }
        // Blocks beyond the configured count would be ignored silently: the
        // header lies about the block count, so the model would run short.
        let mut extra: Vec<String> = store
            .names()
            .into_iter()
            .filter(|n| {
                n.strip_prefix("blk.")
                    .and_then(|rest| rest.split('.').next())
                    .and_then(|i| i.parse::<usize>().ok())
                    .is_some_and(|i| i >= cfg.n_layers)
            })
            .collect();
        if !extra.is_empty() {
            extra.sort();
            return Err(CoreError::Format(format!(
                "the configuration has {} blocks but the file has tensors of more ({}{})",
                cfg.n_layers,
                extra[0],
                if extra.len() > 1 { ", ..." } else { "" }
            )));
        }
        let norm = need(vector(&store, "output_norm.weight", h, true)?);
        let embed = matrix(&mut store, "token_embd.weight", cfg.vocab_size, h)?;
        let output = if store.get("output.weight").is_some() {
            Some(matrix(&mut store, "output.weight", cfg.vocab_size, h)?)
        } else {
            None
        };
        Ok(Self {
            store,
            embed,
            layers,
            norm,
            output,
        })
    }

    /// The bytes of `t`.
    pub fn bytes<'a>(&'a self, t: &'a Tensor) -> &'a [u8] {
        self.store.bytes(t)
    }

    /// The output head (the embedding when tied).
    pub fn head(&self) -> &Tensor {
        self.output.as_ref().unwrap_or(&self.embed)
    }
}
