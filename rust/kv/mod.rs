//! The KV cache: per-layer contiguous storage that snapshots share.
//!
//! Each layer's keys and values live in one fixed-capacity [`slab::Slab`], laid
//! out `[n_kv_heads, max_seq, head_dim]` so the filled part is one strided
//! array (a zero-copy numpy view). Sharing is tracked with prefix *claims*:
//! a snapshot, a view or a cache's own extent each promise that rows `0..len`
//! stay unchanged. A cache writes in place when no one else's claim reaches
//! the rows it writes, and otherwise moves that layer to a fresh slab first.
//! `docs/kv_cache.md` spells out when copies happen and why.

mod cache;
mod dtype;
mod slab;
mod snapshot;

pub use cache::{Geometry, KvCache, Rows, MAX_HEAD_DIM, MAX_KV_HEADS, MAX_LAYERS};
pub use dtype::{convert_f32_to_f16, f16_to_f32, f32_to_f16, Dtype};
pub use slab::{Claim, Half, Slab, HUGE_PAGE};
pub use snapshot::{KvSnapshot, StorageUse, BLOCK_TOKENS, MAX_SEQ_LIMIT};

#[cfg(test)]
mod tests;
