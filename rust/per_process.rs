//! Values that own threads, made again in a forked child.
//!
//! `fork()` copies a process with only the thread that called it. A pool
//! made before the fork (the engine's team, a rayon pool) has no threads in
//! the child, and handing it work there waits forever; joining its threads
//! waits forever too. Python forks often (`multiprocessing`'s default start
//! method on Linux, servers that pre-fork workers, test runners), usually
//! after a model is loaded.
//!
//! [`PerProcess`] keeps one value per process: asked for it from a process
//! other than the one that made it, it makes a new one and leaks the old one
//! (its threads do not exist here, so it must never be dropped). The check
//! is a `getpid()` and an uncontended lock per call, about 100 ns.
//!
//! One hazard is left, as with every lock and `fork()`: a fork taken while
//! another thread holds the slot's lock for the few instructions of a check.
//! The lock is never held while a value is made or used.

use std::sync::{Arc, Mutex, MutexGuard};

use crate::error::{CoreError, CoreResult};

type Slot<T> = Option<(u32, Arc<T>)>;

/// One `T` per process; see the module.
pub struct PerProcess<T> {
    slot: Mutex<Slot<T>>,
}

impl<T> Default for PerProcess<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> std::fmt::Debug for PerProcess<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let made_here = self
            .lock()
            .as_ref()
            .map(|(pid, _)| *pid == std::process::id());
        f.debug_struct("PerProcess")
            .field("made_here", &made_here)
            .finish()
    }
}

impl<T> PerProcess<T> {
    /// Empty: the first [`Self::get`] makes the value.
    pub const fn new() -> Self {
        Self {
            slot: Mutex::new(None),
        }
    }

    /// Holding `value`, made by this process.
    pub fn with(value: T) -> Self {
        Self {
            slot: Mutex::new(Some((std::process::id(), Arc::new(value)))),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Slot<T>> {
        self.slot.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// This process's value, made by `make` if there is none yet (or the
    /// one there was made by the process this one was forked from).
    pub fn get(&self, make: impl FnOnce() -> CoreResult<T>) -> CoreResult<Arc<T>> {
        let pid = std::process::id();
        if let Some((made_by, value)) = &*self.lock() {
            if *made_by == pid {
                return Ok(Arc::clone(value));
            }
        }
        // Made without the lock held, so a fork during `make` cannot leave
        // the child a lock that nobody will release.
        let fresh = Arc::new(make()?);
        let mut slot = self.lock();
        match &*slot {
            // Another thread of this process made one meanwhile: use it.
            Some((made_by, value)) if *made_by == pid => Ok(Arc::clone(value)),
            _ => {
                if let Some(stale) = slot.replace((pid, Arc::clone(&fresh))) {
                    std::mem::forget(stale);
                }
                Ok(fresh)
            }
        }
    }

    /// Whether the value held was made by this process (false when empty).
    pub fn made_here(&self) -> bool {
        matches!(&*self.lock(), Some((pid, _)) if *pid == std::process::id())
    }
}

impl<T> Drop for PerProcess<T> {
    fn drop(&mut self) {
        let slot = self.slot.get_mut().unwrap_or_else(|e| e.into_inner());
        if let Some((made_by, value)) = slot.take() {
            if made_by != std::process::id() {
                std::mem::forget(value);
            }
        }
    }
}

/// The process's shared rayon pool, for work not given a pool of its own
/// (rayon's global pool cannot be made again after a fork, this one can).
/// Sized like rayon's default: the cores the process may use.
pub fn shared_pool() -> CoreResult<Arc<rayon::ThreadPool>> {
    static SHARED: PerProcess<rayon::ThreadPool> = PerProcess::new();
    SHARED.get(|| {
        rayon::ThreadPoolBuilder::new()
            .thread_name(|i| format!("rlx-shared-{i}"))
            .build()
            .map_err(|e| CoreError::OutOfMemory(format!("cannot start the shared threads: {e}")))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn one_value_per_process_made_once() {
        let made = AtomicUsize::new(0);
        let cell: PerProcess<usize> = PerProcess::new();
        assert!(!cell.made_here());
        let make = || {
            made.fetch_add(1, Ordering::Relaxed);
            Ok(7)
        };
        let a = cell.get(make).unwrap();
        let b = cell.get(make).unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(made.load(Ordering::Relaxed), 1);
        assert!(cell.made_here());
    }

    #[test]
    fn a_value_from_another_process_is_replaced_and_never_dropped() {
        struct Loud<'a>(&'a AtomicUsize);
        impl Drop for Loud<'_> {
            fn drop(&mut self) {
                self.0.fetch_add(1, Ordering::Relaxed);
            }
        }
        let drops = AtomicUsize::new(0);
        let cell = PerProcess::with(Loud(&drops));
        // Pretend the value was made by the process we were forked from.
        {
            let mut slot = cell.lock();
            let (_, v) = slot.take().unwrap();
            *slot = Some((std::process::id().wrapping_add(1), v));
        }
        assert!(!cell.made_here());
        let fresh = cell.get(|| Ok(Loud(&drops))).unwrap();
        assert!(cell.made_here());
        assert_eq!(
            drops.load(Ordering::Relaxed),
            0,
            "the stale value was dropped"
        );
        drop(fresh);
        drop(cell);
        assert_eq!(
            drops.load(Ordering::Relaxed),
            1,
            "this process's value is dropped"
        );

        let stale = PerProcess::with(Loud(&drops));
        {
            let mut slot = stale.lock();
            let (_, v) = slot.take().unwrap();
            *slot = Some((std::process::id().wrapping_add(1), v));
        }
        drop(stale);
        assert_eq!(
            drops.load(Ordering::Relaxed),
            1,
            "a stale value is never dropped"
        );
    }

    #[test]
    fn a_failed_make_leaves_the_slot_as_it_was() {
        let cell: PerProcess<u8> = PerProcess::new();
        let err = cell.get(|| Err(CoreError::Internal("no".into())));
        assert!(err.is_err());
        assert!(!cell.made_here());
        assert_eq!(*cell.get(|| Ok(3)).unwrap(), 3);
    }

    #[test]
    fn the_shared_pool_is_one_pool() {
        let a = shared_pool().unwrap();
        let b = shared_pool().unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        assert!(a.current_num_threads() >= 1);
    }
}
