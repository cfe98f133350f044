//! Error propagation through the store (opt-in per group).
//!
//! Without it, when one rank of a group fails (an op timeout, a lost peer, a
//! mismatch, an NCCL asynchronous error, a heartbeat timeout, an abort),
//! the others learn of it only if their own ops need that rank: a rank that
//! waits on a third, stuck rank waits out its own op timeout.
//!
//! With propagation on, each rank of the group:
//!
//! * **publishes** its group's first error (anything but an invalid
//!   argument, which fails no group, and a [`WorkError::Remote`], which came
//!   from a peer) under the group-scoped store key `error/{epoch}`, as JSON
//!   naming the origin rank, the op's sequence number and name, the error
//!   kind and its message ([`RemoteFailure`]). The first rank to publish
//!   wins (`compare_set`); later ones leave the key alone. Publishing runs
//!   on chorus's runtime ([`chorus_store::rt`]) under `PUBLISH_TIMEOUT` (5 s), so a
//!   store that is gone costs a warning, never a hang. It starts before any
//!   work of the group is failed ([`Registry::set_error_hook`]), and
//!   dropping the group waits up to `FLUSH_WAIT` (2 s) for it, so a rank that
//!   exits as soon as it sees its error still tells its peers. The
//!   publisher then waits up to `ACK_WAIT` (500 ms) for every peer to acknowledge
//!   (a counter under the key), so the store — often hosted by the failing
//!   rank — stays up until the failure was delivered.
//! * **watches** that key with one background `get` on chorus's runtime
//!   (woken by the `set`, never polling; re-armed every `WATCH_WAIT` (60 s)). When
//!   a peer's failure appears, the group's pending works fail at once with
//!   [`WorkError::Remote`] naming the origin rank and its cause, and the
//!   group's [`ErrorPolicy`] is applied as for a local error (abort the
//!   group, fail the works only, or abort the process), with a
//!   flight-recorder dump. A rank's own failure is not re-applied. The
//!   watcher stops when the store fails (e.g. its host exited at the end of
//!   the job), when the group is gone, and on group shutdown.
//!
//! Nothing runs on an op's hot path: the publisher is a hook called once,
//! with the group's first error ([`Registry::set_error_hook`]), and the
//! watcher is a single waiting store request per group.
//!
//! The epoch in the key tells apart successive groups created under the
//! same name over the same store (a group re-created after an abort), so a
//! new group never fails on its predecessor's error; every rank of a group
//! must pass the same epoch (chorus derives it from the group's join
//! counter).
//!
//! Switch it on per group with `GroupBuilder::propagate_errors(true)` in
//! the `chorus` crate, or for every group of a process with
//! `CHORUS_PROPAGATE_ERRORS=1` (read by the group builder).
//!
//! Files: `timing` (the bounds of every wait), `failure` (what is published,
//! under which keys), `shared` (the state a group's publisher, watcher and
//! handle share), `publish`, `watcher`, `error_propagation` (the handle).
//!
//! [`WorkError::Remote`]: chorus_core::WorkError::Remote
//! [`Registry::set_error_hook`]: chorus_core::Registry::set_error_hook
//! [`ErrorPolicy`]: crate::watchdog::ErrorPolicy

mod error_propagation;
mod failure;
mod publish;
mod shared;
mod timing;
mod watcher;

pub(crate) use error_propagation::ErrorPropagation;
pub use failure::RemoteFailure;

#[cfg(test)]
use failure::key;

#[cfg(test)]
mod tests;
