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
//!
//! Files: `key` ([`CommKey`], [`CommCacheError`]), `factory`
//! ([`CommFactory`]), `flight` (one initialization in flight), `cache`
//! ([`CommCache`]: lookup and abort), `drive` (polling an initialization
//! and publishing its outcome), `get` ([`CommCache::get`] and its future
//! [`GetComm`]: one waiter).
//!
//! [`Arc`]: std::sync::Arc

mod cache;
mod drive;
mod factory;
mod flight;
mod get;
mod key;

pub use cache::CommCache;
pub use factory::{CommFactory, CommResult, FnFactory};
pub use get::GetComm;
pub use key::{CommCacheError, CommKey};

#[cfg(all(test, not(loom)))]
mod tests;
