//! The watchdog's process-wide state: its settings, the groups it
//! watches, its counters ([`WatchdogStats`]); set before it starts
//! ([`configure`]), read at any time ([`stats`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use super::alarm::Alarm;
use super::config::WatchdogConfig;
use super::watched::WatchedGroup;
use chorus_core::sync::lock;

/// The watchdog of this process: its settings, the groups it watches, its
/// counters and its next wake-up.
pub(super) struct State {
    pub(super) config: WatchdogConfig,
    pub(super) groups: Mutex<Vec<WatchedGroup>>,
    /// Incremented by the watchdog on every round.
    pub(super) heartbeat: AtomicU64,
    /// Global rank used to name this process's dump.
    pub(super) process_rank: AtomicU64,
    pub(super) timeouts: AtomicU64,
    pub(super) errors: AtomicU64,
    /// Rounds are skipped while set (benchmarks' in-process A/B only).
    pub(super) paused: std::sync::atomic::AtomicBool,
    /// The watchdog thread's next wake-up, brought forward by deadlines.
    pub(super) alarm: Alarm,
}

pub(super) static STATE: OnceLock<Arc<State>> = OnceLock::new();
pub(super) static PENDING_CONFIG: Mutex<Option<WatchdogConfig>> = Mutex::new(None);

/// Sets the watchdog's settings. Takes effect only before the first group is
/// watched; returns false if the watchdog already runs.
pub fn configure(config: WatchdogConfig) -> bool {
    if STATE.get().is_some() {
        return false;
    }
    *lock(&PENDING_CONFIG) = Some(config);
    true
}

/// Counters of what the watchdog has done in this process.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WatchdogStats {
    /// Rounds completed (the heartbeat).
    pub rounds: u64,
    /// Ops failed for timeout.
    pub timeouts: u64,
    /// Backend errors acted on.
    pub errors: u64,
}

/// What the watchdog has done so far (zeros if it never started).
pub fn stats() -> WatchdogStats {
    STATE
        .get()
        .map_or_else(WatchdogStats::default, |st| WatchdogStats {
            rounds: st.heartbeat.load(Ordering::Relaxed),
            timeouts: st.timeouts.load(Ordering::Relaxed),
            errors: st.errors.load(Ordering::Relaxed),
        })
}
