//! The communicator cache of one process group, with its in-initialization
//! map (docs/ARCHITECTURE.md, "Communicators").
//!
//! * **One cache per group**, never shared, even between groups with the
//!   same members.
//! * **Keys**: the device sequence for collectives, the sorted rank pair for
//!   single point-to-point ops ([`CommKey`]).
//! * **Lazy, single flight.** The first use of a key puts it into the
//!   in-initialization map; every concurrent caller for that key waits on
//!   that one initialization. On success the communicator moves to the cache
//!   and every waiter gets the same [`Arc`]; on failure every waiter gets the
//!   same error and neither map keeps the key, so a later use retries.
//! * **Store keys.** The cache chooses the store key under which the
//!   communicator's unique id is exchanged: `"comm/{n}"` for collective keys,
//!   `n` being a per-group counter that moves exactly once per collective
//!   initialization, and `"p2p/{lo}:{hi}"` for pair keys, which never move
//!   the counter. Ranks that issue their ops in the same program order thus
//!   read and write the same store keys.
//! * **Abort** marks every cached communicator aborted (it stays in the
//!   cache, and using it is an error from then on), fails every waiter of an
//!   initialization in flight, keeps those initializations' results out of
//!   the cache, and makes every later initialization fail at once.
//!
//! No I/O happens here: the communicator type and the way it is created come
//! from a [`CommFactory`] (the NCCL backend plugs in there). The state is
//! guarded by `crate::sync` primitives, so the loom suite checks every
//! interleaving of concurrent first uses, failures, abort and cancellation.
//!
//! # Who runs an initialization
//!
//! The factory's future is stored in the in-initialization entry and driven
//! by whichever waiter polls it; the others sleep on a waker list and are
//! woken when it finishes (no polling). If the waiter that last drove it is
//! dropped, another waiter takes over. If every waiter goes away, the
//! initialization stays parked in the map and the next use of the key resumes
//! it, so its store key (and the other ranks' view of it) never changes.

mod key;

pub use key::{CommCacheError, CommKey};

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::mem;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use crate::sync::{lock, Arc, AtomicU64, Mutex, Ordering};

/// Creates communicators for a [`CommCache`].
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

/// What [`CommCache::get`] resolves to.
pub type CommResult<F> =
    Result<Arc<<F as CommFactory>::Comm>, CommCacheError<<F as CommFactory>::Error>>;

struct Cached<C> {
    comm: Arc<C>,
    aborted: Option<std::sync::Arc<str>>,
}

struct State<F: CommFactory> {
    cached: BTreeMap<CommKey, Cached<F::Comm>>,
    initializing: BTreeMap<CommKey, Arc<Flight<F>>>,
    /// The next collective store-key number.
    next_collective: u64,
    /// The first abort's reason.
    aborted: Option<std::sync::Arc<str>>,
}

/// One initialization in flight: the entry of the in-initialization map.
struct Flight<F: CommFactory> {
    key: CommKey,
    store_key: String,
    inner: Mutex<FlightInner<F>>,
}

enum Init<F: CommFactory> {
    /// Nobody has called the factory yet.
    NotStarted,
    /// The factory's future, waiting to be polled again.
    Parked(Pin<Box<F::Init>>),
    /// A waiter is polling the future right now.
    Driving,
    /// Finished (or aborted): every waiter gets this.
    Done(CommResult<F>),
}

struct FlightInner<F: CommFactory> {
    init: Init<F>,
    /// The waiter that polled the future last (its waker is the one the
    /// future holds).
    driver: Option<u64>,
    /// Every waiter's current waker, by waiter id.
    waiters: Vec<(u64, Waker)>,
    next_waiter: u64,
}

impl<F: CommFactory> FlightInner<F> {
    fn set_waker(&mut self, id: u64, waker: &Waker) {
        match self.waiters.iter_mut().find(|(i, _)| *i == id) {
            Some((_, w)) => {
                if !w.will_wake(waker) {
                    *w = waker.clone();
                }
            }
            None => self.waiters.push((id, waker.clone())),
        }
    }

