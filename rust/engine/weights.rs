//! The model's tensors, used as stored: slices of memory-mapped files (GGUF,
//! safetensors) or, for the rare tensor dequantised once at load, owned
//! float32 bytes. Every tensor is checked against its file before use.
//!
//! A file's bytes stay mapped, or are copied at load into the process's own
//! memory in 2 MiB pages ([`Residency`]): a decode step reads every weight
//! once, and in 4 KiB pages of the file cache its reads miss the TLB page
//! after page (copied in huge pages, SmolLM2-135M decoded 1.02-1.14x faster
//! and a gpt-oss-shaped model 1.10-1.13x; in 4 KiB anonymous pages the
//! latter only 1.04x). llama.cpp copies the tensors it repacks (gpt-oss's
//! experts among them) into its own memory too.

use std::collections::HashMap;
use std::fs::File;
use std::path::PathBuf;

use memmap2::{Mmap, MmapOptions};

use crate::engine::config::{Config, Experts, MAX_EXPERTS};
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

/// How a model's files are held in memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Residency {
    /// Memory-mapped: pages come from the file cache as they are first read
    /// (no load time, shared between processes, evictable under pressure).
    Mapped,
    /// Copied at load into the process's own memory, in 2 MiB pages where
    /// the OS gives them (`madvise(MADV_HUGEPAGE)`).
    Copied,
    /// [`Residency::Copied`] when the OS has transparent huge pages for it
    /// and the files take at most [`AUTO_COPY_MAX`] and half the memory
    /// available, else mapped.
    Auto,
}

/// The most [`Residency::Auto`] copies. A copy's cost is the kernel finding
/// and zeroing fresh huge pages: a 1.8 GB file copied in 0.37-0.42 s on two
/// threads here, but 1.0-2.5 s right after other processes had freed their
/// memory (the kernel compacting it first); so a model past 1 GiB loads
/// mapped, in a fraction of a second, unless copying is asked for.
pub const AUTO_COPY_MAX: u64 = 1 << 30;

impl Residency {
    /// From llama.cpp's `use_mmap`: true maps, false copies, none decides.
    pub fn from_use_mmap(use_mmap: Option<bool>) -> Self {
        match use_mmap {
            Some(true) => Self::Mapped,
            Some(false) => Self::Copied,
            None => Self::Auto,
        }
    }

    /// What [`Residency::Auto`] comes to for `bytes` of files, given the
    /// huge-page mode (the bracketed word of
    /// `/sys/kernel/mm/transparent_hugepage/enabled`) and the memory
    /// available (bytes); the others are themselves.
    pub fn decide(self, bytes: u64, thp_mode: Option<&str>, available: Option<u64>) -> Self {
        match self {
            Self::Auto => {
                let huge = matches!(thp_mode, Some("always" | "madvise"));
                let fits = available.is_some_and(|a| bytes <= (a / 2).min(AUTO_COPY_MAX));
                if huge && fits {
                    Self::Copied
                } else {
                    Self::Mapped
                }
            }
            other => other,
        }
    }

    /// `"mapped"` or `"copied"` (`"auto"` before [`Residency::decide`]).
    pub fn name(self) -> &'static str {
        match self {
            Self::Mapped => "mapped",
            Self::Copied => "copied",
            Self::Auto => "auto",
        }
    }
}

/// This machine's transparent huge page mode (`always`, `madvise`, `never`),
/// where the OS says.
fn thp_mode() -> Option<String> {
    let text = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").ok()?;
    let open = text.find('[')?;
    let close = open + text[open..].find(']')?;
    Some(text[open + 1..close].to_string())
}

/// The memory available for new allocations (`MemAvailable`), in bytes.
fn mem_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kb.checked_mul(1024)
}

