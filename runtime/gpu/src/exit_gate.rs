//! Quiet at process exit.
//!
//! The CUDA driver tears its contexts down while the process exits (in its
//! exit handlers), and chorus's background threads are still alive then:
//! a completion reactor querying an end event at that moment calls into a
//! driver that is being taken apart, and the process dies of a segfault
//! after `main` returned. So background threads make their driver calls
//! inside the gate ([`enter`]; any number of threads at once, a driver
//! waiter for as long as it sleeps in the driver), and a handler
//! registered with `atexit` once the first of them starts — after the
//! driver's own, so it runs before them — closes the gate: from then on
//! [`enter`] refuses, so no chorus thread makes a new driver call, and it
//! waits (at most [`CLOSE_WAIT`]) for the calls in progress to return.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Once;
use std::time::{Duration, Instant};

/// How long closing the gate waits for a driver call in progress (a call
/// stuck longer is not waited for: the exit goes on).
pub(crate) const CLOSE_WAIT: Duration = Duration::from_millis(200);

/// Threads inside the gate now.
static INSIDE: AtomicUsize = AtomicUsize::new(0);
static CLOSED: AtomicBool = AtomicBool::new(false);
static INSTALL: Once = Once::new();

/// Registers the exit handler (once per process). Call it from a
/// background thread's start, after the driver was first used.
pub(crate) fn install() {
    INSTALL.call_once(|| {
        // SAFETY: `close` is an `extern "C" fn()` with no arguments that
        // never unwinds (it only touches atomics and the clock) and lives for
        // the whole program, as `atexit` requires.
        let rc = unsafe { libc::atexit(close) };
        if rc != 0 {
            tracing::warn!("cannot register chorus's exit handler; background threads may touch the CUDA driver during exit");
        }
    });
}

/// Permission for driver calls by a background thread, held while they
/// run; `None` once the process is exiting (make no more).
pub(crate) fn enter() -> Option<Inside> {
    // Counted first, then checked: `close` sets the flag first, then reads
    // the count, so either this sees the flag or `close` sees this thread.
    INSIDE.fetch_add(1, Ordering::SeqCst);
    let inside = Inside(());
    if CLOSED.load(Ordering::SeqCst) {
        return None;
    }
    Some(inside)
}

/// A thread inside the gate (see [`enter`]); it leaves when this drops.
#[must_use = "the gate is left when this drops"]
pub(crate) struct Inside(());

impl Drop for Inside {
    fn drop(&mut self) {
        INSIDE.fetch_sub(1, Ordering::SeqCst);
    }
}

extern "C" fn close() {
    CLOSED.store(true, Ordering::SeqCst);
    let deadline = Instant::now() + CLOSE_WAIT;
    while INSIDE.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
        std::thread::yield_now();
    }
}
