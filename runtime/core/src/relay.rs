//! [`Relay`]: a future that a host task runs in the background and that a
//! waiting caller may poll in its stead for a while.
//!
//! The TCP backend's worker and its readers are futures hosted by tasks on
//! chorus's I/O threads. Every frame an op sends or receives used to cross
//! threads: the caller woke the I/O thread to send, the socket woke it to
//! read, and it woke the caller to complete. A caller that awaits a small
//! op can do all of that on its own thread instead, if it may poll those
//! futures itself: a relay lets it.
//!
//! The protocol, so that no wake-up is lost and no future is polled by two
//! threads at once:
//!
//! * The future lives behind a lock; whoever polls it holds the lock, with
//!   the relay's own waker.
//! * The relay's waker marks the relay notified. It wakes the host task
//!   unless a caller has claimed the relay: a claiming caller polls the
//!   future again itself (it is spinning anyway), so the host's thread is
//!   not woken for what the caller will see.
//! * A caller claims the relay ([`Relay::claim`]), polls through the claim
//!   as often as it likes (each poll takes the lock with `try_lock`, and
//!   first clears the notification it is about to serve), and lets go
//!   (dropping the claim): if a wake-up came after its last poll, it wakes
//!   the host then, which takes over.
//! * The host task ([`Relay::poll_host`]) registers its waker first, then
//!   polls the future unless the lock is taken (a caller is polling: it
//!   will hand over any wake-up it did not serve when it lets go).
//!
//! The loom suite checks it (`loom-tests/tests/relay.rs`).

use std::future::Future;
use std::pin::Pin;
use std::sync::TryLockError;
use std::task::{Context, Poll, Wake, Waker};

use crate::sync::{lock, AtomicUsize, DynArc, Mutex, Ordering};

/// A caller holds the claim.
const CLAIMED: usize = 0b01;
/// Woken since the last poll began.
const NOTIFIED: usize = 0b10;

/// The hosted future.
type Hosted = Pin<Box<dyn Future<Output = ()> + Send>>;

/// A future run by a host task that a caller may poll in its stead (see
/// the module docs).
pub struct Relay {
    shared: DynArc<Shared>,
    /// The waker the future is always polled with (wakes through
    /// `shared`).
    waker: Waker,
}

impl std::fmt::Debug for Relay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relay")
            .field("state", &self.shared.state.load(Ordering::Relaxed))
            .finish()
    }
}

/// What the relay's waker reaches.
struct Shared {
    state: AtomicUsize,
    /// The host task's waker, registered at each of its polls.
    host: Mutex<Option<Waker>>,
    /// The future; `None` once it finished or was cancelled.
    fut: Mutex<Option<Hosted>>,
}

impl Shared {
    fn wake_host(&self) {
        let host = lock(&self.host).clone();
        if let Some(w) = host {
            w.wake();
        }
    }
}

impl Wake for Shared {
    fn wake(self: std::sync::Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &std::sync::Arc<Self>) {
        let prev = self.state.fetch_or(NOTIFIED, Ordering::AcqRel);
        if prev & CLAIMED == 0 {
            self.wake_host();
        }
    }
}

impl Relay {
    /// A relay of `fut`, to be hosted by a task that polls
    /// [`poll_host`](Self::poll_host) until it is ready.
    pub fn new(fut: impl Future<Output = ()> + Send + 'static) -> Relay {
        let shared = DynArc::new(Shared {
            state: AtomicUsize::new(0),
            host: Mutex::new(None),
            fut: Mutex::new(Some(Box::pin(fut))),
        });
        let waker = Waker::from(shared.clone());
        Relay { shared, waker }
    }

    /// The host task's poll: ready once the future finished (or was
    /// cancelled). Pending while a caller polls it; the caller wakes the
    /// host when it lets go, if anything happened it did not serve.
    pub fn poll_host(&self, cx: &mut Context<'_>) -> Poll<()> {
        {
            let mut host = lock(&self.shared.host);
            if !host.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                *host = Some(cx.waker().clone());
            }
        }
        match self.poll_inner() {
            Step::Finished => Poll::Ready(()),
            Step::Running | Step::Busy => Poll::Pending,
        }
    }

    /// Claims the relay for a caller that will poll the future itself for
    /// a while; `None` if another caller holds it.
    pub fn claim(&self) -> Option<Claim<'_>> {
        let prev = self.shared.state.fetch_or(CLAIMED, Ordering::AcqRel);
        if prev & CLAIMED != 0 {
            return None;
        }
        Some(Claim { relay: self })
    }

    /// Wakes it as its future's waker would: the host task polls it, or the
    /// caller that holds it, if one does.
    pub fn wake(&self) {
        self.waker.wake_by_ref();
    }

    /// Drops the future (waiting for a poll in progress to end) and lets
    /// the host task finish.
    pub fn cancel(&self) {
        let fut = lock(&self.shared.fut).take();
        drop(fut);
        self.shared.wake_host();
    }

    /// True once the future finished or was cancelled.
    pub fn is_finished(&self) -> bool {
        lock(&self.shared.fut).is_none()
    }

    /// Polls the future once, unless another thread is polling it.
    fn poll_inner(&self) -> Step {
        let mut fut = match self.shared.fut.try_lock() {
            Ok(g) => g,
            Err(TryLockError::WouldBlock) => return Step::Busy,
            // A poll that panicked left no torn state behind: the future
            // is either there or not.
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
        };
        let Some(f) = fut.as_mut() else {
            return Step::Finished;
        };
        // Served from here on: a wake-up during the poll marks it again.
        self.shared.state.fetch_and(!NOTIFIED, Ordering::AcqRel);
        let mut cx = Context::from_waker(&self.waker);
        match f.as_mut().poll(&mut cx) {
            Poll::Ready(()) => {
                *fut = None;
                drop(fut);
                // A caller that finished it lets the host task end too.
                self.shared.wake_host();
                Step::Finished
            }
            Poll::Pending => Step::Running,
        }
    }
}

/// What one poll through the relay found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// The future is still running.
    Running,
    /// Another thread was polling it: not polled.
    Busy,
    /// The future has finished (or was cancelled).
    Finished,
}

/// A caller's claim on a [`Relay`]: while it lives, wake-ups go to the
/// caller, who polls through it; dropped, it hands any wake-up it did not
/// serve to the host task.
#[derive(Debug)]
pub struct Claim<'a> {
    relay: &'a Relay,
}

impl Claim<'_> {
    /// Polls the future once from the calling thread (unless the host is
    /// polling it right now).
    pub fn poll(&self) -> Step {
        self.relay.poll_inner()
    }
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        let prev = self
            .relay
            .shared
            .state
            .fetch_and(!CLAIMED, Ordering::AcqRel);
        if prev & NOTIFIED != 0 {
            self.relay.shared.wake_host();
        }
    }
}
