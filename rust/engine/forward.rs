//! The forward pass: token chunks of one or many sequences through every
//! block, appending keys and values to each sequence's [`KvCache`].
//!
//! Rows of all sequences are stacked so each projection is one matmul over
//! the weights (prefill chunks and batched decode alike); everything else
//! (norms, RoPE, attention) is computed per row and per sequence, so a
//! row's result does not depend on what else is in the batch.

use ndarray::ArrayView3;
use rayon::prelude::*;

use crate::engine::attention::{attend_group, slice_rows, Scoring, Scratch};
use crate::engine::config::{Config, RopeStyle};
use crate::engine::glu::{glu_in_place, Act};
use crate::engine::linear::{gather, matmul, matmul_many, Activations, Part};
use crate::engine::team::Team;
use crate::engine::weights::{Ffn, Mlp, Store, Tensor, Weights};
use crate::kv::{Dtype, Geometry, Half, KvCache};
use crate::{CoreError, CoreResult};

/// A loaded model: configuration and weights used in place.
#[derive(Debug)]
pub struct Model {
    pub cfg: Config,
    pub weights: Weights,
    /// Exact float32 activations (default) or the 8-bit fast mode.
    pub activations: Activations,
    /// Threads that run a one-token decode step of one sequence as one job
    /// (`crate::engine::decode`); without one, every step runs the general
    /// path in the caller's rayon pool.
    pub team: Option<Team>,
}

/// One sequence's part of a forward call: its cache and its new tokens.
pub struct Step<'a> {
    /// The sequence's cache; the new tokens are appended at its end.
    pub cache: &'a mut KvCache,
    /// Token ids to feed (at least one).
    pub tokens: &'a [i64],
}

impl Model {
    /// Check `cfg`, then gather and shape-check its tensors from `store`.
    pub fn new(cfg: Config, store: Store) -> CoreResult<Self> {
        cfg.validate()?;
        let weights = Weights::gather(&cfg, store)?;
        Ok(Self {
            cfg,
            weights,
            activations: Activations::Exact,
            team: None,
        })
    }

    /// The KV geometry this model's caches have.
    pub fn geometry(&self, dtype: Dtype) -> Geometry {
        Geometry {
            n_layers: self.cfg.n_layers,
            n_kv_heads: self.cfg.n_kv_heads,
            head_dim: self.cfg.head_dim,
            dtype,
        }
    }

    pub(crate) fn mm(&self, t: &Tensor, x: &[f32], out: &mut Vec<f32>) -> CoreResult<()> {
        let n = x.len() / t.cols;
        out.clear();
        out.resize(n * t.rows, 0.0);
        matmul(
            self.activations,
            t.kind,
            self.weights.bytes(t),
            t.rows,
            t.cols,
            x,
            out,
        )
    }

