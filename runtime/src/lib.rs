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
//! * [`watchdog`]: the per-process thread that times out ops, applies error
//!   policies and dumps the flight recorder; the heartbeat monitor.
//! * `sync`: std primitives, swapped for loom's under `cfg(loom)`.
#![warn(missing_docs)]

pub mod comm_cache;
pub mod cuda;
pub mod error;
pub mod flight_recorder;
pub mod launcher;
#[cfg(not(loom))]
pub mod reactor;
pub mod rendezvous;
pub mod rt;
pub mod store;
pub(crate) mod sync;
pub mod watchdog;
pub mod work;

pub use error::{OpContext, WorkError};
pub use work::{Completer, Registry, Work, WorkStatus};