    fn remove_waiter(&mut self, id: u64) {
        self.waiters.retain(|(i, _)| *i != id);
    }

    /// Takes every waker but `except`'s.
    fn take_wakers(&mut self, except: Option<u64>) -> Vec<Waker> {
        mem::take(&mut self.waiters)
            .into_iter()
            .filter(|(i, _)| Some(*i) != except)
            .map(|(_, w)| w)
            .collect()
    }
}

/// The communicator cache of one process group.
pub struct CommCache<F: CommFactory> {
    group: std::sync::Arc<str>,
    factory: F,
    state: Mutex<State<F>>,
    created: AtomicU64,
}

impl<F: CommFactory> fmt::Debug for CommCache<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let st = lock(&self.state);
        f.debug_struct("CommCache")
            .field("group", &self.group)
            .field("cached", &st.cached.len())
            .field("in_flight", &st.initializing.len())
            .field("next_collective", &st.next_collective)
            .field("aborted", &st.aborted)
            .finish()
    }
}

impl<F: CommFactory> CommCache<F> {
    /// An empty cache for group `group` (the name appears in errors and
    /// logs), creating communicators with `factory`.
    pub fn new(group: impl Into<std::sync::Arc<str>>, factory: F) -> Self {
        CommCache {
            group: group.into(),
            factory,
            state: Mutex::new(State {
                cached: BTreeMap::new(),
                initializing: BTreeMap::new(),
                next_collective: 0,
                aborted: None,
            }),
            created: AtomicU64::new(0),
        }
    }

    /// The group this cache belongs to.
    pub fn group(&self) -> &str {
        &self.group
    }