    /// A product with weight `t` writing into `out` (sized by the caller).
    pub(crate) fn part<'a>(&'a self, t: &'a Tensor, out: &'a mut [f32]) -> Part<'a> {
        Part {
            kind: t.kind,
            raw: self.weights.bytes(t),
            rows: t.rows,
            cols: t.cols,
            out,
        }
    }

    /// `x @ t.T` into `out` for every `(t, out)` (weights with `x`'s
    /// columns), as one parallel loop over all their rows (`matmul_many`).
    fn mm_many(&self, x: &[f32], parts: &mut [(&Tensor, &mut Vec<f32>)]) -> CoreResult<()> {
        let mut list: Vec<Part<'_>> = parts
            .iter_mut()
            .map(|(t, out)| {
                let n = x.len() / t.cols;
                out.clear();
                out.resize(n * t.rows, 0.0);
                Part {
                    kind: t.kind,
                    raw: self.weights.bytes(t),
                    rows: t.rows,
                    cols: t.cols,
                    out: out.as_mut_slice(),
                }
            })
            .collect();
        matmul_many(self.activations, x, &mut list)
    }

    /// The float32 embedding rows of `ids`.
    pub fn embed(&self, ids: &[i64]) -> CoreResult<Vec<f32>> {
        let e = &self.weights.embed;
        let mut x = vec![0.0f32; ids.len() * e.cols];
        gather(e.kind, self.weights.bytes(e), e.rows, e.cols, ids, &mut x)?;
        Ok(x)
    }

    /// Run every step's tokens through the model. Returns logits
    /// `[steps, vocab]` of each step's last token, or with `all_logits` (one
    /// step only) `[tokens, vocab]` of every token. On error every cache is
    /// left as it was.
    pub fn forward(&self, steps: &mut [Step<'_>], all_logits: bool) -> CoreResult<Vec<f32>> {
        if steps.is_empty() {
            return Ok(Vec::new());
        }
        if all_logits && steps.len() != 1 {
            return Err(CoreError::option(
                "all_logits",
                "needs exactly one sequence",
            ));
        }
        let want = self.geometry(Dtype::F32);
        let mut starts = Vec::with_capacity(steps.len());
        for (i, s) in steps.iter().enumerate() {
            let g = s.cache.geometry();
            if (g.n_layers, g.n_kv_heads, g.head_dim)
                != (want.n_layers, want.n_kv_heads, want.head_dim)
            {
                return Err(CoreError::SnapshotMismatch(format!(
                    "cache #{i} has (layers, kv_heads, head_dim) = ({}, {}, {}), the model \
                     needs ({}, {}, {})",
                    g.n_layers,
                    g.n_kv_heads,
                    g.head_dim,
                    want.n_layers,
                    want.n_kv_heads,
                    want.head_dim
                )));
            }
            if s.tokens.is_empty() {
                return Err(CoreError::option(
                    "tokens",
                    format!("sequence #{i} has no tokens"),
                ));
            }
            if let Some(&bad) = s
                .tokens
                .iter()
                .find(|&&t| t < 0 || t as usize >= self.cfg.vocab_size)
            {
                return Err(CoreError::TokenOutOfRange {
                    token: bad,
                    vocab: self.cfg.vocab_size,
                });
            }
            let len = s.cache.len();
            for layer in 0..g.n_layers {
                if s.cache.layer_len(layer)? != len {
                    return Err(CoreError::Shape(format!(
                        "cache #{i} is mid forward pass (layer {layer} holds {} tokens, others \
                         {len}); truncate({len}) first",
                        s.cache.layer_len(layer)?
                    )));
                }
            }
            if len + s.tokens.len() > s.cache.max_seq() {
                return Err(CoreError::Capacity {
                    needed: len + s.tokens.len(),
                    capacity: s.cache.max_seq(),
                });
            }
            starts.push(len);
        }
        let out = match &self.team {
            Some(team)
                if !all_logits
                    && self.cfg.uniform_layers()
                    && steps.iter().all(|s| s.tokens.len() == 1) =>
            {
                self.decode_team(team, steps, &starts)
            }
            _ => self.run(steps, &starts, all_logits),
        };
        if out.is_err() {
            for (s, &start) in steps.iter_mut().zip(&starts) {
                s.cache.truncate(start.min(s.cache.len()))?;
            }
        }
        out
    }

    fn run(
        &self,
        steps: &mut [Step<'_>],
        starts: &[usize],
        all_logits: bool,
    ) -> CoreResult<Vec<f32>> {
        let cfg = &self.cfg;
        let (hdim, hd, nkv) = (cfg.hidden_size, cfg.head_dim, cfg.n_kv_heads);
        let qw = cfg.q_width();
        // Row layout: the tokens of step 0, then step 1, ...
        let mut offsets = Vec::with_capacity(steps.len() + 1);
        let mut ids = Vec::new();
        let mut positions = Vec::new();
        for (s, &start) in steps.iter().zip(starts) {
            offsets.push(ids.len());
            ids.extend_from_slice(s.tokens);
            positions.extend(start..start + s.tokens.len());
        }
        offsets.push(ids.len());
        let rows = ids.len();
        let (cos, sin) = rope_tables(cfg, &positions);
        let local = cfg
            .rope_local
            .as_ref()
            .map(|l| rope_tables_for(&l.inv_freq, l.position_scale, &positions));
        let mut x = self.embed(&ids)?;
        scale_embedding(cfg, &mut x);
        let mut h = vec![0.0f32; rows * hdim];
        let (mut q, mut k, mut v) = (Vec::new(), Vec::new(), Vec::new());
        let (mut ctx, mut o) = (vec![0.0f32; rows * qw], Vec::new());
        let (mut gate, mut up, mut down) = (Vec::new(), Vec::new(), Vec::new());
        for (li, lw) in self.weights.layers.iter().enumerate() {
            pre_norm(&x, &lw.attn_norm, cfg, &mut h);
            self.mm_many(&h, &mut [(&lw.q, &mut q), (&lw.k, &mut k), (&lw.v, &mut v)])?;
            for (buf, bias) in [
                (&mut q, &lw.q_bias),
                (&mut k, &lw.k_bias),
                (&mut v, &lw.v_bias),
            ] {
                if let Some(b) = bias {
                    for row in buf.chunks_exact_mut(b.len()) {
                        row.iter_mut().zip(b).for_each(|(y, &c)| *y += c);
                    }
                }
            }
            if let (Some(qn), Some(kn)) = (&lw.q_norm, &lw.k_norm) {
                rms_heads(&mut q, qn, cfg.rms_norm_eps);
                rms_heads(&mut k, kn, cfg.rms_norm_eps);
            }
            let (c, sn) = match &local {
                Some((lc, ls)) if cfg.local_rope(li) => (lc, ls),
                _ => (&cos, &sin),
            };
            if cfg.rotates(li) {
                rope(cfg.rope_style, &mut q, hd, cfg.rope_pairs(), c, sn);
                rope(cfg.rope_style, &mut k, hd, cfg.rope_pairs(), c, sn);
            }
            for (si, s) in steps.iter_mut().enumerate() {
                let (lo, hi) = (offsets[si], offsets[si + 1]);
                s.cache.append(
                    li,
                    head_major(&k, lo, hi, nkv, hd)?,
                    head_major(&v, lo, hi, nkv, hd)?,
                )?;
            }
            let caches: Vec<&KvCache> = steps.iter().map(|s| &*s.cache).collect();
            self.attention(li, &caches, &offsets, &positions, &q, &mut ctx)?;
            self.mm(&lw.o, &ctx, &mut o)?;
            if let Some(b) = &lw.o_bias {
                for row in o.chunks_exact_mut(b.len()) {
                    row.iter_mut().zip(b).for_each(|(y, &c)| *y += c);
                }
            }
            add_residual(
                &mut x,
                &mut o,
                lw.attn_post_norm.as_deref(),
                cfg.rms_norm_eps,
                cfg.residual_scale,
            );
            pre_norm(&x, &lw.ffn_norm, cfg, &mut h);
            match &lw.ffn {
                Ffn::Dense(m) => self.mlp(m, &h, &mut gate, &mut up, &mut down)?,
                Ffn::Moe(m) => self.moe(m, &h, &mut down)?,
            }
            add_residual(
                &mut x,
                &mut down,
                lw.ffn_post_norm.as_deref(),
                cfg.rms_norm_eps,
                cfg.residual_scale,
            );
        }
        // Final norm and head on the rows whose logits are wanted.
        let picked: Vec<usize> = if all_logits {
            (0..rows).collect()
        } else {
            offsets[1..].iter().map(|&end| end - 1).collect()
        };
        let mut last = Vec::with_capacity(picked.len() * hdim);
        for &r in &picked {
            last.extend_from_slice(&x[r * hdim..(r + 1) * hdim]);
        }
        let mut normed = vec![0.0f32; last.len()];
        rms_rows(&last, &self.weights.norm, cfg.rms_norm_eps, &mut normed);
        let mut logits = Vec::new();
        self.mm(self.weights.head(), &normed, &mut logits)?;
        finish_logits(cfg, &mut logits);
        Ok(logits)
    }

    /// `down(act(gate(h)) * up(h))` into `out` (`gate` and `up` are scratch).
    pub(crate) fn mlp(
        &self,
        m: &Mlp,
        h: &[f32],
        gate: &mut Vec<f32>,
        up: &mut Vec<f32>,
        out: &mut Vec<f32>,
    ) -> CoreResult<()> {
        self.mm_many(h, &mut [(&m.gate, gate), (&m.up, up)])?;
        glu_in_place(self.act(), gate, up);
        self.mm(&m.down, gate, out)
    }

    /// The MLP gate's activation.
    pub(crate) fn act(&self) -> Act {
        if self.cfg.block.oai_glu {
            Act::Oai
        } else if self.cfg.block.gelu {
            Act::Gelu
        } else {
            Act::Silu
        }
    }

    /// Causal (optionally windowed) attention of every row's query heads over
    /// its sequence's cached keys and values, into `ctx` (`[rows, q_width]`).
    fn attention(
        &self,
        layer: usize,
        caches: &[&KvCache],
        offsets: &[usize],
        positions: &[usize],
        q: &[f32],
        ctx: &mut [f32],
    ) -> CoreResult<()> {
        let cfg = &self.cfg;
        let (hd, group, qw) = (cfg.head_dim, cfg.group(), cfg.q_width());
        const BLOCK: usize = 16;
        // Tasks: (sequence, kv head, first row, end row).
        let mut tasks = Vec::new();
        for (si, _) in caches.iter().enumerate() {
            for j in 0..cfg.n_kv_heads {
                let mut lo = offsets[si];
                while lo < offsets[si + 1] {
                    let hi = (lo + BLOCK).min(offsets[si + 1]);
                    tasks.push((si, j, lo, hi));
                    lo = hi;
                }
            }
        }
        let sc = Scoring {
            scale: cfg.attn_scale,
            softcap: cfg.attn_softcap,
        };
        let window = cfg.window(layer);
        let sinks = self.weights.layers[layer].sinks.as_deref();
        let results: Vec<CoreResult<Vec<f32>>> = tasks
            .par_iter()
            .map(|&(si, j, lo, hi)| {
                let cache = caches[si];
                let keys = cache.head_rows(layer, Half::Keys, j)?;
                let values = cache.head_rows(layer, Half::Values, j)?;
                let first = window_start(window, positions[lo]);
                let mut out = vec![0.0f32; (hi - lo) * group * hd];
                let mut scratch = Scratch::default();
                for r in lo..hi {
                    let pos = positions[r];
                    let from = window_start(window, pos) - first;
                    let to = pos + 1 - first;
                    let qs: Vec<&[f32]> = (0..group)
                        .map(|g| {
                            let head = j * group + g;
                            &q[r * qw + head * hd..r * qw + (head + 1) * hd]
                        })
                        .collect();
                    let mut dsts: Vec<&mut [f32]> = out
                        [(r - lo) * group * hd..(r - lo + 1) * group * hd]
                        .chunks_exact_mut(hd)
                        .collect();
                    let seg = (
                        slice_rows(keys, first + from, first + to, hd),
                        slice_rows(values, first + from, first + to, hd),
                    );
                    let heads = sinks.map(|s| &s[j * group..(j + 1) * group]);
                    attend_group(&qs, &[seg], hd, sc, heads, &mut scratch, &mut dsts);
                }
                Ok(out)
            })
            .collect();
        for (&(_, j, lo, hi), res) in tasks.iter().zip(results) {
            let res = res?;
            for r in lo..hi {
                let src = &res[(r - lo) * group * hd..(r - lo + 1) * group * hd];
                ctx[r * qw + j * group * hd..r * qw + (j + 1) * group * hd].copy_from_slice(src);
            }
        }
        Ok(())
    }
}

/// Rows `lo..hi` of `[rows, heads * hd]` seen as `[heads, n, hd]`.
pub(crate) fn head_major(
    buf: &[f32],
    lo: usize,
    hi: usize,
    heads: usize,
    hd: usize,
) -> CoreResult<ArrayView3<'_, f32>> {
    ArrayView3::from_shape((hi - lo, heads, hd), &buf[lo * heads * hd..hi * heads * hd])
        .map(|a| a.permuted_axes([1, 0, 2]))
        .map_err(|e| CoreError::Shape(e.to_string()))
}

