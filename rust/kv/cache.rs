//! The live, appendable KV cache.

use std::sync::Arc;

use ndarray::{ArrayView3, Axis};

use crate::kv::dtype::{convert_f32_to_f16, Dtype};
use crate::kv::slab::{Claim, Half, Slab};
use crate::kv::snapshot::{KvSnapshot, MAX_SEQ_LIMIT};
use crate::{CoreError, CoreResult};

/// Most layers a cache (and so a snapshot file) may have.
pub const MAX_LAYERS: usize = 1 << 12;
/// Most key/value heads per layer.
pub const MAX_KV_HEADS: usize = 1 << 12;
/// Most elements per head.
pub const MAX_HEAD_DIM: usize = 1 << 16;

/// Rows of one head read in place, in the cache's storage dtype.
#[derive(Clone, Copy, Debug)]
pub enum Rows<'a> {
    /// float32 values.
    F32(&'a [f32]),
    /// float16 bits.
    F16(&'a [u16]),
}

/// Shape and storage of a cache: what must match for a snapshot to fit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Geometry {
    /// Transformer layers.
    pub n_layers: usize,
    /// Key/value heads per layer.
    pub n_kv_heads: usize,
    /// Elements per head.
    pub head_dim: usize,
    /// Storage dtype.
    pub dtype: Dtype,
}

impl Geometry {
    /// Check every dimension is at least one and at most a generous bound
    /// (so sizes computed from them cannot overflow).
    pub fn validate(&self) -> CoreResult<()> {
        for (field, value, max) in [
            ("n_layers", self.n_layers, MAX_LAYERS),
            ("n_kv_heads", self.n_kv_heads, MAX_KV_HEADS),
            ("head_dim", self.head_dim, MAX_HEAD_DIM),
        ] {
            if value == 0 || value > max {
                return Err(CoreError::option(
                    field,
                    format!("must be between 1 and {max}, got {value}"),
                ));
            }
        }
        Ok(())
    }

    /// Bytes one token occupies across all layers, keys and values.
    pub fn token_bytes(&self) -> usize {
        2 * self.n_layers * self.n_kv_heads * self.head_dim * self.dtype.itemsize()
    }

    /// Why `other` cannot be restored into a cache of this geometry, if so.
    pub fn mismatch(&self, other: &Self) -> Option<String> {
        if self == other {
            return None;
        }
        Some(format!(
            "snapshot geometry (layers={}, kv_heads={}, head_dim={}, dtype={}) does not match \
             the cache (layers={}, kv_heads={}, head_dim={}, dtype={})",
            other.n_layers,
            other.n_kv_heads,
            other.head_dim,
            other.dtype.name(),
            self.n_layers,
            self.n_kv_heads,
            self.head_dim,
            self.dtype.name(),
        ))
    }
}

/// A per-layer key/value cache with cheap snapshots.
///
/// Each layer's rows live in one [`Slab`]; the cache holds an extent claim
/// on it. Appending writes in place when no snapshot or view covers the rows
/// being written, and otherwise first moves the layer to a fresh slab,
/// copying the rows it keeps (see `docs/kv_cache.md`).
#[derive(Debug)]
pub struct KvCache {
    geometry: Geometry,
    max_seq: usize,
    /// Extent claim of each layer; `None` until the layer first stores rows.
    layers: Vec<Option<Claim>>,
}

impl KvCache {
    /// An empty cache. Memory is allocated per layer on first append.
    pub fn new(geometry: Geometry, max_seq: usize) -> CoreResult<Self> {
        geometry.validate()?;
        if max_seq == 0 || max_seq > MAX_SEQ_LIMIT {
            return Err(CoreError::option(
                "max_seq",
                format!("must be between 1 and {MAX_SEQ_LIMIT}, got {max_seq}"),
            ));
        }
        // Refuse absurd sizes now rather than at the first append (the
        // validated dimensions keep the constant factor from overflowing).
        geometry
            .n_kv_heads
            .checked_mul(max_seq)
            .and_then(|x| x.checked_mul(geometry.head_dim * geometry.dtype.itemsize() * 2))
            .filter(|&b| b <= isize::MAX as usize / 2)
            .ok_or_else(|| CoreError::option("max_seq", "one layer would not fit in memory"))?;
        Ok(Self {
            geometry,
            max_seq,
            layers: (0..geometry.n_layers).map(|_| None).collect(),
        })
    }

    /// Shape and storage dtype.
    pub fn geometry(&self) -> Geometry {
        self.geometry
    }

    /// Tokens each layer can hold.
    pub fn max_seq(&self) -> usize {
        self.max_seq
    }

    fn check_layer(&self, layer: usize) -> CoreResult<()> {
        if layer >= self.geometry.n_layers {
            return Err(CoreError::option(
                "layer",
                format!(
                    "{layer} is out of range for a cache of {} layers",
                    self.geometry.n_layers
                ),
            ));
        }
        Ok(())
    }

