//! One initialization in flight ([`Flight`]): the entry of the
//! in-initialization map, with its future and its waiters.

use std::mem;
use std::pin::Pin;
use std::task::Waker;

use super::factory::{CommFactory, CommResult};
use super::key::CommKey;
use crate::sync::Mutex;

/// One initialization in flight: the entry of the in-initialization map.
pub(super) struct Flight<F: CommFactory> {
    pub(super) key: CommKey,
    pub(super) store_key: String,
    pub(super) inner: Mutex<FlightInner<F>>,
}

pub(super) enum Init<F: CommFactory> {
    /// Nobody has called the factory yet.
    NotStarted,
    /// The factory's future, waiting to be polled again.
    Parked(Pin<Box<F::Init>>),
    /// A waiter is polling the future right now.
    Driving,
    /// Finished (or aborted): every waiter gets this.
    Done(CommResult<F>),
}

pub(super) struct FlightInner<F: CommFactory> {
    pub(super) init: Init<F>,
    /// The waiter that polled the future last (its waker is the one the
    /// future holds).
    pub(super) driver: Option<u64>,
    /// Every waiter's current waker, by waiter id.
    pub(super) waiters: Vec<(u64, Waker)>,
    pub(super) next_waiter: u64,
}

impl<F: CommFactory> FlightInner<F> {
    pub(super) fn set_waker(&mut self, id: u64, waker: &Waker) {
        match self.waiters.iter_mut().find(|(i, _)| *i == id) {
            Some((_, w)) => {
                if !w.will_wake(waker) {
                    *w = waker.clone();
                }
            }
            None => self.waiters.push((id, waker.clone())),
        }
    }

    pub(super) fn remove_waiter(&mut self, id: u64) {
        self.waiters.retain(|(i, _)| *i != id);
    }

    /// Takes every waker but `except`'s.
    pub(super) fn take_wakers(&mut self, except: Option<u64>) -> Vec<Waker> {
        mem::take(&mut self.waiters)
            .into_iter()
            .filter(|(i, _)| Some(*i) != except)
            .map(|(_, w)| w)
            .collect()
    }
}