/// First key position query position `pos` sees.
#[inline]
pub(crate) fn window_start(window: Option<usize>, pos: usize) -> usize {
    match window {
        Some(w) if pos + 1 > w => pos + 1 - w,
        _ => 0,
    }
}

/// The input of attention or the MLP: `x` RMS-normed by `w`, or `x` itself
/// where the block has no pre norms (OLMo 2).
fn pre_norm(x: &[f32], w: &[f32], cfg: &Config, h: &mut [f32]) {
    if cfg.block.no_pre_norms {
        h.copy_from_slice(x);
    } else {
        rms_rows(x, w, cfg.rms_norm_eps, h);
    }
}

/// RMS-normalise each row of `x` (rows of `w.len()`) and scale by `w`.
pub(crate) fn rms_rows(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let n = w.len();
    for (xr, yr) in x.chunks_exact(n).zip(out.chunks_exact_mut(n)) {
        let ms = xr.iter().map(|v| v * v).sum::<f32>() / n as f32;
        let r = 1.0 / (ms + eps).sqrt();
        yr.iter_mut()
            .zip(xr.iter().zip(w))
            .for_each(|(y, (&v, &c))| *y = v * r * c);
    }
}

/// RMS-normalise every head (`w.len()` values) of every row in place.
pub(crate) fn rms_heads(x: &mut [f32], w: &[f32], eps: f32) {
    let n = w.len();
    for head in x.chunks_exact_mut(n) {
        let ms = head.iter().map(|v| v * v).sum::<f32>() / n as f32;
        let r = 1.0 / (ms + eps).sqrt();
        head.iter_mut().zip(w).for_each(|(v, &c)| *v = *v * r * c);
    }
}

