//! The bounds of propagation's waits.

use std::time::Duration;

/// How long publishing an error may take before it is given up (the store
/// is gone or hung).
pub(crate) const PUBLISH_TIMEOUT: Duration = Duration::from_secs(5);

/// How long one waiting `get` of the watcher lasts before it is re-armed.
pub(crate) const WATCH_WAIT: Duration = Duration::from_secs(60);

/// How long dropping an [`ErrorPropagation`](super::ErrorPropagation) waits for a publish still in
/// flight (so a process that exits right after an error still tells its
/// peers).
pub(crate) const FLUSH_WAIT: Duration = Duration::from_secs(2);

/// How long a rank that published its failure waits for its peers to
/// acknowledge it (each watcher adds 1 to `error/{epoch}/acks` before it
/// acts), so that the store — often hosted by the failing rank itself —
/// outlives the delivery; bounded, since a dead or stopped peer never
/// acknowledges.
pub(crate) const ACK_WAIT: Duration = Duration::from_millis(500);
