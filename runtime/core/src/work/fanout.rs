//! [`Fanout`]: one future awaited through several: whichever of them is
//! polled polls the one future for all, with a waker that wakes every one
//! of them.
//!
//! A batch of ops launched as one ends as one, so its ops' works share one
//! work (chorus's batches on NCCL): each op's work, polled, registers its own
//! waker here and polls the shared work with the fan-out's waker; when
//! the shared work is woken (its end, an early wake, a failure), every
//! registered waiter is woken and polls again.
//!
//! The protocol a caller keeps, so that no wake-up is lost: the shared
//! future and its outcome live behind one lock; a waiter checks the
//! outcome and, if there is none, polls through [`Fanout::poll`], all
//! under that lock (its waker is registered before the shared future is
//! polled); whoever sees the future resolve stores the outcome under the
//! lock and, once it let go of the lock, wakes the others
//! ([`Fanout::wake_all_but`]). The loom suite checks it
//! (`loom-tests/tests/work.rs`, `fanout_one_waiter_vs_completion`, `fanout_two_waiters_vs_completion`).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Wake, Waker};

use crate::sync::{lock, DynArc, Mutex};

/// The waiters on one shared future (see the module docs).
pub struct Fanout {
    waiters: DynArc<Waiters>,
    /// Wakes every waiter: the waker the shared future is polled with.
    waker: Waker,
}

impl std::fmt::Debug for Fanout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fanout")
            .field("waiters", &lock(&self.waiters.0).len())
            .finish()
    }
}

impl Default for Fanout {
    fn default() -> Self {
        Self::new()
    }
}

/// The wakers of the waiters polled since the last wake.
#[derive(Default)]
struct Waiters(Mutex<Vec<Waker>>);

impl Waiters {
    fn wake_all_but(&self, but: Option<&Waker>) {
        let ws = std::mem::take(&mut *lock(&self.0));
        for w in ws {
            if !but.is_some_and(|b| b.will_wake(&w)) {
                w.wake();
            }
        }
    }
}

impl Wake for Waiters {
    fn wake(self: DynArc<Self>) {
        self.wake_all_but(None);
    }

    fn wake_by_ref(self: &DynArc<Self>) {
        self.wake_all_but(None);
    }
}

impl Fanout {
    /// A fan-out with no waiter.
    pub fn new() -> Self {
        let waiters = DynArc::new(Waiters::default());
        Fanout {
            waker: Waker::from(waiters.clone()),
            waiters,
        }
    }

    /// Registers `cx`'s waker (once per task), then polls `shared` with
    /// the fan-out's waker: when `shared` is woken, every waiter
    /// registered so far is.
    pub fn poll<F: Future + Unpin>(&self, shared: &mut F, cx: &mut Context<'_>) -> Poll<F::Output> {
        {
            let mut ws = lock(&self.waiters.0);
            if !ws.iter().any(|w| w.will_wake(cx.waker())) {
                ws.push(cx.waker().clone());
            }
        }
        Pin::new(shared).poll(&mut Context::from_waker(&self.waker))
    }

    /// Wakes every registered waiter but `but` (the one that saw the
    /// outcome itself), and forgets them.
    pub fn wake_all_but(&self, but: Option<&Waker>) {
        self.waiters.wake_all_but(but);
    }
}
