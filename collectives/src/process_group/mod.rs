//! [`ProcessGroup`]: the ranks of a job (or a subgroup of them) and the
//! collectives they run together.
//!
//! Files: `state` (what a group's handles share), `process_group` (the
//! handle and its ops), `builder` (making the world group, and what every
//! group's creation shares), `subgroup` (`new_group`), `batch`
//! ([`Batch`](batch::Batch): ops staged, then launched as one) and
//! `batch_ops` (a batch's ops by backend), `capture` (CUDA graph capture).

pub mod batch;
pub(crate) mod batch_ops;
pub(crate) mod builder;
pub mod capture;
#[allow(clippy::module_inception)]
mod process_group;
pub(crate) mod state;
mod subgroup;

pub use crate::config::DEFAULT_REJOIN_TIMEOUT;
pub use crate::liveness::DEFAULT_PEER_LIVENESS;
pub use builder::GroupBuilder;
pub use process_group::ProcessGroup;
pub use state::DEFAULT_TIMEOUT;