    /// Tokens stored in `layer`.
    pub fn layer_len(&self, layer: usize) -> CoreResult<usize> {
        self.check_layer(layer)?;
        Ok(self.layers[layer].as_ref().map_or(0, Claim::len))
    }

    /// Tokens every layer holds (layers may briefly differ mid forward pass).
    pub fn len(&self) -> usize {
        self.layers
            .iter()
            .map(|c| c.as_ref().map_or(0, Claim::len))
            .min()
            .unwrap_or(0)
    }

    /// Whether no layer holds all of some token.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of the rows stored (keys and values, all layers).
    pub fn nbytes(&self) -> usize {
        let per_row = 2 * self.geometry.n_kv_heads * self.geometry.head_dim;
        self.layers
            .iter()
            .map(|c| c.as_ref().map_or(0, Claim::len) * per_row * self.geometry.dtype.itemsize())
            .sum()
    }

    /// Append `n_new` rows to one layer; `k` and `v` are `[n_kv_heads, n_new, head_dim]`
    /// (any strides). On error nothing changes.
    pub fn append(
        &mut self,
        layer: usize,
        k: ArrayView3<'_, f32>,
        v: ArrayView3<'_, f32>,
    ) -> CoreResult<()> {
        self.check_layer(layer)?;
        let g = self.geometry;
        let n_new = k.shape()[1];
        for (name, a) in [("k", &k), ("v", &v)] {
            if a.shape() != [g.n_kv_heads, n_new, g.head_dim] {
                return Err(CoreError::Shape(format!(
                    "{name} must be [n_kv_heads={}, n_new, head_dim={}] with the same n_new as k, \
                     got {:?}",
                    g.n_kv_heads,
                    g.head_dim,
                    a.shape()
                )));
            }
        }
        let start = self.layer_len(layer)?;
        if start + n_new > self.max_seq {
            return Err(CoreError::Capacity {
                needed: start + n_new,
                capacity: self.max_seq,
            });
        }
        if n_new == 0 {
            return Ok(());
        }
        let end = start + n_new;
        let grown = match &mut self.layers[layer] {
            Some(claim) => claim.try_grow(end),
            None => false,
        };
        if !grown {
            let moved = self.moved_layer(layer, end)?;
            self.layers[layer] = Some(moved);
        }
        let slab = Arc::clone(
            self.layers[layer]
                .as_ref()
                .expect("the layer holds an extent after growing")
                .slab(),
        );
        // SAFETY: this cache's extent claim now covers start..end and no
        // other claim reaches past `start`, so these rows are ours alone.
        unsafe {
            write_rows(&slab, Half::Keys, start, &k);
            write_rows(&slab, Half::Values, start, &v);
        }
        Ok(())
    }

    /// A fresh slab holding a copy of `layer`'s current rows, claimed up to `end`.
    fn moved_layer(&self, layer: usize, end: usize) -> CoreResult<Claim> {
        let g = self.geometry;
        let fresh = Arc::new(Slab::new(g.n_kv_heads, self.max_seq, g.head_dim, g.dtype)?);
        if let Some(old) = &self.layers[layer] {
            let keep = old.len();
            for half in [Half::Keys, Half::Values] {
                for head in 0..g.n_kv_heads {
                    // SAFETY: our extent claim covers `keep` rows of the old
                    // slab; the fresh slab is not shared with anyone yet.
                    unsafe {
                        let src = old.slab().rows(half, head, keep);
                        std::ptr::copy_nonoverlapping(
                            src.as_ptr(),
                            fresh.row_ptr(half, head, 0),
                            src.len(),
                        );
                    }
                }
            }
        }
        let mut claim = Claim::extent(fresh, 0);
        let grown = claim.try_grow(end);
        debug_assert!(grown, "a private slab of max_seq rows always grows to end");
        Ok(claim)
    }

    /// Keep the first `n` tokens of every layer. `n` may not exceed [`Self::len`].
    pub fn truncate(&mut self, n: usize) -> CoreResult<()> {
        let len = self.len();
        if n > len {
            return Err(CoreError::option(
                "n",
                format!("cannot truncate to {n} tokens: the cache holds {len}"),
            ));
        }
        for claim in self.layers.iter_mut().flatten() {
            claim.shrink(n);
        }
        Ok(())
    }

    /// Drop every token. The cache keeps its memory for reuse unless a
    /// snapshot or view still shares it.
    pub fn clear(&mut self) {
        for claim in self.layers.iter_mut().flatten() {
            claim.shrink(0);
        }
    }

    /// Freeze the current contents. Costs one claim per layer; no rows are
    /// copied now or by later appends to this cache.
    pub fn snapshot(&self) -> CoreResult<KvSnapshot> {
        let len = self.len();
        let mut layers = Vec::with_capacity(self.layers.len());
        for (i, claim) in self.layers.iter().enumerate() {
            let held = claim.as_ref().map_or(0, Claim::len);
            if held != len {
                return Err(CoreError::Shape(format!(
                    "cannot snapshot mid forward pass: layer {i} holds {held} tokens but \
                     layer-wise minimum is {len}; finish the step or truncate({len})"
                )));
            }
            layers.push(claim.as_ref().filter(|_| len > 0).map(|c| c.share(len)));
        }
        Ok(KvSnapshot::from_claims(
            self.geometry,
            self.max_seq,
            len,
            layers,
        ))
    }

