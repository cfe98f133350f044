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

/// How often a rank beats and reads its peers' beats for a liveness
/// `timeout`: a tenth of it, between 50 ms and 1 s. A silent peer is then
/// noticed within the timeout and two periods of its last beat.
pub(crate) fn period(timeout: Duration) -> Duration {
    (timeout / 10).clamp(Duration::from_millis(50), Duration::from_secs(1))
}
