//! Immutable KV snapshots and their byte layout on disk and in pickles.

use std::io::{Read, Write};
use std::sync::Arc;

use crate::kv::cache::Geometry;
use crate::kv::dtype::Dtype;
use crate::kv::slab::{Claim, Half, Slab, HUGE_PAGE};
use crate::{CoreError, CoreResult};

/// Token granularity of storage accounting (see `docs/kv_cache.md`).
pub const BLOCK_TOKENS: usize = 16;

const STATE_MAGIC: &[u8; 8] = b"RLXKVSN1";
const STATE_HEADER: usize = 8 + 6 * 8;

/// Largest capacity a cache may have, and so a snapshot read from outside
/// (16M tokens): storage is reserved up front, so a hostile header must not
/// pick it freely, and a cache must not hold what no file could give back.
pub const MAX_SEQ_LIMIT: usize = 1 << 24;

/// The first `len` tokens of every layer of a cache, frozen.
///
/// Holds a claim per layer on the slab the rows live in, so the rows are
/// shared with the cache that produced it (and with any cache it is restored
/// into) and never change while the snapshot lives.
#[derive(Debug)]
pub struct KvSnapshot {
    geometry: Geometry,
    max_seq: usize,
    len: usize,
    layers: Vec<Option<Claim>>,
}

/// One shared storage unit a snapshot holds rows of, for counting memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StorageUse {
    /// Identity of the slab (unique within the process).
    pub slab: u64,
    /// Blocks of [`BLOCK_TOKENS`] tokens the snapshot needs from it.
    pub blocks: usize,
    /// Bytes of one block (keys and values of every head).
    pub block_bytes: usize,
}

impl KvSnapshot {
    pub(crate) fn from_claims(
        geometry: Geometry,
        max_seq: usize,
        len: usize,
        layers: Vec<Option<Claim>>,
    ) -> Self {
        debug_assert_eq!(layers.len(), geometry.n_layers);
        Self {
            geometry,
            max_seq,
            len,
            layers,
        }
    }

    /// Shape and storage dtype.
    pub fn geometry(&self) -> Geometry {
        self.geometry
    }

    /// Capacity of the cache the snapshot came from.
    pub fn max_seq(&self) -> usize {
        self.max_seq
    }

    /// Tokens held (the same in every layer).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the snapshot holds no token.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes of the rows held (keys and values, all layers).
    pub fn nbytes(&self) -> usize {
        self.len * self.geometry.token_bytes()
    }

    pub(crate) fn claims(&self) -> &[Option<Claim>] {
        &self.layers
    }

    /// A claim on one layer's rows (what a view handed out needs).
    pub fn claim_layer(&self, layer: usize) -> CoreResult<Option<Claim>> {
        let claim = self.layers.get(layer).ok_or_else(|| {
            CoreError::option(
                "layer",
                format!(
                    "{layer} is out of range for a snapshot of {} layers",
                    self.geometry.n_layers
                ),
            )
        })?;
        Ok(claim.as_ref().map(|c| c.share(c.len())))
    }

    /// The first `len` tokens of this snapshot, sharing its rows (no copy).
    pub fn prefix(&self, len: usize) -> CoreResult<Self> {
        if len > self.len {
            return Err(CoreError::option(
                "len",
                format!("{len} is longer than the snapshot's {} tokens", self.len),
            ));
        }
        let layers = self
            .layers
            .iter()
            .map(|c| c.as_ref().filter(|_| len > 0).map(|c| c.share(len)))
            .collect();
        Ok(Self::from_claims(self.geometry, self.max_seq, len, layers))
    }

    /// The storage this snapshot pins, per layer, in whole blocks.
    pub fn storage(&self) -> Vec<StorageUse> {
        let g = self.geometry;
        let block_bytes = BLOCK_TOKENS * 2 * g.n_kv_heads * g.head_dim * g.dtype.itemsize();
        self.layers
            .iter()
            .flatten()
            .map(|c| StorageUse {
                slab: c.slab().id(),
                blocks: c.len().div_ceil(BLOCK_TOKENS),
                block_bytes,
            })
            .collect()
    }

    /// Write the rows as raw little-endian tensors, in the order layer 0
    /// keys, layer 0 values, layer 1 keys, ... each `[n_kv_heads, len, head_dim]`
    /// C-contiguous. Straight from the shared storage, no staging copy.
    pub fn write_data(&self, out: &mut impl Write) -> CoreResult<()> {
        check_little_endian()?;
        for claim in self.layers.iter().flatten() {
            for half in [Half::Keys, Half::Values] {
                for head in 0..self.geometry.n_kv_heads {
                    // SAFETY: our claim covers `len` rows of this slab.
                    let rows = unsafe { claim.slab().rows(half, head, self.len) };
                    out.write_all(rows).map_err(io_error)?;
                }
            }
        }
        Ok(())
    }

