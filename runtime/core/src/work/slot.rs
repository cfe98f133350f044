//! The completion slot: the state machine shared by an [`OpFuture`](super::OpFuture)
//! future and the backend that completes it. No I/O happens here, so loom
//! can check every interleaving of complete, fail, poll and drop.

use std::task::{Poll, Waker};

use crate::error::{Failed, WorkError};
use crate::sync::{lock, Mutex};

/// What a caller can learn about a work without waiting for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WorkStatus {
    /// Handed to the backend, not finished yet.
    Pending,
    /// Finished successfully; the result (the buffers) waits to be taken.
    Finished,
    /// Failed; awaiting the work yields the error.
    Failed,
    /// The result was already taken by the future.
    Consumed,
}

/// A work's outcome: the buffers, or the failure with the buffers where
/// they came back.
pub(crate) type Outcome<T> = Result<T, Failed<T>>;

enum State<T> {
    Pending {
        waker: Option<Waker>,
    },
    /// Failed early (abort, timeout) while the backend still holds the
    /// buffers: the outcome is the first error with the buffers the
    /// backend hands back (see [`Slot::fail_holding`]).
    Failing {
        waker: Option<Waker>,
        error: WorkError,
    },
    Ready(Outcome<T>),
    Consumed,
}

/// One-shot completion cell with a waker slot.
pub(crate) struct Slot<T> {
    state: Mutex<State<T>>,
}

impl<T> Slot<T> {
    pub(crate) fn new() -> Self {
        Slot {
            state: Mutex::new(State::Pending { waker: None }),
        }
    }

    /// Stores the op's outcome and wakes the waiting future.
    ///
    /// Returns the outcome back if the slot was already resolved (the work
    /// failed early through abort or timeout): the caller then drops it, which
    /// is the moment its buffers are released, after the backend is done.
    ///
    /// A slot that failed early while holding ([`fail_holding`](Self::fail_holding))
    /// resolves here to that first error, with the buffers of `outcome`
    /// (whether it succeeded or failed after all).
    pub(crate) fn resolve(&self, outcome: Outcome<T>) -> Result<(), Outcome<T>> {
        let waker = {
            let mut st = lock(&self.state);
            match &mut *st {
                State::Pending { waker } => {
                    let w = waker.take();
                    *st = State::Ready(outcome);
                    w
                }
                State::Failing { waker, error } => {
                    let w = waker.take();
                    let buffers = match outcome {
                        Ok(b) => Some(b),
                        Err(f) => f.buffers,
                    };
                    let error = error.clone();
                    *st = State::Ready(Err(Failed { error, buffers }));
                    w
                }
                _ => return Err(outcome),
            }
        };
        // Wake outside the lock: the woken task may poll at once.
        if let Some(w) = waker {
            w.wake();
        }
        Ok(())
    }

    /// Fails a pending slot with `error` without resolving it: the work
    /// stays pending until the backend hands its buffers back through
    /// [`resolve`](Self::resolve), and then fails with `error` and those
    /// buffers. For backends that give a failed op's buffers back
    /// promptly once they stopped touching them. A slot already failing or
    /// resolved keeps what it has.
    pub(crate) fn fail_holding(&self, error: WorkError) {
        let mut st = lock(&self.state);
        if let State::Pending { waker } = &mut *st {
            let waker = waker.take();
            *st = State::Failing { waker, error };
        }
    }

    /// True once the slot failed (early, or resolved with an error), even
    /// if it still waits for the buffers.
    pub(crate) fn has_failed(&self) -> bool {
        matches!(
            &*lock(&self.state),
            State::Failing { .. } | State::Ready(Err(_))
        )
    }

    /// Polls for the outcome, registering `waker` if it is not there yet.
    /// `Ready(None)` means the outcome was already taken.
    pub(crate) fn poll(&self, waker: &Waker) -> Poll<Option<Outcome<T>>> {
        let mut st = lock(&self.state);
        match &mut *st {
            State::Pending { waker: slot } | State::Failing { waker: slot, .. } => {
                match slot {
                    Some(w) if w.will_wake(waker) => {}
                    _ => *slot = Some(waker.clone()),
                }
                Poll::Pending
            }
            State::Ready(_) => match std::mem::replace(&mut *st, State::Consumed) {
                State::Ready(r) => Poll::Ready(Some(r)),
                _ => Poll::Ready(None),
            },
            State::Consumed => Poll::Ready(None),
        }
    }

    /// Wakes the waiting future, if one registered a waker, without
    /// resolving the slot: it polls again and finds it still pending.
    pub(crate) fn wake_early(&self) {
        let waker = match &*lock(&self.state) {
            State::Pending { waker: Some(w) } | State::Failing { waker: Some(w), .. } => w.clone(),
            _ => return,
        };
        waker.wake();
    }

    /// Takes the outcome if it is there, without registering a waker.
    pub(crate) fn try_take(&self) -> Option<Outcome<T>> {
        let mut st = lock(&self.state);
        match &*st {
            State::Ready(_) => match std::mem::replace(&mut *st, State::Consumed) {
                State::Ready(r) => Some(r),
                _ => None,
            },
            _ => None,
        }
    }

    pub(crate) fn status(&self) -> WorkStatus {
        match &*lock(&self.state) {
            // Failing: the outcome (with the buffers) is not there yet.
            State::Pending { .. } | State::Failing { .. } => WorkStatus::Pending,
            State::Ready(Ok(_)) => WorkStatus::Finished,
            State::Ready(Err(_)) => WorkStatus::Failed,
            State::Consumed => WorkStatus::Consumed,
        }
    }
}