/// `x += o`, or with a post norm `w`, `x += rms_norm(o) * w` (`o` is
/// overwritten then); times `scale` before the add when it is not 1.
pub(crate) fn add_residual(
    x: &mut [f32],
    o: &mut [f32],
    post: Option<&[f32]>,
    eps: f32,
    scale: f32,
) {
    if let Some(w) = post {
        let raw = o.to_vec();
        rms_rows(&raw, w, eps, o);
    }
    add_scaled(x, o, scale);
}

/// `x += scale * o` (`x += o` when `scale` is 1, the same bits).
pub(crate) fn add_scaled(x: &mut [f32], o: &[f32], scale: f32) {
    if scale == 1.0 {
        x.iter_mut().zip(o).for_each(|(a, b)| *a += b);
    } else {
        x.iter_mut().zip(o).for_each(|(a, b)| *a += scale * b);
    }
}

/// The logits as the model defines them: divided by `logit_scale`
/// (Granite), then soft-capped (Gemma 2).
pub(crate) fn finish_logits(cfg: &Config, z: &mut [f32]) {
    if cfg.logit_scale != 1.0 {
        let inv = 1.0 / cfg.logit_scale;
        z.iter_mut().for_each(|v| *v *= inv);
    }
    soft_cap(cfg.final_softcap, z);
}

