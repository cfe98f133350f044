//! [`CommCache`]: the cached communicators and the in-initialization map
//! of one group, looking a key up, and aborting.

use std::collections::BTreeMap;
use std::fmt;
use std::mem;
use std::task::Waker;

use super::factory::{CommFactory, CommResult};
use super::flight::{Flight, FlightInner, Init};
use super::key::{CommCacheError, CommKey};
use crate::sync::{lock, Arc, AtomicU64, Mutex, Ordering};

pub(super) struct Cached<C> {
    pub(super) comm: Arc<C>,
    pub(super) aborted: Option<std::sync::Arc<str>>,
}

pub(super) struct State<F: CommFactory> {
    pub(super) cached: BTreeMap<CommKey, Cached<F::Comm>>,
    pub(super) initializing: BTreeMap<CommKey, Arc<Flight<F>>>,
    /// The next collective store-key number.
    pub(super) next_collective: u64,
    /// The first abort's reason.
    pub(super) aborted: Option<std::sync::Arc<str>>,
}

/// The communicator cache of one process group.
pub struct CommCache<F: CommFactory> {
    pub(super) group: std::sync::Arc<str>,
    pub(super) factory: F,
    pub(super) state: Mutex<State<F>>,
    pub(super) created: AtomicU64,
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

    pub(super) fn aborted_error(
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
    pub(super) fn start(&self, key: &CommKey, waker: &Waker) -> Start<F> {
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
}

/// What looking a key up found: the outcome, or a place among the
/// waiters of its initialization.
pub(super) enum Start<F: CommFactory> {
    Ready(CommResult<F>),
    Joined(Arc<Flight<F>>, u64),
}