    /// Read rows written by [`Self::write_data`] into fresh storage with
    /// room for `max_seq` tokens, so a cache restored from it appends in place.
    pub fn read_data(
        geometry: Geometry,
        max_seq: usize,
        len: usize,
        input: &mut impl Read,
    ) -> CoreResult<Self> {
        check_little_endian()?;
        geometry
            .validate()
            .map_err(|e| CoreError::Format(format!("snapshot geometry: {e}")))?;
        if max_seq == 0 || len > max_seq || max_seq > MAX_SEQ_LIMIT {
            return Err(CoreError::Format(format!(
                "snapshot of {len} tokens cannot come from a cache of max_seq={max_seq}"
            )));
        }
        let mut layers = Vec::with_capacity(geometry.n_layers);
        for _ in 0..geometry.n_layers {
            if len == 0 {
                layers.push(None);
                continue;
            }
            let (h, d, t) = (geometry.n_kv_heads, geometry.head_dim, geometry.dtype);
            // Room for the `len` rows the input holds, not for `max_seq`: the
            // reservation is bounded by what the caller checked is there (a
            // 32 KB state claiming max_seq = 2^24 over 4096 layers reserved
            // 512 GiB). A cache restored from it that grows past `len` moves
            // the layer to a slab of its own `max_seq` once (`KvCache::append`).
            // Huge pages when each head's rows fill at least one: at most half
            // of the committed memory is slack, and filling is 4-5x faster.
            let slab = if len * d * t.itemsize() >= HUGE_PAGE {
                Slab::new_huge(h, len, d, t)?
            } else {
                Slab::new(h, len, d, t)?
            };
            let slab = Arc::new(slab);
            for half in [Half::Keys, Half::Values] {
                for head in 0..geometry.n_kv_heads {
                    // SAFETY: the slab is fresh and private; the rows fit.
                    let dst = unsafe {
                        std::slice::from_raw_parts_mut(
                            slab.row_ptr(half, head, 0),
                            len * slab.row_bytes(),
                        )
                    };
                    input.read_exact(dst).map_err(|e| {
                        CoreError::Format(format!("snapshot data is truncated or unreadable: {e}"))
                    })?;
                }
            }
            let mut claim = Claim::new(slab, 0);
            let grown = claim.try_grow(len);
            debug_assert!(grown);
            layers.push(Some(claim));
        }
        Ok(Self::from_claims(geometry, max_seq, len, layers))
    }

    /// Length of [`Self::write_state`]'s output.
    pub fn state_len(&self) -> usize {
        STATE_HEADER + self.nbytes()
    }

    /// Self-describing bytes: a small header, then [`Self::write_data`].
    pub fn write_state(&self, out: &mut impl Write) -> CoreResult<()> {
        let g = self.geometry;
        let dtype = match g.dtype {
            Dtype::F32 => 0u64,
            Dtype::F16 => 1,
        };
        out.write_all(STATE_MAGIC).map_err(io_error)?;
        for x in [
            g.n_layers as u64,
            g.n_kv_heads as u64,
            g.head_dim as u64,
            dtype,
            self.max_seq as u64,
            self.len as u64,
        ] {
            out.write_all(&x.to_le_bytes()).map_err(io_error)?;
        }
        self.write_data(out)
    }

    /// [`Self::write_state`] into a new vector.
    pub fn to_state(&self) -> CoreResult<Vec<u8>> {
        let mut out = Vec::with_capacity(self.state_len());
        self.write_state(&mut out)?;
        Ok(out)
    }

    /// Inverse of [`Self::to_state`]; refuses anything malformed.
    pub fn from_state(state: &[u8]) -> CoreResult<Self> {
        let bad = |why: &str| CoreError::Format(format!("not a KV snapshot state: {why}"));
        if state.len() < STATE_HEADER || &state[..8] != STATE_MAGIC {
            return Err(bad("missing header"));
        }
        let field = |i: usize| -> CoreResult<usize> {
            let bytes: [u8; 8] = state[8 + 8 * i..16 + 8 * i]
                .try_into()
                .map_err(|_| bad("short header"))?;
            usize::try_from(u64::from_le_bytes(bytes)).map_err(|_| bad("field too large"))
        };
        let dtype = match field(3)? {
            0 => Dtype::F32,
            1 => Dtype::F16,
            _ => return Err(bad("unknown dtype")),
        };
        let geometry = Geometry {
            n_layers: field(0)?,
            n_kv_heads: field(1)?,
            head_dim: field(2)?,
            dtype,
        };
        let (max_seq, len) = (field(4)?, field(5)?);
        geometry
            .validate()
            .map_err(|e| bad(&format!("bad geometry: {e}")))?;
        let expected = geometry
            .n_kv_heads
            .checked_mul(len)
            .and_then(|x| x.checked_mul(geometry.head_dim * geometry.dtype.itemsize()))
            .and_then(|x| x.checked_mul(2 * geometry.n_layers))
            .ok_or_else(|| bad("sizes overflow"))?;
        let body = &state[STATE_HEADER..];
        if body.len() != expected {
            return Err(bad(&format!(
                "expected {expected} bytes of rows, found {}",
                body.len()
            )));
        }
        Self::read_data(geometry, max_seq, len, &mut &body[..])
    }
}

fn io_error(e: std::io::Error) -> CoreError {
    CoreError::Io(format!("could not write snapshot data: {e}"))
}

fn check_little_endian() -> CoreResult<()> {
    if cfg!(target_endian = "big") {
        return Err(CoreError::Format(
            "snapshot files are little-endian; big-endian hosts are not supported".into(),
        ));
    }
    Ok(())
}