/// Embedding rows times the model's `embed_scale` (Gemma's `sqrt(hidden)`),
/// rounded to float32 first as llama.cpp does.
pub(crate) fn scale_embedding(cfg: &Config, x: &mut [f32]) {
    if cfg.embed_scale != 1.0 {
        let s = cfg.embed_scale;
        x.iter_mut().for_each(|v| *v *= s);
    }
}

/// `z = c * tanh(z / c)` for every value, with a cap `c`.
pub(crate) fn soft_cap(cap: Option<f32>, z: &mut [f32]) {
    if let Some(c) = cap {
        let inv = 1.0 / c;
        z.iter_mut().for_each(|v| *v = c * (*v * inv).tanh());
    }
}

/// cos/sin `[rows, pairs]` at each row's position.
pub(crate) fn rope_tables(cfg: &Config, positions: &[usize]) -> (Vec<f32>, Vec<f32>) {
    let (mut cos, mut sin) =
        rope_tables_for(&cfg.rope_inv_freq, cfg.rope_position_scale, positions);
    if cfg.rope_mscale != 1.0 {
        let m = cfg.rope_mscale;
        for v in cos.iter_mut().chain(sin.iter_mut()) {
            *v = (*v as f64 * m) as f32;
        }
    }
    (cos, sin)
}

/// cos/sin `[rows, inv_freq.len()]` at each row's position divided by `scale`.
pub(crate) fn rope_tables_for(
    inv_freq: &[f64],
    scale: f64,
    positions: &[usize],
) -> (Vec<f32>, Vec<f32>) {
    let half = inv_freq.len();
    let mut cos = Vec::with_capacity(positions.len() * half);
    let mut sin = Vec::with_capacity(positions.len() * half);
    for &p in positions {
        let pos = p as f64 / scale;
        for &f in inv_freq {
            let a = pos * f;
            cos.push(a.cos() as f32);
            sin.push(a.sin() as f32);
        }
    }
    (cos, sin)
}

/// Rotate every head of every row (`x` is `[rows, heads * hd]`): the first
/// `2 * pairs` elements of each head, as `pairs` pairs; the rest pass through
/// (partial RoPE, as llama.cpp's `n_rot` and Hugging Face's
/// `partial_rotary_factor`).
pub(crate) fn rope(
    style: RopeStyle,
    x: &mut [f32],
    hd: usize,
    pairs: usize,
    cos: &[f32],
    sin: &[f32],
) {
    let rows = cos.len() / pairs.max(1);
    if rows == 0 {
        return;
    }
    let width = x.len() / rows;
    for (r, row) in x.chunks_exact_mut(width).enumerate() {
        let (c, s) = (
            &cos[r * pairs..(r + 1) * pairs],
            &sin[r * pairs..(r + 1) * pairs],
        );
        for head in row.chunks_exact_mut(hd) {
            for i in 0..pairs {
                let (a, b) = match style {
                    RopeStyle::Halves => (i, i + pairs),
                    RopeStyle::Interleaved => (2 * i, 2 * i + 1),
                };
                let (x1, x2) = (head[a], head[b]);
                head[a] = x1 * c[i] - x2 * s[i];
                head[b] = x2 * c[i] + x1 * s[i];
            }
        }
    }
}
