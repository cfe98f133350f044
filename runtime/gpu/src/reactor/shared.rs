//! The state that registering threads, the reactor thread and the driver
//! waiters share: the queues of entries, the flags that say who sleeps, the
//! counters, each hot one on a cache line of its own.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use super::pending::Pending;
use super::waiter_queues::Waiters;
use crate::bell::Bell;
use crate::config::ReactorConfig;
use chorus_core::sync::lock;

/// Keeps a value on its own cache line (no false sharing between the
/// registering threads and the reactor thread).
#[repr(align(128))]
pub(super) struct Padded<T>(pub(super) T);

impl<T> std::ops::Deref for Padded<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

/// What the [`Reactor`](super::Reactor) handle, its thread and the driver
/// waiters share.
pub(super) struct Shared {
    pub(super) incoming: Padded<Mutex<Vec<Box<dyn Pending>>>>,
    /// Detached entries, taken by the thread once per `detached_poll`.
    pub(super) detached: Padded<Mutex<Vec<Box<dyn Pending>>>>,
    /// Set while the thread is parked with nothing to watch (no timeout):
    /// only then does a detached registration unpark it.
    pub(super) parked: Padded<AtomicBool>,
    /// Set when `incoming` is non-empty or a nudge asks to spin again.
    pub(super) wake: Padded<AtomicBool>,
    /// Set while the thread is parked or sleeping.
    pub(super) sleeping: Padded<AtomicBool>,
    pub(super) registered: Padded<AtomicU64>,
    pub(super) completed: Padded<AtomicU64>,
    pub(super) parks: AtomicU64,
    pub(super) config: ReactorConfig,
    /// The thread's sleep (made when the thread starts).
    pub(super) bell: OnceLock<Bell>,
    /// The driver waiters and the entries they watch.
    pub(super) waiters: Waiters,
    pub(super) waiters_alive: AtomicU64,
    pub(super) waits: AtomicU64,
    pub(super) asleep: AtomicU64,
}

impl Shared {
    /// Gives entries to the reactor thread to poll (whatever they are).
    pub(super) fn hand_back(&self, entries: Vec<Box<dyn Pending>>) {
        lock(&self.incoming).extend(entries);
        self.wake.store(true, Ordering::SeqCst);
        if let Some(b) = self.bell.get() {
            b.ring();
        }
    }
}
