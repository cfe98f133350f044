//! [`CommCache::get`] and its future, [`GetComm`]: one waiter of a key.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use super::cache::{CommCache, Start};
use super::factory::{CommFactory, CommResult};
use super::flight::{Flight, Init};
use super::key::CommKey;
use crate::sync::{lock, Arc};

pub(super) enum Phase<F: CommFactory> {
    Start,
    Waiting { flight: Arc<Flight<F>>, id: u64 },
}

impl<F: CommFactory> CommCache<F> {
    /// The communicator for `key`, created on first use.
    ///
    /// A cached communicator is returned at once. Otherwise the key goes into
    /// the in-initialization map (or joins the initialization already there)
    /// and the future resolves when that initialization finishes; every
    /// caller then gets the same communicator or the same error.
    ///
    /// # Errors
    ///
    /// * [`CommCacheError::Init`]: the factory failed (nothing is cached; a
    ///   later call retries).
    /// * [`CommCacheError::Aborted`]: the communicator, or the whole cache,
    ///   was aborted.
    /// * [`CommCacheError::InitPanicked`]: the factory panicked.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future leaves the initialization running for the other
    /// waiters (one of them takes over polling it). If no one else waits, it
    /// stays parked in the in-initialization map and the next call for the
    /// key resumes it with the same store key.
    ///
    /// [`CommCacheError::Init`]: super::CommCacheError::Init
    /// [`CommCacheError::Aborted`]: super::CommCacheError::Aborted
    /// [`CommCacheError::InitPanicked`]: super::CommCacheError::InitPanicked
    pub fn get(&self, key: CommKey) -> GetComm<'_, F> {
        GetComm {
            cache: self,
            key: key.normalized(),
            phase: Phase::Start,
        }
    }
}

/// The future of [`CommCache::get`].
///
/// # Cancel safety
///
/// See [`CommCache::get`]: dropping it never cancels the initialization for
/// the other waiters.
#[must_use = "futures do nothing unless polled"]
pub struct GetComm<'a, F: CommFactory> {
    pub(super) cache: &'a CommCache<F>,
    pub(super) key: CommKey,
    pub(super) phase: Phase<F>,
}

impl<F: CommFactory> Unpin for GetComm<'_, F> {}

impl<F: CommFactory> fmt::Debug for GetComm<'_, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GetComm")
            .field("group", &self.cache.group)
            .field("key", &self.key)
            .field("waiting", &matches!(self.phase, Phase::Waiting { .. }))
            .finish()
    }
}

impl<F: CommFactory> Future for GetComm<'_, F> {
    type Output = CommResult<F>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        if let Phase::Start = this.phase {
            match this.cache.start(&this.key, cx.waker()) {
                Start::Ready(out) => return Poll::Ready(out),
                Start::Joined(flight, id) => this.phase = Phase::Waiting { flight, id },
            }
        }
        let Phase::Waiting { flight, id } = &this.phase else {
            return Poll::Pending;
        };
        let polled = this.cache.drive(flight, *id, cx);
        if polled.is_ready() {
            // Polled again after completion, the future looks the key up
            // afresh instead of panicking.
            this.phase = Phase::Start;
        }
        polled
    }
}

impl<F: CommFactory> Drop for GetComm<'_, F> {
    fn drop(&mut self) {
        let Phase::Waiting { flight, id } = &self.phase else {
            return;
        };
        let wakers = {
            let mut fl = lock(&flight.inner);
            fl.remove_waiter(*id);
            if fl.driver == Some(*id) {
                fl.driver = None;
                if matches!(fl.init, Init::Parked(_)) {
                    // The initialization's waker was ours: hand it over.
                    fl.waiters.iter().map(|(_, w)| w.clone()).collect()
                } else {
                    Vec::new()
                }
            } else {
                Vec::new()
            }
        };
        for w in wakers {
            w.wake();
        }
    }
}