    /// Replace the contents with a snapshot's. Costs one claim per layer.
    pub fn restore(&mut self, snap: &KvSnapshot) -> CoreResult<()> {
        if let Some(why) = self.geometry.mismatch(&snap.geometry()) {
            return Err(CoreError::SnapshotMismatch(why));
        }
        if snap.len() > self.max_seq {
            return Err(CoreError::SnapshotMismatch(format!(
                "snapshot holds {} tokens, more than this cache's max_seq={}",
                snap.len(),
                self.max_seq
            )));
        }
        for (slot, claim) in self.layers.iter_mut().zip(snap.claims()) {
            *slot = claim
                .as_ref()
                .map(|c| Claim::extent(Arc::clone(c.slab()), c.len()));
        }
        Ok(())
    }

    /// The stored rows of one head of one layer, `[layer_len, head_dim]`
    /// row-major in the storage dtype (what attention reads in place).
    /// Empty for a layer that holds nothing yet.
    pub fn head_rows(&self, layer: usize, half: Half, head: usize) -> CoreResult<Rows<'_>> {
        self.check_layer(layer)?;
        if head >= self.geometry.n_kv_heads {
            return Err(CoreError::option(
                "head",
                format!(
                    "{head} is out of range for {} kv heads",
                    self.geometry.n_kv_heads
                ),
            ));
        }
        let Some(claim) = self.layers[layer].as_ref() else {
            return Ok(match self.geometry.dtype {
                Dtype::F32 => Rows::F32(&[]),
                Dtype::F16 => Rows::F16(&[]),
            });
        };
        let n = claim.len() * self.geometry.head_dim;
        // SAFETY: this cache's own extent claim covers `claim.len()` rows,
        // which were written and cannot change while `&self` is borrowed
        // (writes need `&mut self`). Slab rows are aligned to 64 bytes and
        // row starts are multiples of the element size.
        unsafe {
            let bytes = claim.slab().rows(half, head, claim.len());
            Ok(match self.geometry.dtype {
                Dtype::F32 => Rows::F32(std::slice::from_raw_parts(bytes.as_ptr().cast(), n)),
                Dtype::F16 => Rows::F16(std::slice::from_raw_parts(bytes.as_ptr().cast(), n)),
            })
        }
    }

    /// A claim on `layer`'s filled rows, keeping them unchanged while it lives
    /// (what a view handed out needs). `None` for an empty layer.
    pub fn claim_layer(&self, layer: usize) -> CoreResult<Option<Claim>> {
        self.check_layer(layer)?;
        Ok(self.layers[layer]
            .as_ref()
            .filter(|c| !c.is_empty())
            .map(|c| c.share(c.len())))
    }
}

/// Copy `src` (`[heads, n, head_dim]`, any strides) into rows `start..` of `half`.
///
/// # Safety
/// The caller exclusively owns rows `start..start + n` of the slab.
unsafe fn write_rows(slab: &Slab, half: Half, start: usize, src: &ArrayView3<'_, f32>) {
    let d = src.shape()[2];
    let mut scratch: Vec<f32> = Vec::new();
    for (head, rows) in src.axis_iter(Axis(0)).enumerate() {
        if let Some(all) = rows.as_slice() {
            // SAFETY: the caller owns these rows.
            unsafe { store(slab, slab.row_ptr(half, head, start), all) };
            continue;
        }
        for (t, row) in rows.axis_iter(Axis(0)).enumerate() {
            let values = match row.as_slice() {
                Some(s) => s,
                None => {
                    scratch.clear();
                    scratch.extend(row.iter().copied());
                    &scratch[..]
                }
            };
            debug_assert_eq!(values.len(), d);
            // SAFETY: the caller owns these rows.
            unsafe { store(slab, slab.row_ptr(half, head, start + t), values) };
        }
    }
}

/// Store float32 `values` at `dst` in the slab's dtype.
///
/// # Safety
/// `dst` points into rows of `slab` the caller owns, with room for `values`.
unsafe fn store(slab: &Slab, dst: *mut u8, values: &[f32]) {
    match slab.dtype() {
        // SAFETY: room for values.len() elements (caller); slab rows are
        // aligned to the element size.
        Dtype::F32 => unsafe {
            std::ptr::copy_nonoverlapping(values.as_ptr(), dst.cast::<f32>(), values.len());
        },
        Dtype::F16 => {
            // SAFETY: as above; the rows are exclusively ours.
            let out = unsafe { std::slice::from_raw_parts_mut(dst.cast::<u16>(), values.len()) };
            convert_f32_to_f16(values, out);
        }
    }
}
