//! The hand-over between a caller that leaves its pipe readers *lingering*
//! (watched, so their writers ring no doorbell) and the worker that may
//! later need them read by its host task. The TCP backend runs it
//! (`backend::tcp::linger` in `chorus`); the loom suite checks it.
//!
//! Two flags: `idle` (the worker waits for its next op; only the worker
//! sets it, and a submitter clears it when it queues an op) and
//! `lingering` (some reader was left lingering). The rule: a reader that
//! lingers while the worker waits for frames on its host is always either
//! marked (so the worker wakes it before it waits) or left by a caller who
//! saw the worker idle.
//!
//! * The caller, after its lingering poll of the readers, calls
//!   [`Linger::mark`]: it stores `lingering`, then looks at `idle`. Not
//!   idle, it polls the readers once more to sleep (the worker has an op
//!   it may run without the caller).
//! * The worker clears `idle` when it takes an op
//!   ([`Linger::set_idle`]), and before it waits for frames on its host
//!   calls [`Linger::end`]: a `true` says readers linger, and it wakes them.
//!
//! Both sides store, fence (sequentially consistent) and then load, so one
//! of the two sees the other's store: a caller that saw the worker idle
//! marked `lingering` before a worker that took an op later looks at it.
//! Whoever ends a linger wakes the readers after clearing the flag, so a
//! caller that marks it again afterwards is seen by the next look.

use crate::sync::{fence, AtomicBool, Ordering};

/// The two flags of one group (see the module docs).
#[derive(Debug)]
pub struct Linger {
    idle: AtomicBool,
    lingering: AtomicBool,
}

/// What [`Linger::mark`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Marked {
    /// The flag was clear: a linger starts (start its sweep).
    pub first: bool,
    /// The worker waits for work: the readers may stay lingering. When
    /// `false`, the caller polls them once more to sleep.
    pub keep: bool,
}

impl Default for Linger {
    fn default() -> Self {
        Linger::new()
    }
}

impl Linger {
    /// A group whose worker is not (yet) idle and whose readers sleep.
    pub fn new() -> Linger {
        Linger {
            idle: AtomicBool::new(false),
            lingering: AtomicBool::new(false),
        }
    }

    /// The worker waits for work (`true`) or has taken, or is about to
    /// take, an op (`false`; also a submitter that queues one).
    pub fn set_idle(&self, idle: bool) {
        self.idle.store(idle, Ordering::SeqCst);
        fence(Ordering::SeqCst);
    }

    /// Whether the worker waits for work.
    pub fn is_idle(&self) -> bool {
        self.idle.load(Ordering::SeqCst)
    }

    /// A caller left readers lingering: marks it, then looks at the worker.
    pub fn mark(&self) -> Marked {
        let was = self.lingering.swap(true, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        Marked {
            first: !was,
            keep: self.idle.load(Ordering::SeqCst),
        }
    }

    /// Ends a linger: `true` when readers were marked lingering, which the
    /// caller must now wake (their hosts poll them to sleep).
    pub fn end(&self) -> bool {
        fence(Ordering::SeqCst);
        self.lingering.load(Ordering::SeqCst) && self.lingering.swap(false, Ordering::SeqCst)
    }

    /// Whether readers are marked lingering.
    pub fn is_lingering(&self) -> bool {
        self.lingering.load(Ordering::SeqCst)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_mark_keeps_only_while_the_worker_is_idle_and_an_end_takes_it_once() {
        let l = Linger::new();
        assert_eq!(
            l.mark(),
            Marked {
                first: true,
                keep: false
            }
        );
        l.set_idle(true);
        assert_eq!(
            l.mark(),
            Marked {
                first: false,
                keep: true
            }
        );
        assert!(l.is_lingering());
        assert!(l.end());
        assert!(!l.end());
        assert!(!l.is_lingering());
        assert!(l.mark().first);
    }
}
