//! The watchdog: one thread per process that watches every group's in-flight
//! ops for timeouts and every communicator for asynchronous errors, applies
//! the group's error policy, and dumps the flight recorder. A second thread,
//! the heartbeat monitor, notices a watchdog that stopped making progress
//! (stuck in a driver call) and acts in its place.
//!
//! # When it wakes
//!
//! The watchdog fails each op at its deadline, not on a beat: it sleeps
//! until the earliest deadline pending, and every group's registry tells
//! it each new op's deadline as the op is entered, so one earlier than the
//! thread's next wake-up brings that wake-up forward (`alarm`). The
//! backends' asynchronous-error checks run every
//! [`WatchdogConfig::interval`]. A job whose ops end in time wakes the
//! thread once per interval, whatever its rate of ops.
//!
//! Both threads are chorus's own: a blocked user executor cannot stop error
//! detection.
//!
//! # Heartbeat monitor
//!
//! The watchdog counts its rounds (the heartbeat, [`stats`]`().rounds`). The
//! monitor wakes every quarter of [`WatchdogConfig::heartbeat_timeout`]; when
//! the count has not moved for that long (the watchdog is stuck, typically
//! inside a backend's asynchronous error check such as `ncclCommGetAsyncError` in
//! a hung driver), it acts once per stall: it dumps every group's flight
//! recorder (reason `"heartbeat timeout"`), logs at error level with the
//! dump's path, and fails every watched group's pending works with
//! [`WorkError::HeartbeatTimeout`] (its own kind and message, distinct from
//! an op timeout and from a store timeout). Under [`ErrorPolicy::AbortGroup`]
//! and [`ErrorPolicy::FailWorks`] the groups are marked failed without
//! calling the backends' abort (which may be what is stuck);
//! [`ErrorPolicy::AbortProcess`] aborts the process. The monitor does not
//! call into the backends at all. Once the watchdog moves again, the
//! monitor re-arms. `collectives/tests/watchdog_heartbeat.rs` checks this with
//! a check that blocks.
//!
//! # Error propagation
//!
//! A group's first error can also be published to its peers through the
//! store, so that they fail fast with [`WorkError::Remote`] instead of each
//! waiting out its own timeout: opt-in per group, see
//! [`crate::propagation`]. The watchdog applies the group's policy to a
//! peer's failure as to a local one.
//!
//! Settings ([`WatchdogConfig`]) come from [`configure`] (before the first
//! group is watched), or else from the environment
//! ([`WatchdogConfig::from_env`]: `CHORUS_WATCHDOG_INTERVAL_MS`,
//! `CHORUS_HEARTBEAT_TIMEOUT_S`, `CHORUS_TRACE_DIR`, `CHORUS_DUMP_ON_SIGUSR1`,
//! `CHORUS_WATCHDOG`; docs/CONFIG.md). With the watchdog switched off
//! ([`WatchdogConfig::enabled`]), a group built registers nothing and no thread
//! is started, so ops time out only through blocking waits such as
//! `wait_timeout`: meant for measuring the watchdog's overhead, not for
//! production.
//!
//! Files: `config` (the settings, the error policies), `watched` (a
//! watched group), `state` (the process's watchdog state and counters),
//! `policy` (applying a policy), `alarm` (the watchdog thread's next
//! wake-up), `threads` (the watchdog and heartbeat threads, watching a
//! group, the flight-recorder dumps).
//!
//! [`WorkError::HeartbeatTimeout`]: chorus_core::WorkError::HeartbeatTimeout
//! [`WorkError::Remote`]: chorus_core::WorkError::Remote

mod alarm;
mod config;
mod policy;
mod state;
pub(crate) mod threads;
pub(crate) mod watched;

pub use config::{ErrorPolicy, WatchdogConfig};
pub use state::{configure, stats, WatchdogStats};
pub(crate) use threads::{apply_detected, apply_remote, on_group_error, watch};
pub use threads::{dump_all, enabled};
pub(crate) use watched::WatchedGroup;
