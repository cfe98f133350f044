//! The settings chorus reads from the environment: the one place of this
//! layer where a `CHORUS_*` variable is read.
//!
//! Every variable has a builder equivalent (a field of the settings struct
//! it fills, or a builder method), and `Default` of every settings struct
//! is the plain defaults, never the environment: a program that builds its
//! settings explicitly is not changed by the environment it runs in. The
//! group builder ([`ProcessGroup::builder`](crate::ProcessGroup::builder))
//! starts from the environment's settings, which its methods override.
//! docs/CONFIG.md lists every variable of every layer.
//!
//! | variable | default | fills |
//! |---|---|---|
//! | `CHORUS_WATCHDOG` | `1` | [`WatchdogConfig::enabled`] (`0`: no watchdog) |
//! | `CHORUS_WATCHDOG_INTERVAL_MS` | `100` | [`WatchdogConfig::interval`] |
//! | `CHORUS_HEARTBEAT_TIMEOUT_S` | `60` | [`WatchdogConfig::heartbeat_timeout`] |
//! | `CHORUS_TRACE_DIR` | temp folder | [`WatchdogConfig::dump_dir`] |
//! | `CHORUS_DUMP_ON_SIGUSR1` | `1` | [`WatchdogConfig::dump_on_sigusr1`] |
//! | `CHORUS_PROPAGATE_ERRORS` | `0` | [`GroupBuilder::propagate_errors`](crate::GroupBuilder::propagate_errors) |
//! | `CHORUS_CHECK_OPS` | `0` | [`GroupBuilder::check_ops`](crate::GroupBuilder::check_ops) (`1`: every op's signature checked against every rank's) |
//! | `CHORUS_PEER_LIVENESS_MS` | `10000` | [`GroupBuilder::peer_liveness`](crate::GroupBuilder::peer_liveness) (`0`: off) |
//! | `CHORUS_RANK_RESTARTS` | `0` | set by `chorus-run --max-restarts`: above 0, [`GroupBuilder::init_from_env`](crate::GroupBuilder::init_from_env) rejoins the running job |
//! | `CHORUS_REJOIN_TIMEOUT_MS` | `60000` | [`GroupBuilder::rejoin_timeout`](crate::GroupBuilder::rejoin_timeout) |
//! | `CHORUS_SHM` | `1` | [`TcpOptions::shared_memory`] |
//! | `CHORUS_LIVENESS_TIMEOUT_S` | `10` | [`TcpOptions::liveness_timeout`] (`0`: off) |
//! | `CHORUS_TCP_SPIN_US` | `100` | [`TcpOptions::caller_spin`] (the caller yields its core between looks where ranks outnumber cores) |
//! | `CHORUS_NCCL_BLOCKING` | `1` | [`NcclOptions::blocking_ops`] |
//! | `CHORUS_POLL_SPIN_US` | `10` | [`NcclOptions::poll_spin`] |
//! | `CHORUS_NCCL_REFORM` | `fresh` | [`NcclOptions::reform`] (`shrink` or `fresh`) |
//! | `CHORUS_NCCL_PROFILE` | `0` | `chorus_core::profile::set_enabled` (feature `profile`) |

use std::path::PathBuf;
use std::time::Duration;

use crate::backend::nccl::{NcclOptions, ReformComms};
use crate::backend::tcp::TcpOptions;
use crate::watchdog::WatchdogConfig;

/// The value of `name`, trimmed; `None` when unset or not Unicode.
fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().map(|v| v.trim().to_owned())
}

/// A number in `name`; `None` when unset or not a number.
fn number(name: &str) -> Option<u64> {
    var(name).and_then(|v| v.parse().ok())
}

/// A switch in `name`: `0`, `false`, `off` or `no` is off, anything else
/// is on, unset or empty is `default`.
fn switch(name: &str, default: bool) -> bool {
    match var(name) {
        Some(v) if !v.is_empty() => !matches!(
            v.to_ascii_lowercase().as_str(),
            "0" | "false" | "off" | "no"
        ),
        _ => default,
    }
}

