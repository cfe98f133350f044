//! chorus-runtime: how collective work is tracked, ordered, completed and
//! watched, independent of the backend that runs it.
//!
//! A map of the crate:
//!
//! * [`work`]: the [`Work`](work::Work) future a collective returns, its
//!   completion slot and the per-group [`Registry`](work::Registry) of
//!   in-flight ops. No I/O: loom checks it.
//! * [`comm_cache`]: the per-group communicator cache with its
//!   in-initialization map (lazy single-flight init, store-key choice,
//!   abort), generic over the communicator. No I/O: loom checks it.
//! * [`error`]: [`WorkError`](error::WorkError), the typed error of an op,
//!   carrying rank, group, sequence number and op.
//! * [`store`]: the key-value store (TCP server and client, prefix store,
//!   in-memory store) used for rendezvous and id exchange.
//! * [`rt`]: chorus's own background I/O threads (tokio), so futures stay
//!   executor-agnostic.
//! * `sync`: std primitives, swapped for loom's under `cfg(loom)`.
#![warn(missing_docs)]

pub mod comm_cache;
pub mod error;
pub mod rt;
pub mod store;
pub(crate) mod sync;
pub mod work;

pub use error::{OpContext, WorkError};
pub use work::{Completer, Registry, Work, WorkStatus};
