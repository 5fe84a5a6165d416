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

/// Size (and alignment) of a transparent huge page on x86-64 and arm64 Linux.
pub const HUGE_PAGE: usize = 2 << 20;

/// Fixed-capacity storage for one layer's keys and values.
pub struct Slab {
    ptr: NonNull<u8>,
    layout: Layout,
    /// Bytes from one head's rows to the next (capacity rows, maybe padded).
    head_stride: usize,
    heads: usize,
    capacity: usize,
    head_dim: usize,
    dtype: Dtype,
    id: u64,
    claims: Mutex<Claims>,
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
        Self::allocate(heads, capacity, head_dim, dtype, false)
    }

    /// Like [`Slab::new`], but backed by transparent huge pages where the OS
    /// offers them: each head's rows start on a huge-page boundary, so
    /// filling `n` rows commits `ceil(n * row / 2 MiB)` huge pages per head.
    /// Worth it only when about that many rows will be written at once.
    pub fn new_huge(
        heads: usize,
        capacity: usize,
        head_dim: usize,
        dtype: Dtype,
    ) -> CoreResult<Self> {
        Self::allocate(heads, capacity, head_dim, dtype, true)
    }

    fn allocate(
        heads: usize,
        capacity: usize,
        head_dim: usize,
        dtype: Dtype,
        huge: bool,
    ) -> CoreResult<Self> {
        let too_large = || {
            CoreError::option(
                "max_seq",
                format!("{heads} heads x {capacity} tokens x {head_dim} dims is too large"),
            )
        };
        let align = if huge { HUGE_PAGE } else { ALIGN };
        let head_bytes = capacity
            .checked_mul(head_dim)
            .and_then(|x| x.checked_mul(dtype.itemsize()))
            .ok_or_else(too_large)?;
        let head_stride = if huge {
            head_bytes
                .checked_next_multiple_of(HUGE_PAGE)
                .ok_or_else(too_large)?
        } else {
            head_bytes
        };
        let bytes = head_stride
            .checked_mul(heads)
            .and_then(|x| x.checked_mul(2))
            .filter(|&b| b <= isize::MAX as usize - align)
            .ok_or_else(too_large)?;
        let layout = Layout::from_size_align(bytes.max(1), align)
            .map_err(|e| CoreError::option("max_seq", e.to_string()))?;
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { alloc::alloc(layout) };
        let ptr = NonNull::new(raw).ok_or_else(|| {
            CoreError::option(
                "max_seq",
                format!("could not allocate {bytes} bytes for one layer"),
            )
        })?;
        if huge {
            advise_huge_pages(ptr.as_ptr(), bytes);
        }
        Ok(Self {
            ptr,
            layout,
            head_stride,
            heads,
            capacity,
            head_dim,
            dtype,
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            claims: Mutex::new(Claims::default()),
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
        [self.head_stride, self.row_bytes(), self.dtype.itemsize()]
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
        let offset = (half_index * self.heads + head) * self.head_stride + token * self.row_bytes();
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

    fn lock(&self) -> MutexGuard<'_, Claims> {
        // A poisoned map is still consistent: every update is one insert or
        // remove, which cannot be interrupted half-way.
        self.claims.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Rows ever written and not released since (for tests and accounting).
    pub fn high_water(&self) -> usize {
        self.lock().high_water
    }

    /// Give the memory of rows `keep..high_water` back to the OS: no claim
    /// covers them and no cache can write them any more. Called with the
    /// claims locked, so no new extent can appear meanwhile.
    fn release_rows_beyond(&self, state: &mut Claims, keep: usize) {
        if state.high_water <= keep {
            return;
        }
        for half in [Half::Keys, Half::Values] {
            for head in 0..self.heads {
                let start = self.row_ptr(half, head, keep);
                let end = self.row_ptr(half, head, state.high_water);
                release_pages(start, end);
            }
        }
        state.high_water = keep;
    }
}

/// Claim bookkeeping of one slab.
#[derive(Default)]
struct Claims {
    /// Multiset of claim lengths: length -> number of claims of that length.
    lens: BTreeMap<usize, usize>,
    /// Claims held by live caches (the only ones that ever grow).
    extents: usize,
    /// Rows that may hold committed memory: the furthest any claim grew to.
    high_water: usize,
}

impl Drop for Slab {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

/// Ask Linux to back `[ptr, ptr + len)` with transparent huge pages (advice only).
#[cfg(target_os = "linux")]
fn advise_huge_pages(ptr: *mut u8, len: usize) {
    // SAFETY: the range is one live allocation of ours; MADV_HUGEPAGE changes
    // no contents and its failure (e.g. THP disabled) is harmless.
    unsafe {
        libc::madvise(ptr.cast(), len, libc::MADV_HUGEPAGE);
    }
}

#[cfg(not(target_os = "linux"))]
fn advise_huge_pages(_ptr: *mut u8, _len: usize) {}

/// Return the whole pages inside `[start, end)` to the OS; their contents
/// become unspecified (they are never read before being written again).
#[cfg(target_os = "linux")]
fn release_pages(start: *mut u8, end: *mut u8) {
    // SAFETY: sysconf has no preconditions.
    let page = match unsafe { libc::sysconf(libc::_SC_PAGESIZE) } {
        p if p > 0 => p as usize,
        _ => return,
    };
    let first = (start as usize).next_multiple_of(page);
    let last = end as usize / page * page;
    if last > first {
        // SAFETY: the pages lie inside one live allocation of ours and hold
        // no row anyone can read; MADV_DONTNEED only drops their contents.
        unsafe {
            libc::madvise(
                first as *mut libc::c_void,
                last - first,
                libc::MADV_DONTNEED,
            );
        }
    }
}

#[cfg(not(target_os = "linux"))]
fn release_pages(_start: *mut u8, _end: *mut u8) {}

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
///
/// An *extent* claim belongs to a live cache and may grow; the others
/// (snapshots, views) are fixed. When a slab's last extent goes, the rows
/// beyond every remaining claim can never be read or written again, and
/// their memory is returned to the OS.
pub struct Claim {
    slab: Arc<Slab>,
    len: usize,
    extent: bool,
}

impl Claim {
    /// Register a fixed claim of `len` rows on `slab` (a snapshot or a view).
    pub fn new(slab: Arc<Slab>, len: usize) -> Self {
        Self::register(slab, len, false)
    }

    /// Register a live cache's extent of `len` rows on `slab`.
    pub fn extent(slab: Arc<Slab>, len: usize) -> Self {
        Self::register(slab, len, true)
    }

    fn register(slab: Arc<Slab>, len: usize, extent: bool) -> Self {
        debug_assert!(len <= slab.capacity);
        {
            let mut state = slab.lock();
            add(&mut state.lens, len);
            state.extents += usize::from(extent);
            state.high_water = state.high_water.max(len);
        }
        Self { slab, len, extent }
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
        let mut state = self.slab.lock();
        remove(&mut state.lens, self.len);
        add(&mut state.lens, len);
        self.len = len;
    }

    /// Grow the claim to `len` if rows `self.len..len` are free for this
    /// holder to write: within capacity and covered by no other claim.
    /// Returns whether it grew; on `false` nothing changed.
    pub fn try_grow(&mut self, len: usize) -> bool {
        if len > self.slab.capacity {
            return false;
        }
        let mut state = self.slab.lock();
        remove(&mut state.lens, self.len);
        let others = state.lens.last_key_value().map_or(0, |(&l, _)| l);
        if others <= self.len {
            add(&mut state.lens, len);
            state.high_water = state.high_water.max(len);
            self.len = len;
            true
        } else {
            add(&mut state.lens, self.len);
            false
        }
    }

    /// A fixed claim of the same rows (or fewer).
    pub fn share(&self, len: usize) -> Self {
        debug_assert!(len <= self.len);
        Self::new(Arc::clone(&self.slab), len)
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        let mut state = self.slab.lock();
        remove(&mut state.lens, self.len);
        if self.extent {
            state.extents -= 1;
            if state.extents == 0 {
                if let Some((&keep, _)) = state.lens.last_key_value() {
                    self.slab.release_rows_beyond(&mut state, keep);
                }
            }
        }
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
        let mut extent = Claim::extent(Arc::clone(&s), 0);
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
        let mut a = Claim::extent(Arc::clone(&s), 3);
        let mut b = Claim::extent(Arc::clone(&s), 3);
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
        assert!(s.lock().lens.is_empty());
    }

    #[test]
    fn the_last_extent_leaving_releases_rows_no_claim_covers() {
        // One 4 KiB row per token, so every row is a whole page.
        let s = Arc::new(Slab::new(1, 16, 1024, Dtype::F32).unwrap());
        let mut a = Claim::extent(Arc::clone(&s), 0);
        assert!(a.try_grow(10));
        for t in 0..10 {
            // SAFETY: rows 0..10 are a's to write.
            unsafe { s.row_ptr(Half::Values, 0, t).write_bytes(t as u8 + 1, 4096) };
        }
        let snap = a.share(4);
        let b = Claim::extent(Arc::clone(&s), 4);
        drop(a);
        assert_eq!(
            s.high_water(),
            10,
            "b may still write past 4: nothing released"
        );
        drop(b);
        assert_eq!(s.high_water(), 4);
        // SAFETY: `snap` covers 4 rows.
        let kept = unsafe { s.rows(Half::Values, 0, 4) };
        for (t, row) in kept.chunks(4096).enumerate() {
            assert!(row.iter().all(|&x| x == t as u8 + 1));
        }
        // A new extent restored from the snapshot writes past it again.
        let mut c = Claim::extent(Arc::clone(&s), snap.len());
        assert!(c.try_grow(12));
        assert_eq!(s.high_water(), 12);
    }

    #[test]
    fn absurd_sizes_are_refused() {
        assert!(matches!(
            Slab::new(usize::MAX / 2, 4, 4, Dtype::F32),
            Err(CoreError::InvalidOption { .. })
        ));
    }
}
