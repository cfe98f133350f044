//! The watchdog's settings ([`WatchdogConfig`]) and what a group does on
//! an error ([`ErrorPolicy`]).

use std::path::PathBuf;
use std::time::Duration;

/// What a group does when one of its ops times out or its backend reports an
/// error.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ErrorPolicy {
    /// Abort the group's backend (close connections, abort communicators)
    /// and fail every pending work; later calls fail at once. The default.
    #[default]
    AbortGroup,
    /// Fail only the works that timed out; leave the backend alone.
    FailWorks,
    /// Dump the flight recorder and abort the process.
    AbortProcess,
}

/// Watchdog settings.
#[derive(Clone, Debug)]
pub struct WatchdogConfig {
    /// How often the watchdog polls the backends' asynchronous errors
    /// (their detection latency is at most about this, plus the time a
    /// backend's error check takes). Timeouts do not wait for it: the
    /// watchdog wakes at each op's deadline.
    pub interval: Duration,
    /// How long the watchdog may make no progress before the heartbeat
    /// monitor acts.
    pub heartbeat_timeout: Duration,
    /// Where flight-recorder dumps are written.
    pub dump_dir: PathBuf,
    /// Dump every group's recorder when the process receives SIGUSR1.
    pub dump_on_sigusr1: bool,
    /// Whether the watchdog runs at all (`CHORUS_WATCHDOG=0` turns it off:
    /// no thread, no group watched, no timeout or async-error detection).
    pub enabled: bool,
}

impl Default for WatchdogConfig {
    /// Error checks every 100 ms (as PyTorch's watchdog), a 60 s heartbeat
    /// timeout, dumps into the system temp folder, a dump on SIGUSR1, the
    /// watchdog on.
    fn default() -> Self {
        WatchdogConfig {
            interval: Duration::from_millis(100),
            heartbeat_timeout: Duration::from_secs(60),
            dump_dir: std::env::temp_dir(),
            dump_on_sigusr1: true,
            enabled: true,
        }
    }
}
