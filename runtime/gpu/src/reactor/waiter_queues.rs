//! The driver waiters' bookkeeping ([`Waiters`]): for each ordered queue,
//! its pending entries by position and the positions its waiters sleep on;
//! the idle waiters, and the mailbox through which each is given a queue.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::thread::Thread;

use super::pending::Pending;
use chorus_core::sync::lock;

/// The waiters of a reactor.
#[derive(Default)]
pub(super) struct Waiters {
    state: Mutex<State>,
}

#[derive(Default)]
pub(super) struct State {
    pub(super) queues: HashMap<u64, Queue>,
    /// Waiters with no queue, parked until given one.
    pub(super) idle: Vec<Arc<Mailbox>>,
}

/// A queue's pending entries and the waiters that serve it.
#[derive(Default)]
pub(super) struct Queue {
    /// By position on the stream.
    pub(super) entries: BTreeMap<u64, Vec<Box<dyn Pending>>>,
    /// The positions waiters sleep on now.
    pub(super) asleep: Vec<u64>,
    /// Waiters serving the queue that are not asleep (they look at the
    /// entries before they sleep again).
    pub(super) awake: usize,
}

impl Queue {
    pub(super) fn waiters(&self) -> usize {
        self.awake + self.asleep.len()
    }

    /// Whether an entry at `pos` will be seen when it ends: a waiter is
    /// about to look, or sleeps on it or on an earlier position.
    pub(super) fn covers(&self, pos: u64) -> bool {
        self.awake > 0 || self.asleep.iter().any(|&s| s <= pos)
    }

    pub(super) fn is_unused(&self) -> bool {
        self.entries.is_empty() && self.waiters() == 0
    }
}

/// How an idle waiter is given a queue.
#[derive(Default)]
pub(super) struct Mailbox {
    pub(super) queue: Mutex<Option<u64>>,
    pub(super) thread: OnceLock<Thread>,
}

impl Mailbox {
    pub(super) fn take(&self) -> Option<u64> {
        lock(&self.queue).take()
    }
}

impl Waiters {
    pub(super) fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }
}
