//! One layer's key and value storage: a fixed-capacity slab shared by
//! reference, with prefix *claims* deciding who may still write where.
//!
//! A slab holds `[heads, capacity, head_dim]` keys followed by the same shape
//! of values, so the first `len` tokens of either are one strided array.
//! Every party that needs rows `0..len` to stay as they are registers a
//! claim of length `len`: a live cache (its filled extent), a snapshot, or a
//! view handed to Python. Rows are written only at positions at or beyond
//! every *other* claim, so nothing anyone can see ever changes; a writer that
//! would break that rule moves to a fresh slab first (see `cache.rs`).

use std::alloc::{self, Layout};
use std::collections::BTreeMap;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::kv::dtype::Dtype;
use crate::{CoreError, CoreResult};

/// Keys or values half of a slab.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Half {
    /// The keys tensor.
    Keys,
    /// The values tensor.
    Values,
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// Alignment of slab memory: one cache line, enough for any SIMD load.
const ALIGN: usize = 64;

/// Fixed-capacity storage for one layer's keys and values.
pub struct Slab {
    ptr: NonNull<u8>,
    layout: Layout,
    heads: usize,
    capacity: usize,
    head_dim: usize,
    dtype: Dtype,
    id: u64,
    /// Multiset of claim lengths: length -> number of claims of that length.
    claims: Mutex<BTreeMap<usize, usize>>,
}

// SAFETY: the slab owns its allocation. Rows are only written by the holder
// of the extent claim at positions no other claim covers (enforced under the
// `claims` mutex), and only read below a claim the reader holds, so shared
// access from several threads never races on the same bytes.
unsafe impl Send for Slab {}
// SAFETY: see `Send`; all shared mutable metadata sits behind a mutex.
unsafe impl Sync for Slab {}

impl Slab {
    /// Allocate an uninitialised slab. Rows are read only after being
    /// written, so the memory is never zeroed (and untouched pages stay
    /// uncommitted on systems that commit lazily).
    pub fn new(heads: usize, capacity: usize, head_dim: usize, dtype: Dtype) -> CoreResult<Self> {
        let bytes = heads
            .checked_mul(capacity)
            .and_then(|x| x.checked_mul(head_dim))
            .and_then(|x| x.checked_mul(dtype.itemsize()))
            .and_then(|x| x.checked_mul(2))
            .filter(|&b| b <= isize::MAX as usize - ALIGN)
            .ok_or_else(|| {
                CoreError::option(
                    "max_seq",
                    format!("{heads} heads x {capacity} tokens x {head_dim} dims is too large"),
                )
            })?;
        let layout = Layout::from_size_align(bytes.max(1), ALIGN)
            .map_err(|e| CoreError::option("max_seq", e.to_string()))?;
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { alloc::alloc(layout) };
        let ptr = NonNull::new(raw).ok_or_else(|| {
            CoreError::option(
                "max_seq",
                format!("could not allocate {bytes} bytes for one layer"),
            )
        })?;
        Ok(Self {
            ptr,
            layout,
            heads,
            capacity,
            head_dim,
            dtype,
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            claims: Mutex::new(BTreeMap::new()),
        })
    }

    /// Tokens the slab can hold.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Storage dtype.
    pub fn dtype(&self) -> Dtype {
        self.dtype
    }

    /// Process-unique identity, used to count shared storage once.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Bytes one token occupies in one head of one half.
    pub fn row_bytes(&self) -> usize {
        self.head_dim * self.dtype.itemsize()
    }

    /// Byte strides of a half seen as `[heads, tokens, head_dim]`.
    pub fn strides(&self) -> [usize; 3] {
        let row = self.row_bytes();
        [self.capacity * row, row, self.dtype.itemsize()]
    }

    /// Pointer to row `token` of `head` in `half`.
    ///
    /// # Panics
    /// Never for `head < heads` and `token <= capacity` (asserted in debug).
    pub fn row_ptr(&self, half: Half, head: usize, token: usize) -> *mut u8 {
        debug_assert!(head < self.heads && token <= self.capacity);
        let half_index = match half {
            Half::Keys => 0,
            Half::Values => 1,
        };
        let offset = ((half_index * self.heads + head) * self.capacity + token) * self.row_bytes();
        // SAFETY: the offset is within (or one past) the allocation.
        unsafe { self.ptr.as_ptr().add(offset) }
    }