    /// The factory.
    pub fn factory(&self) -> &F {
        &self.factory
    }

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
    pub fn get(&self, key: CommKey) -> GetComm<'_, F> {
        GetComm {
            cache: self,
            key: key.normalized(),
            phase: Phase::Start,
        }
    }

    /// How many communicators the factory was asked to create (successful or
    /// not).
    pub fn created(&self) -> u64 {
        self.created.load(Ordering::SeqCst)
    }

    /// How many communicators are cached, aborted ones included.
    pub fn cached(&self) -> usize {
        lock(&self.state).cached.len()
    }

    /// How many keys are in the in-initialization map.
    pub fn in_flight(&self) -> usize {
        lock(&self.state).initializing.len()
    }

    /// How many collective initializations have started: the per-group
    /// counter behind the `"comm/{n}"` store keys (the next one uses this
    /// number).
    pub fn collective_counter(&self) -> u64 {
        lock(&self.state).next_collective
    }

    /// The reason of the first abort, if the cache was aborted.
    pub fn aborted(&self) -> Option<std::sync::Arc<str>> {
        lock(&self.state).aborted.clone()
    }

    /// Aborts the cache: marks every cached communicator aborted (they stay
    /// in the cache; using them is an error from now on), fails the waiters of
    /// every initialization in flight and drops those initializations (their
    /// results, if any arrive, are not cached), and makes every later
    /// initialization fail at once. The first abort's reason is kept.
    ///
    /// Returns the communicators this call marked aborted, for the backend to
    /// tear down (for NCCL, `ncclCommAbort`). Calling it again returns none.
    pub fn abort(&self, reason: impl fmt::Display) -> Vec<Arc<F::Comm>> {
        let reason: std::sync::Arc<str> = reason.to_string().into();
        let mut wakers = Vec::new();
        let mut cancelled = Vec::new();
        let comms: Vec<Arc<F::Comm>> = {
            let mut st = lock(&self.state);
            if st.aborted.is_none() {
                st.aborted = Some(reason.clone());
            }
            let comms = st
                .cached
                .values_mut()
                .filter(|c| c.aborted.is_none())
                .map(|c| {
                    c.aborted = Some(reason.clone());
                    c.comm.clone()
                })
                .collect();
            for (key, flight) in mem::take(&mut st.initializing) {
                let mut fl = lock(&flight.inner);
                let err = CommCacheError::Aborted {
                    group: self.group.clone(),
                    key,
                    reason: reason.clone(),
                };
                match mem::replace(&mut fl.init, Init::Done(Err(err))) {
                    Init::Parked(fut) => cancelled.push(fut),
                    // Finished flights leave the map under this same lock, so
                    // this one is not finished; keep any outcome regardless.
                    Init::Done(prev) => fl.init = Init::Done(prev),
                    Init::NotStarted | Init::Driving => {}
                }
                fl.driver = None;
                wakers.extend(fl.take_wakers(None));
            }
            comms
        };
        let n_flights = cancelled.len();
        // Cancelled initializations and wakers run user code: outside the lock.
        drop(cancelled);
        for w in wakers {
            w.wake();
        }
        tracing::warn!(
            target: "chorus_core::comm_cache",
            group = %self.group,
            %reason,
            comms = comms.len(),
            cancelled_inits = n_flights,
            "communicator cache aborted"
        );
        comms
    }

    fn aborted_error(
        &self,
        key: &CommKey,
        reason: &std::sync::Arc<str>,
    ) -> CommCacheError<F::Error> {
        CommCacheError::Aborted {
            group: self.group.clone(),
            key: key.clone(),
            reason: reason.clone(),
        }
    }

    /// Looks `key` up; on a miss joins (or starts) its initialization and
    /// registers `waker` there.
    fn start(&self, key: &CommKey, waker: &Waker) -> Start<F> {
        let mut st = lock(&self.state);
        if let Some(c) = st.cached.get(key) {
            return Start::Ready(match &c.aborted {
                Some(reason) => Err(self.aborted_error(key, reason)),
                None => Ok(c.comm.clone()),
            });
        }
        if let Some(reason) = &st.aborted {
            return Start::Ready(Err(self.aborted_error(key, reason)));
        }
        let flight = match st.initializing.get(key) {
            Some(f) => f.clone(),
            None => {
                let store_key = match key {
                    CommKey::Pair { lo, hi } => format!("p2p/{lo}:{hi}"),
                    CommKey::Devices(_) => {
                        let n = st.next_collective;
                        st.next_collective += 1;
                        format!("comm/{n}")
                    }
                };
                let flight = Arc::new(Flight {
                    key: key.clone(),
                    store_key,
                    inner: Mutex::new(FlightInner {
                        init: Init::NotStarted,
                        driver: None,
                        waiters: Vec::new(),
                        next_waiter: 0,
                    }),
                });
                st.initializing.insert(key.clone(), flight.clone());
                flight
            }
        };
        let id = {
            let mut fl = lock(&flight.inner);
            let id = fl.next_waiter;
            fl.next_waiter += 1;
            fl.waiters.push((id, waker.clone()));
            id
        };
        Start::Joined(flight, id)
    }

    /// One poll of waiter `id` of `flight`: returns the outcome if it is
    /// there; otherwise polls the initialization if nobody else is, or
    /// sleeps on the waker list.
    fn drive(&self, flight: &Arc<Flight<F>>, id: u64, cx: &mut Context<'_>) -> Poll<CommResult<F>> {
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

enum Start<F: CommFactory> {
    Ready(CommResult<F>),
    Joined(Arc<Flight<F>>, u64),
}

enum Phase<F: CommFactory> {
    Start,
    Waiting { flight: Arc<Flight<F>>, id: u64 },
}

/// The future of [`CommCache::get`].
///
/// # Cancel safety
///
/// See [`CommCache::get`]: dropping it never cancels the initialization for
/// the other waiters.
#[must_use = "futures do nothing unless polled"]
pub struct GetComm<'a, F: CommFactory> {
    cache: &'a CommCache<F>,
    key: CommKey,
    phase: Phase<F>,
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

#[cfg(all(test, not(loom)))]
mod tests;
