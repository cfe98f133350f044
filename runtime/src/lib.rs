//! chorus-runtime: how collective work is tracked, ordered, completed and
//! watched, independent of the backend that runs it.
//!
//! A map of the crate:
//!
//! * [`work`]: the [`Work`] future a collective returns, its
//!   completion slot and the per-group [`Registry`] of
//!   in-flight ops. No I/O: loom checks it.
//! * [`comm_cache`]: the per-group communicator cache with its
//!   in-initialization map (lazy single-flight init, store-key choice,
//!   abort), generic over the communicator. No I/O: loom checks it.
//! * [`error`]: [`WorkError`], the typed error of an op,
//!   carrying rank, group, sequence number and op.
//! * [`store`]: the key-value store (TCP server and client, prefix store,
//!   in-memory store) used for rendezvous and id exchange.
//! * [`rendezvous`]: how the ranks of a job find each other (torchrun,
//!   SLURM or Open MPI environment, or a builder) through rank 0's store.
//! * [`launcher`]: what `chorus-run` does (start local ranks, prefix their
//!   output, forward signals, stop the others on failure), as a library.
//! * [`rt`]: chorus's own background I/O threads (tokio), so futures stay
//!   executor-agnostic.
//! * [`cuda`]: the only module that calls the CUDA driver (devices, streams,
//!   events); typed errors where there is no GPU.
//! * [`flight_recorder`]: the bounded ring of each group's last ops, its
//!   JSON dumps, and the divergence analysis behind `chorus-trace`.
//! * [`reactor`]: the completion reactor thread that completes GPU ops
//!   when their end event completes.
//! * [`propagation`]: opt-in error propagation through the store: the rank
//!   that detects a failure publishes it, its peers fail fast with
//!   [`WorkError::Remote`].
//! * [`watchdog`]: the per-process thread that times out ops, applies error
//!   policies and dumps the flight recorder; the heartbeat monitor.
//! * `sync`: std primitives, swapped for loom's under `cfg(loom)`.
#![warn(missing_docs)]
// Under `cfg(loom)` (the loom suite) only the I/O-free state machines are
// compiled: with the flag set for every crate, tokio drops its networking,
// process and signal APIs, which the I/O layers need.

pub mod comm_cache;
#[cfg(not(loom))]
pub mod cuda;
pub mod error;
pub mod flight_recorder;
#[cfg(not(loom))]
pub mod launcher;
#[doc(hidden)]
pub mod profile;
#[cfg(not(loom))]
pub mod propagation;
#[cfg(not(loom))]
pub mod reactor;
#[cfg(not(loom))]
pub mod rendezvous;
#[cfg(not(loom))]
pub mod rt;
#[cfg(not(loom))]
pub mod store;
pub(crate) mod sync;
#[cfg(not(loom))]
pub mod watchdog;
pub mod work;

pub use error::{OpContext, WorkError};
pub use work::{Completer, FinishedProbe, Registry, Work, WorkStatus};