/// `map`'s bytes in anonymous memory asked for in huge pages, 64 MiB pieces
/// at a time on as many threads as the machine has (up to 8: most of a
/// copy's time is the kernel finding and zeroing fresh huge pages, which
/// goes in parallel); each piece's file pages are dropped from this
/// process's mapping as it is copied (the file cache keeps them), so the
/// resident set peaks at the copy plus a piece a thread.
fn copy_in(map: &Mmap) -> std::io::Result<Mmap> {
    const PIECE: usize = 64 << 20;
    let mut anon = MmapOptions::new().len(map.len().max(1)).map_anon()?;
    #[cfg(target_os = "linux")]
    {
        // A hint: without huge pages the copy still works, in small ones.
        let _ = anon.advise(memmap2::Advice::HugePage);
    }
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get().min(8));
    let pieces: Vec<(usize, &mut [u8])> = anon[..map.len()]
        .chunks_mut(PIECE)
        .enumerate()
        .map(|(i, dst)| (i * PIECE, dst))
        .collect();
    let next = std::sync::Mutex::new(pieces.into_iter());
    // The lock is held to take a piece only, not while copying it.
    let take = || next.lock().ok().and_then(|mut it| it.next());
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(move || {
                while let Some((at, dst)) = take() {
                    let end = at + dst.len();
                    dst.copy_from_slice(&map[at..end]);
                    #[cfg(unix)]
                    // SAFETY: a read-only file mapping; dropped pages would be
                    // read again from the file if touched (they are not: the
                    // copy replaces the mapping).
                    unsafe {
                        let _ = map.unchecked_advise_range(
                            memmap2::UncheckedAdvice::DontNeed,
                            at,
                            end - at,
                        );
                    }
                }
            });
        }
    });
    anon.make_read_only()
}