    /// The first `len` rows of `head` in `half`, as bytes.
    ///
    /// # Safety
    /// The caller holds a claim of at least `len` on this slab, so those rows
    /// were written and no one writes them while the claim lives.
    pub unsafe fn rows(&self, half: Half, head: usize, len: usize) -> &[u8] {
        // SAFETY: by the caller's claim, the rows are initialised and frozen.
        unsafe { std::slice::from_raw_parts(self.row_ptr(half, head, 0), len * self.row_bytes()) }
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<usize, usize>> {
        // A poisoned map is still consistent: every update is one insert or
        // remove, which cannot be interrupted half-way.
        self.claims.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Drop for Slab {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

fn add(map: &mut BTreeMap<usize, usize>, len: usize) {
    *map.entry(len).or_insert(0) += 1;
}

fn remove(map: &mut BTreeMap<usize, usize>, len: usize) {
    if let Some(count) = map.get_mut(&len) {
        *count -= 1;
        if *count == 0 {
            map.remove(&len);
        }
    }
}

/// A promise that rows `0..len` of a slab stay unchanged while this lives.
pub struct Claim {
    slab: Arc<Slab>,
    len: usize,
}

impl Claim {
    /// Register a claim of `len` rows on `slab`.
    pub fn new(slab: Arc<Slab>, len: usize) -> Self {
        debug_assert!(len <= slab.capacity);
        add(&mut slab.lock(), len);
        Self { slab, len }
    }

    /// The claimed slab.
    pub fn slab(&self) -> &Arc<Slab> {
        &self.slab
    }

    /// Rows covered.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no rows are covered.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Shrink the claim (a cache truncating its extent). Never fails.
    pub fn shrink(&mut self, len: usize) {
        debug_assert!(len <= self.len);
        let mut map = self.slab.lock();
        remove(&mut map, self.len);
        add(&mut map, len);
        self.len = len;
    }

    /// Grow the claim to `len` if rows `self.len..len` are free for this
    /// holder to write: within capacity and covered by no other claim.
    /// Returns whether it grew; on `false` nothing changed.
    pub fn try_grow(&mut self, len: usize) -> bool {
        if len > self.slab.capacity {
            return false;
        }
        let mut map = self.slab.lock();
        remove(&mut map, self.len);
        let others = map.last_key_value().map_or(0, |(&l, _)| l);
        if others <= self.len {
            add(&mut map, len);
            self.len = len;
            true
        } else {
            add(&mut map, self.len);
            false
        }
    }

    /// A second, independent claim of the same rows (or fewer).
    pub fn share(&self, len: usize) -> Self {
        debug_assert!(len <= self.len);
        Self::new(Arc::clone(&self.slab), len)
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        remove(&mut self.slab.lock(), self.len);
    }
}

impl std::fmt::Debug for Claim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Claim(slab {}, {} rows)", self.slab.id, self.len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slab() -> Arc<Slab> {
        Arc::new(Slab::new(2, 8, 4, Dtype::F32).unwrap())
    }

    #[test]
    fn a_writer_grows_past_claims_it_does_not_overlap() {
        let s = slab();
        let mut extent = Claim::new(Arc::clone(&s), 0);
        assert!(extent.try_grow(3));
        let frozen = extent.share(3);
        assert!(extent.try_grow(5), "rows beyond every other claim are free");
        extent.shrink(2);
        assert!(
            !extent.try_grow(4),
            "rows 2..3 are frozen by the other claim"
        );
        assert_eq!(extent.len(), 2);
        drop(frozen);
        assert!(extent.try_grow(4));
    }

    #[test]
    fn two_extents_on_one_slab_cannot_both_grow() {
        let s = slab();
        let mut a = Claim::new(Arc::clone(&s), 3);
        let mut b = Claim::new(Arc::clone(&s), 3);
        assert!(a.try_grow(4));
        assert!(!b.try_grow(4));
        assert!(!a.try_grow(9), "beyond capacity");
    }

    #[test]
    fn dropping_claims_empties_the_map() {
        let s = slab();
        let a = Claim::new(Arc::clone(&s), 3);
        let b = a.share(2);
        drop(a);
        drop(b);
        assert!(s.lock().is_empty());
    }

    #[test]
    fn absurd_sizes_are_refused() {
        assert!(matches!(
            Slab::new(usize::MAX / 2, 4, 4, Dtype::F32),
            Err(CoreError::InvalidOption { .. })
        ));
    }
}