impl WatchdogConfig {
    /// The defaults, overridden by `CHORUS_WATCHDOG_INTERVAL_MS` (at least
    /// 1), `CHORUS_HEARTBEAT_TIMEOUT_S` (at least 1), `CHORUS_TRACE_DIR`,
    /// `CHORUS_DUMP_ON_SIGUSR1` and `CHORUS_WATCHDOG`.
    pub fn from_env() -> WatchdogConfig {
        let d = WatchdogConfig::default();
        WatchdogConfig {
            interval: number("CHORUS_WATCHDOG_INTERVAL_MS")
                .map_or(d.interval, |ms| Duration::from_millis(ms.max(1))),
            heartbeat_timeout: number("CHORUS_HEARTBEAT_TIMEOUT_S")
                .map_or(d.heartbeat_timeout, |s| Duration::from_secs(s.max(1))),
            dump_dir: std::env::var_os("CHORUS_TRACE_DIR").map_or(d.dump_dir, PathBuf::from),
            dump_on_sigusr1: switch("CHORUS_DUMP_ON_SIGUSR1", d.dump_on_sigusr1),
            enabled: switch("CHORUS_WATCHDOG", d.enabled),
        }
    }
}

impl TcpOptions {
    /// The defaults, with `CHORUS_SHM=0` turning shared memory off,
    /// `CHORUS_LIVENESS_TIMEOUT_S` setting the liveness timeout in seconds
    /// (`0`: off) and `CHORUS_TCP_SPIN_US` the caller spin in microseconds
    /// (at most 10,000; `0`: off).
    pub fn from_env() -> TcpOptions {
        let d = TcpOptions::default();
        TcpOptions {
            shared_memory: switch("CHORUS_SHM", d.shared_memory),
            liveness_timeout: number("CHORUS_LIVENESS_TIMEOUT_S")
                .map_or(d.liveness_timeout, Duration::from_secs),
            caller_spin: number("CHORUS_TCP_SPIN_US")
                .map(|us| Duration::from_micros(us.min(10_000)))
                .or(d.caller_spin),
            ..d
        }
    }
}

impl NcclOptions {
    /// The defaults, with `CHORUS_NCCL_BLOCKING=0` turning the blocking
    /// twin off, `CHORUS_POLL_SPIN_US` setting the first poll's watch
    /// (at most 1000 µs) and `CHORUS_NCCL_REFORM` (`shrink` or `fresh`)
    /// how a re-formed group gets its communicator.
    pub fn from_env() -> NcclOptions {
        let d = NcclOptions::default();
        NcclOptions {
            blocking_ops: switch("CHORUS_NCCL_BLOCKING", d.blocking_ops),
            poll_spin: number("CHORUS_POLL_SPIN_US")
                .map_or(d.poll_spin, |us| Duration::from_micros(us.min(1000))),
            reform: var("CHORUS_NCCL_REFORM")
                .and_then(|v| ReformComms::parse(&v))
                .unwrap_or(d.reform),
            ..d
        }
    }
}

/// Whether `CHORUS_PROPAGATE_ERRORS` switches error propagation on (off
/// unless set).
pub(crate) fn propagate_errors() -> bool {
    switch("CHORUS_PROPAGATE_ERRORS", false)
}

/// Whether `CHORUS_CHECK_OPS` switches the checked mode on (off unless
/// `1`).
pub(crate) fn check_ops() -> bool {
    switch("CHORUS_CHECK_OPS", false)
}

/// The peer liveness timeout of a group (`CHORUS_PEER_LIVENESS_MS`,
/// default [`DEFAULT_PEER_LIVENESS`](crate::liveness::DEFAULT_PEER_LIVENESS); `0`: off).
pub(crate) fn peer_liveness() -> Duration {
    number("CHORUS_PEER_LIVENESS_MS").map_or(
        crate::liveness::DEFAULT_PEER_LIVENESS,
        Duration::from_millis,
    )
}

/// How many times the launcher restarted this rank in place
/// (`CHORUS_RANK_RESTARTS`, set by `chorus-run`; 0 when unset).
pub(crate) fn rank_restarts() -> u64 {
    number("CHORUS_RANK_RESTARTS").unwrap_or(0)
}

/// Default time a replacement rank waits to be admitted into the running
/// group ([`GroupBuilder::rejoin_timeout`](crate::GroupBuilder::rejoin_timeout)).
pub const DEFAULT_REJOIN_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a replacement rank waits to be admitted
/// (`CHORUS_REJOIN_TIMEOUT_MS`, default [`DEFAULT_REJOIN_TIMEOUT`]).
pub(crate) fn rejoin_timeout() -> Duration {
    number("CHORUS_REJOIN_TIMEOUT_MS").map_or(DEFAULT_REJOIN_TIMEOUT, Duration::from_millis)
}

/// Turns on the enqueue profile when `CHORUS_NCCL_PROFILE=1` (only with
/// the `profile` feature; otherwise there is nothing to turn on).
pub(crate) fn apply_profile() {
    if switch("CHORUS_NCCL_PROFILE", false) {
        chorus_core::profile::set_enabled(true);
    }
}
