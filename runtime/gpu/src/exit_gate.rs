//! Quiet at process exit.
//!
//! The CUDA driver tears its contexts down while the process exits (in its
//! exit handlers), and chorus's background threads are still alive then:
//! a completion reactor querying an end event at that moment calls into a
//! driver that is being taken apart, and the process dies of a segfault
//! after `main` returned. So background threads make their driver calls
//! inside the gate ([`enter`]), and a handler registered with `atexit`
//! once the first of them starts — after the driver's own, so it runs
//! before them — closes the gate: it waits (at most [`CLOSE_WAIT`]) for
//! the call in progress, and from then on [`enter`] refuses, so no chorus
//! thread touches the driver again.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, Once, TryLockError};
use std::time::{Duration, Instant};

/// How long closing the gate waits for a driver call in progress (a call
/// stuck longer is not waited for: the exit goes on).
pub(crate) const CLOSE_WAIT: Duration = Duration::from_millis(200);

static GATE: Mutex<()> = Mutex::new(());
static CLOSED: AtomicBool = AtomicBool::new(false);
static INSTALL: Once = Once::new();

/// Registers the exit handler (once per process). Call it from a
/// background thread's start, after the driver was first used.
pub(crate) fn install() {
    INSTALL.call_once(|| {
        // SAFETY: `close` is an `extern "C" fn()` with no arguments that
        // never unwinds (it only touches atomics and a mutex) and lives for
        // the whole program, as `atexit` requires.
        let rc = unsafe { libc::atexit(close) };
        if rc != 0 {
            tracing::warn!("cannot register chorus's exit handler; background threads may touch the CUDA driver during exit");
        }
    });
}

/// Permission for one round of driver calls by a background thread, held
/// while they run; `None` once the process is exiting (make no more).
pub(crate) fn enter() -> Option<MutexGuard<'static, ()>> {
    if CLOSED.load(Ordering::Acquire) {
        return None;
    }
    let g = GATE.lock().unwrap_or_else(|p| p.into_inner());
    if CLOSED.load(Ordering::Acquire) {
        return None;
    }
    Some(g)
}

extern "C" fn close() {
    let deadline = Instant::now() + CLOSE_WAIT;
    // Held while closing, so no round starts between the wait and the
    // flag.
    let _held = loop {
        match GATE.try_lock() {
            Ok(g) => break Some(g),
            Err(TryLockError::Poisoned(p)) => break Some(p.into_inner()),
            Err(TryLockError::WouldBlock) if Instant::now() >= deadline => break None,
            Err(TryLockError::WouldBlock) => std::thread::yield_now(),
        }
    };
    CLOSED.store(true, Ordering::Release);
}
