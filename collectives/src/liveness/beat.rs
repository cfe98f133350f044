//! Where and how often a rank beats: the key of its counter in the group's
//! store, the period for a liveness timeout, and the default timeout.

use std::time::Duration;

/// Default peer liveness timeout of a group: a peer whose beat in the
/// store stops for this long fails the group's pending works (see
/// [`GroupBuilder::peer_liveness`](crate::GroupBuilder::peer_liveness)).
pub const DEFAULT_PEER_LIVENESS: Duration = Duration::from_secs(10);

/// The store key (in the group's namespace) of `rank`'s beat.
pub(crate) fn key(epoch: u64, rank: usize) -> String {
    format!("alive/{epoch}/{rank}")
}

/// The store key (in the group's namespace) of the number of entries in
/// the group's verdict log.
pub(crate) fn log_count_key(epoch: u64) -> String {
    format!("verdicts/{epoch}")
}

/// The store key of the `n`-th entry (from 1) of the verdict log.
pub(crate) fn log_entry_key(epoch: u64, n: u64) -> String {
    format!("verdicts/{epoch}/{n}")
}

/// How often a rank beats and reads its peers' beats for a liveness
/// `timeout`: a tenth of it, between 50 ms and 300 ms. A silent peer is
/// then noticed by its watcher within the timeout and two periods of its
/// last beat, and by every rank one period later (at most the timeout and
/// 0.9 s for a timeout of 3 s or more).
pub(crate) fn period(timeout: Duration) -> Duration {
    (timeout / 10).clamp(Duration::from_millis(50), Duration::from_millis(300))
}
