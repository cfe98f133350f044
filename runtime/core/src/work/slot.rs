//! The completion slot: the state machine shared by an [`OpFuture`](super::OpFuture)
//! future and the backend that completes it. No I/O happens here, so loom
//! can check every interleaving of complete, fail, poll and drop.

use std::task::{Poll, Waker};

use crate::error::WorkError;
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

enum State<T> {
    Pending { waker: Option<Waker> },
    Ready(Result<T, WorkError>),
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
    pub(crate) fn resolve(
        &self,
        outcome: Result<T, WorkError>,
    ) -> Result<(), Result<T, WorkError>> {
        let waker = {
            let mut st = lock(&self.state);
            match &mut *st {
                State::Pending { waker } => {
                    let w = waker.take();
                    *st = State::Ready(outcome);
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

    /// Polls for the outcome, registering `waker` if it is not there yet.
    /// `Ready(None)` means the outcome was already taken.
    pub(crate) fn poll(&self, waker: &Waker) -> Poll<Option<Result<T, WorkError>>> {
        let mut st = lock(&self.state);
        match &mut *st {
            State::Pending { waker: slot } => {
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
            State::Pending { waker: Some(w) } => w.clone(),
            _ => return,
        };
        waker.wake();
    }

    /// Takes the outcome if it is there, without registering a waker.
    pub(crate) fn try_take(&self) -> Option<Result<T, WorkError>> {
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
            State::Pending { .. } => WorkStatus::Pending,
            State::Ready(Ok(_)) => WorkStatus::Finished,
            State::Ready(Err(_)) => WorkStatus::Failed,
            State::Consumed => WorkStatus::Consumed,
        }
    }
}