/// Every tensor of a model and the mapped files they live in.
pub struct Store {
    maps: Vec<Mmap>,
    tensors: HashMap<String, Tensor>,
    residency: Residency,
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

/// `[rows, cols]` of a vector, a matrix, or a stack of matrices (`[n, rows,
/// cols]`, the experts of a mixture: one matrix of `n * rows` rows, each
/// expert's rows whole and in order, cut apart when gathered).
fn shape_2d(name: &str, shape: &[usize]) -> CoreResult<(usize, usize)> {
    match *shape {
        [n] => Ok((1, n)),
        [r, c] => Ok((r, c)),
        [n, r, c] => n.checked_mul(r).map(|rows| (rows, c)).ok_or_else(|| {
            CoreError::Format(format!("tensor {name} of shape {shape:?} is too large"))
        }),
        _ => Err(CoreError::Format(format!(
            "tensor {name} has shape {shape:?}; the engine reads vectors, matrices and stacks \
             of matrices only"
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
        Ok(Self {
            maps,
            tensors,
            residency: Residency::Mapped,
        })
    }

    /// The files held as `residency` says ([`Residency::Auto`] decided
    /// here, from this machine's huge-page mode and memory available). A
    /// copy that fails (no memory to map) leaves the files mapped when the
    /// choice was automatic, and is an error when it was asked for.
    pub fn hold(&mut self, residency: Residency) -> CoreResult<()> {
        let bytes: u64 = self.maps.iter().map(|m| m.len() as u64).sum();
        let chosen = residency.decide(bytes, thp_mode().as_deref(), mem_available());
        if chosen == Residency::Copied && !self.maps.is_empty() {
            let mut copies = Vec::with_capacity(self.maps.len());
            for map in &self.maps {
                match copy_in(map) {
                    Ok(c) => copies.push(c),
                    Err(_) if residency == Residency::Auto => return Ok(()),
                    Err(e) => {
                        return Err(CoreError::Format(format!(
                            "cannot copy the model's files into memory ({bytes} bytes): {e}; \
                             map them instead (use_mmap=True)"
                        )))
                    }
                }
            }
            self.maps = copies;
        }
        self.residency = if self.maps.is_empty() {
            Residency::Mapped
        } else {
            chosen
        };
        Ok(())
    }

    /// How the files are held: mapped or copied.
    pub fn residency(&self) -> Residency {
        self.residency
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

/// A gated MLP: `down(act(gate(x)) * up(x))`.
#[derive(Debug)]
pub struct Mlp {
    pub gate: Tensor,
    pub up: Tensor,
    pub down: Tensor,
}

/// A block's mixture of experts (`crate::engine::experts`).
#[derive(Debug)]
pub struct Moe {
    /// `[count, hidden]`: one router logit per expert.
    pub router: Tensor,
    /// The experts, in the router's order.
    pub experts: Vec<Mlp>,
    /// Qwen2-MoE's shared expert and its gate vector (`sigmoid(x . gate)`).
    pub shared: Option<(Mlp, Vec<f32>)>,
    /// The router's and every expert's biases (`Experts::biases`: gpt-oss).
    pub biases: Option<ExpertBiases>,
}

/// gpt-oss's biases of a mixture, flat by expert.
#[derive(Debug)]
pub struct ExpertBiases {
    /// `[count]`, added to the router's logits.
    pub router: Vec<f32>,
    /// `[count, ff]` each: added to each expert's gate and up rows.
    pub gate: Vec<f32>,
    pub up: Vec<f32>,
    /// `[count, hidden]`: added to each expert's output.
    pub down: Vec<f32>,
}

/// What follows the MLP norm: a dense MLP or a mixture of experts.
#[derive(Debug)]
pub enum Ffn {
    Dense(Mlp),
    Moe(Moe),
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
    pub ffn: Ffn,
    pub q_bias: Option<Vec<f32>>,
    pub k_bias: Option<Vec<f32>>,
    pub v_bias: Option<Vec<f32>>,
    pub q_norm: Option<Vec<f32>>,
    pub k_norm: Option<Vec<f32>>,
    /// Norms of the attention and MLP outputs (`BlockVariant::post_norms`).
    pub attn_post_norm: Option<Vec<f32>>,
    pub ffn_post_norm: Option<Vec<f32>>,
    /// The output projection's bias (`BlockVariant::o_bias`).
    pub o_bias: Option<Vec<f32>>,
    /// One sink logit a query head (`BlockVariant::attn_sinks`).
    pub sinks: Option<Vec<f32>>,
}

impl Layer {
    /// The dense MLP (what the team's decode runs: `Config::uniform_layers`
    /// excludes mixtures).
    pub fn dense(&self) -> CoreResult<&Mlp> {
        match &self.ffn {
            Ffn::Dense(m) => Ok(m),
            Ffn::Moe(_) => Err(CoreError::Shape(
                "a mixture-of-experts block has no dense MLP".into(),
            )),
        }
    }
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
            // q/k norms a head wide, or the whole projection wide (OLMo).
            let (qn, kn) = if cfg.block.qk_norm_full {
                (qw, kvw)
            } else {
                (hd, hd)
            };
            // The norms before attention and the MLP; none in OLMo 2 (an
            // empty vector, never read).
            let pre_norm = |store: &Store, name: &str| {
                if cfg.block.no_pre_norms {
                    if store.get(name).is_some() {
                        return Err(CoreError::Format(format!(
                            "tensor {name}: this architecture has no norm before its \
                             attention and MLP"
                        )));
                    }
                    return Ok(Vec::new());
                }
                vector(store, name, h, true).map(need)
            };
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
            let ffn = match &cfg.experts {
                Some(e) => Ffn::Moe(gather_moe(&mut store, cfg, e, i)?),
                None => Ffn::Dense(gather_mlp(&mut store, i, "", h, f)?),
            };
            // llama.cpp names gpt-oss's norm before the MLP `post_attention_norm`.
            let ffn_norm_name = if !post
                && store.get(&p("ffn_norm.weight")).is_none()
                && store.get(&p("post_attention_norm.weight")).is_some()
            {
                p("post_attention_norm.weight")
            } else {
                p("ffn_norm.weight")
            };
            layers.push(Layer {
                attn_norm: pre_norm(&store, &p("attn_norm.weight"))?,
                ffn_norm: pre_norm(&store, &ffn_norm_name)?,
                // Read only where the variant has them (the team's decode,
                // which runs the other variants, applies neither).
                o_bias: match cfg.block.o_bias {
                    true => vector(&store, &p("attn_output.bias"), h, true)?,
                    false => None,
                },
                sinks: match cfg.block.attn_sinks {
                    true => vector(&store, &p("attn_sinks.weight"), cfg.n_heads, true)?,
                    false => None,
                },
                q_bias: vector(&store, &p("attn_q.bias"), qw, bias)?,
                k_bias: vector(&store, &p("attn_k.bias"), kvw, bias)?,
                v_bias: vector(&store, &p("attn_v.bias"), kvw, bias)?,
                q_norm: vector(&store, &p("attn_q_norm.weight"), qn, qk)?,
                k_norm: vector(&store, &p("attn_k_norm.weight"), kn, qk)?,
                // Only where the variant has them: gpt-oss's file names its
                // norm before the MLP `post_attention_norm`.
                attn_post_norm: match post {
                    true => vector(&store, &p("post_attention_norm.weight"), h, true)?,
                    false => None,
                },
                ffn_post_norm: match post {
                    true => vector(&store, &p("post_ffw_norm.weight"), h, true)?,
                    false => None,
                },
                q,
                k,
                v,
                o: matrix(&mut store, &p("attn_output.weight"), h, qw)?,
                ffn,
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

/// Take tensor `name` from `store`, checked to be `[rows, cols]`.
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

/// Block `i`'s dense MLP of width `f` (`ffn_gate{suffix}`, `ffn_up{suffix}`,
/// `ffn_down{suffix}`): gate and up as one matrix of 2f rows, gate first
/// (Phi-3), or two.
fn gather_mlp(store: &mut Store, i: usize, suffix: &str, h: usize, f: usize) -> CoreResult<Mlp> {
    let p = |s: &str| format!("blk.{i}.ffn_{s}{suffix}.weight");
    let fused =
        store.get(&p("gate")).is_none() && store.get(&p("up")).is_some_and(|t| t.rows == 2 * f);
    let [gate, up]: [Tensor; 2] = if fused {
        let t = matrix(store, &p("up"), 2 * f, h)?;
        t.split_rows(&[f, f]).try_into().expect("two parts")
    } else {
        [
            matrix(store, &p("gate"), f, h)?,
            matrix(store, &p("up"), f, h)?,
        ]
    };
    let down = matrix(store, &p("down"), h, f)?;
    Ok(Mlp { gate, up, down })
}

/// Block `i`'s experts: the router `ffn_gate_inp`, the experts as stacks
/// (`ffn_gate_exps`, `ffn_up_exps`, `ffn_down_exps`: llama.cpp's converter)
/// or one matrix each (`ffn_gate.{e}`, ...: older Mixtral files, and
/// Hugging Face checkpoints), or gate and up as one stack of `2 * ff` rows
/// an expert (`ffn_gate_up_exps`: Granite MoE's checkpoints), and
/// Qwen2-MoE's shared expert
/// (`ffn_*_shexp`, gated by `ffn_gate_inp_shexp`).
fn gather_moe(store: &mut Store, cfg: &Config, e: &Experts, i: usize) -> CoreResult<Moe> {
    let (h, n, ff) = (cfg.hidden_size, e.count, e.ff);
    let p = |s: &str| format!("blk.{i}.{s}");
    let router = matrix(store, &p("ffn_gate_inp.weight"), n, h)?;
    let mut parts: Vec<Vec<Tensor>> = Vec::with_capacity(3);
    if store.get(&p("ffn_gate_up_exps.weight")).is_some() {
        // Granite MoE's Hugging Face layout: each expert's gate rows, then its up rows.
        let name = p("ffn_gate_up_exps.weight");
        let t = matrix(store, &name, n * 2 * ff, h).map_err(|err| {
            CoreError::Format(format!("{err} (stacked as [{n}, {}, {h}])", 2 * ff))
        })?;
        let (mut gate, mut up) = (Vec::with_capacity(n), Vec::with_capacity(n));
        for (j, part) in t.split_rows(&vec![ff; 2 * n]).into_iter().enumerate() {
            if j % 2 == 0 {
                gate.push(part);
            } else {
                up.push(part);
            }
        }
        parts.push(gate);
        parts.push(up);
    }
    let fused = parts.len();
    for (what, rows, cols) in [("gate", ff, h), ("up", ff, h), ("down", h, ff)]
        .into_iter()
        .skip(fused)
    {
        let name = p(&format!("ffn_{what}_exps.weight"));
        if store.get(&name).is_some() {
            let t = matrix(store, &name, n * rows, cols).map_err(|err| {
                CoreError::Format(format!("{err} (stacked as [{n}, {rows}, {cols}])"))
            })?;
            parts.push(t.split_rows(&vec![rows; n]));
        } else {
            let mut one = Vec::with_capacity(n.min(MAX_EXPERTS));
            for x in 0..n {
                one.push(matrix(
                    store,
                    &p(&format!("ffn_{what}.{x}.weight")),
                    rows,
                    cols,
                )?);
            }
            parts.push(one);
        }
    }
    let (down, up, gate) = (
        parts.pop().expect("three"),
        parts.pop().expect("three"),
        parts.pop().expect("three"),
    );
    let experts = gate
        .into_iter()
        .zip(up)
        .zip(down)
        .map(|((gate, up), down)| Mlp { gate, up, down })
        .collect();
    let shared = if e.shared_ff > 0 {
        let mlp = gather_mlp(store, i, "_shexp", h, e.shared_ff)?;
        let name = p("ffn_gate_inp_shexp.weight");
        let gate = store
            .vector(&name, h)?
            .ok_or_else(|| CoreError::Format(format!("missing tensor {name}")))?;
        Some((mlp, gate))
    } else {
        None
    };
    let biases = if e.biases {
        let need = |name: String, len: usize| {
            store
                .vector(&name, len)?
                .ok_or_else(|| CoreError::Format(format!("missing tensor {name}")))
        };
        Some(ExpertBiases {
            router: need(p("ffn_gate_inp.bias"), n)?,
            gate: need(p("ffn_gate_exps.bias"), n * ff)?,
            up: need(p("ffn_up_exps.bias"), n * ff)?,
            down: need(p("ffn_down_exps.bias"), n * h)?,
        })
    } else {
        None
    };
    Ok(Moe {
        router,
        experts,
        shared,
        biases,
    })
}
