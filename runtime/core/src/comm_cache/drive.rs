//! Driving an initialization: the waiter that polls the factory's future,
//! publishing its outcome to every waiter, and failing it if the factory
//! panics.

use std::future::Future;
use std::mem;
use std::task::{Context, Poll};

use super::cache::{Cached, CommCache};
use super::factory::{CommFactory, CommResult};
use super::flight::{Flight, Init};
use super::key::CommCacheError;
use crate::sync::{lock, Arc, Ordering};

impl<F: CommFactory> CommCache<F> {
    /// One poll of waiter `id` of `flight`: returns the outcome if it is
    /// there; otherwise polls the initialization if nobody else is, or
    /// sleeps on the waker list.
    pub(super) fn drive(
        &self,
        flight: &Arc<Flight<F>>,
        id: u64,
        cx: &mut Context<'_>,
    ) -> Poll<CommResult<F>> {
        let parked = {
            let mut fl = lock(&flight.inner);
            // Always keep this waiter's current waker: abort, completion and
            // driver hand-over wake through the list.
            fl.set_waker(id, cx.waker());
            match mem::replace(&mut fl.init, Init::Driving) {
                Init::Done(outcome) => {
                    let out = outcome.clone();
                    fl.init = Init::Done(outcome);
                    fl.remove_waiter(id);
                    return Poll::Ready(out);
                }
                Init::Driving => return Poll::Pending,
                Init::NotStarted => {
                    fl.driver = Some(id);
                    None
                }
                Init::Parked(fut) => {
                    fl.driver = Some(id);
                    Some(fut)
                }
            }
        };
        // This waiter now holds the initialization: poll it outside the lock.
        let mut guard = PanicGuard {
            cache: self,
            flight,
            armed: true,
        };
        let mut fut = match parked {
            Some(fut) => fut,
            None => {
                let n = self.created.fetch_add(1, Ordering::SeqCst) + 1;
                tracing::info!(
                    target: "chorus_core::comm_cache",
                    group = %self.group,
                    key = %flight.key,
                    store_key = %flight.store_key,
                    created = n,
                    "creating communicator"
                );
                Box::pin(self.factory.create(&flight.key, flight.store_key.clone()))
            }
        };
        let polled = fut.as_mut().poll(cx);
        guard.armed = false;
        match polled {
            Poll::Pending => {
                let mut fl = lock(&flight.inner);
                match &fl.init {
                    Init::Done(outcome) => {
                        // Aborted while we were polling: cancel the init.
                        let out = outcome.clone();
                        fl.remove_waiter(id);
                        drop(fl);
                        drop(fut);
                        Poll::Ready(out)
                    }
                    _ => {
                        fl.init = Init::Parked(fut);
                        Poll::Pending
                    }
                }
            }
            Poll::Ready(result) => Poll::Ready(self.finish(flight, id, result)),
        }
    }

    /// Publishes the result of `flight`'s initialization: caches the
    /// communicator (unless the cache was aborted meanwhile), removes the
    /// in-initialization entry and wakes every waiter.
    fn finish(
        &self,
        flight: &Arc<Flight<F>>,
        id: u64,
        result: Result<F::Comm, F::Error>,
    ) -> CommResult<F> {
        let mut discarded = None;
        let mut replaced = None;
        let (outcome, wakers) = {
            let mut st = lock(&self.state);
            let mut fl = lock(&flight.inner);
            if let Init::Done(outcome) = &fl.init {
                // Aborted while we were polling: the result is not cached.
                let out = outcome.clone();
                fl.remove_waiter(id);
                drop(fl);
                drop(st);
                drop(result);
                return out;
            }
            let key = &flight.key;
            let outcome = match result {
                Ok(comm) => match &st.aborted {
                    Some(reason) => {
                        discarded = Some(comm);
                        Err(self.aborted_error(key, reason))
                    }
                    None => {
                        let comm = Arc::new(comm);
                        let old = st.cached.insert(
                            key.clone(),
                            Cached {
                                comm: comm.clone(),
                                aborted: None,
                            },
                        );
                        // The in-initialization map admits one flight per
                        // key, so nothing is replaced; were it, the old
                        // communicator is dropped outside the lock.
                        replaced = old;
                        Ok(comm)
                    }
                },
                Err(cause) => Err(CommCacheError::Init {
                    group: self.group.clone(),
                    key: key.clone(),
                    store_key: flight.store_key.clone(),
                    cause,
                }),
            };
            if st
                .initializing
                .get(key)
                .is_some_and(|f| Arc::ptr_eq(f, flight))
            {
                st.initializing.remove(key);
            }
            fl.init = Init::Done(outcome.clone());
            fl.driver = None;
            (outcome, fl.take_wakers(Some(id)))
        };
        drop(discarded);
        drop(replaced);
        match &outcome {
            Ok(_) => tracing::info!(
                target: "chorus_core::comm_cache",
                group = %self.group,
                key = %flight.key,
                store_key = %flight.store_key,
                waiters = wakers.len() + 1,
                "communicator ready"
            ),
            Err(e) => tracing::warn!(
                target: "chorus_core::comm_cache",
                group = %self.group,
                key = %flight.key,
                store_key = %flight.store_key,
                waiters = wakers.len() + 1,
                error = %e,
                "communicator initialization failed"
            ),
        }
        for w in wakers {
            w.wake();
        }
        outcome
    }
}

/// Fails `flight` if the factory panics while this waiter drives it, so the
/// other waiters do not hang on an initialization nobody holds.
struct PanicGuard<'a, F: CommFactory> {
    cache: &'a CommCache<F>,
    flight: &'a Arc<Flight<F>>,
    armed: bool,
}

impl<F: CommFactory> Drop for PanicGuard<'_, F> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let wakers = {
            let mut st = lock(&self.cache.state);
            let mut fl = lock(&self.flight.inner);
            let key = &self.flight.key;
            if st
                .initializing
                .get(key)
                .is_some_and(|f| Arc::ptr_eq(f, self.flight))
            {
                st.initializing.remove(key);
            }
            if !matches!(fl.init, Init::Done(_)) {
                fl.init = Init::Done(Err(CommCacheError::InitPanicked {
                    group: self.cache.group.clone(),
                    key: key.clone(),
                }));
            }
            fl.driver = None;
            fl.take_wakers(None)
        };
        for w in wakers {
            w.wake();
        }
    }
}
