//! Synchronization primitives, swapped for loom's under `cfg(loom)`, and
//! [`lock`], the one way chorus locks a mutex.
//!
//! Every piece of chorus-core whose interleavings the loom suite checks
//! (the work slot, the registry, the communicator cache, the store counter)
//! takes its `Arc`, `Mutex` and atomics from here and never from `std`
//! directly, the way tokio's `loom` module does.

#[cfg(not(loom))]
#[allow(unused_imports)]
mod imp {
    pub(crate) use std::sync::atomic::{
        fence, AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering,
    };
    pub(crate) use std::sync::{Arc, Condvar, Mutex, MutexGuard};
}

#[cfg(loom)]
#[allow(unused_imports)]
mod imp {
    pub(crate) use loom::sync::atomic::{
        fence, AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering,
    };
    pub(crate) use loom::sync::{Arc, Condvar, Mutex, MutexGuard};
}

#[allow(unused_imports)]
pub(crate) use imp::*;

/// `std`'s `Arc`, under loom too, for shared state that is also handed out
/// as a trait object: a work's shared state is its registry entry's
/// `Arc<dyn Fail>`, and an NCCL op's end event the entry's
/// `Arc<dyn FinishedProbe>`; loom's `Arc` cannot be coerced to `dyn`. What
/// such a handle guards sits behind this module's `Mutex`, which loom does
/// model; only the reference count is std's, and under loom one thread at a
/// time moves it. Text (`Arc<str>`) that never changes needs no shim.
pub(crate) type DynArc<T> = std::sync::Arc<T>;

/// Locks `m`, recovering the data if another thread panicked while
/// holding it. chorus's state machines stay consistent between statements,
/// so a poisoned lock carries no torn state, and a panic on one thread
/// must not turn every later lock into a second one. Every crate of chorus
/// locks its mutexes through this function.
///
/// The mutex is `std`'s (loom's in chorus-core's loom builds, `cfg(loom)`).
///
/// # Examples
///
/// ```
/// let m = std::sync::Mutex::new(1);
/// *chorus_core::sync::lock(&m) += 1;
/// assert_eq!(*chorus_core::sync::lock(&m), 2);
/// ```
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(poisoned) => poisoned.into_inner(),
    }
}
