//! How a [`CommCache`](super::CommCache) creates communicators:
//! [`CommFactory`], and [`FnFactory`] for a closure; [`CommResult`], what
//! the cache hands out.

use std::fmt;
use std::future::Future;

use super::key::{CommCacheError, CommKey};
use crate::sync::Arc;

/// Creates communicators for a [`CommCache`](super::CommCache).
///
/// `create` itself must not block: the initialization (unique-id exchange
/// through the store, non-blocking init) happens in the future it returns.
/// The future must end on its own (store timeouts, init timeouts): the cache
/// adds no timeout of its own. Dropping the future cancels the
/// initialization (the cache does so when the group is aborted); it must then
/// release whatever it created.
pub trait CommFactory {
    /// The communicator.
    type Comm;
    /// Why an initialization failed; cloned to every waiter.
    type Error: Clone + fmt::Debug + fmt::Display;
    /// The initialization.
    type Init: Future<Output = Result<Self::Comm, Self::Error>>;

    /// Starts creating the communicator for `key`, exchanging its unique id
    /// under `store_key`.
    fn create(&self, key: &CommKey, store_key: String) -> Self::Init;
}

/// A [`CommFactory`] made of a closure `Fn(&CommKey, String) -> impl Future`.
pub struct FnFactory<F>(pub F);

impl<F> fmt::Debug for FnFactory<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("FnFactory(..)")
    }
}

impl<F, Fut, C, E> CommFactory for FnFactory<F>
where
    F: Fn(&CommKey, String) -> Fut,
    Fut: Future<Output = Result<C, E>>,
    E: Clone + fmt::Debug + fmt::Display,
{
    type Comm = C;
    type Error = E;
    type Init = Fut;

    fn create(&self, key: &CommKey, store_key: String) -> Fut {
        (self.0)(key, store_key)
    }
}

/// What [`CommCache::get`](super::CommCache::get) resolves to.
pub type CommResult<F> =
    Result<Arc<<F as CommFactory>::Comm>, CommCacheError<<F as CommFactory>::Error>>;
