//! Publishing this rank's failure, and waiting for the peers'
//! acknowledgements.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use chorus_core::WorkError;

use super::failure::{ack_key, RemoteFailure};
use super::shared::Shared;
use super::timing::{ACK_WAIT, PUBLISH_TIMEOUT};
use chorus_core::sync::lock;

/// The error hook: publishes the group's first error, in the background.
pub(super) fn publish(shared: &Arc<Shared>, err: &WorkError) {
    if shared.stopped.load(Ordering::Acquire)
        || matches!(
            err,
            WorkError::Remote { .. } | WorkError::InvalidArgument { .. }
        )
    {
        return;
    }
    let failure = RemoteFailure::new(shared.rank, err);
    let value = match serde_json::to_vec(&failure) {
        Ok(v) => v,
        Err(e) => {
            tracing::warn!(error = %e, "cannot encode the failure for its peers");
            return;
        }
    };
    let handle = match chorus_store::rt::handle() {
        Ok(h) => h,
        Err(e) => {
            tracing::warn!(error = %e, "cannot publish the failure: chorus's runtime is unavailable");
            return;
        }
    };
    let (tx, rx) = std::sync::mpsc::channel();
    *lock(&shared.publishing) = Some(rx);
    let s = shared.clone();
    handle.spawn(async move {
        let set = s.store.compare_set(&s.key, b"", &value);
        match tokio::time::timeout(PUBLISH_TIMEOUT, set).await {
            Ok(Ok(stored)) if stored == value => {
                tracing::warn!(group = %s.group, rank = s.rank, key = %s.key, "published this rank's failure for its peers");
                await_acks(&s).await;
            }
            Ok(Ok(_)) => {
                tracing::debug!(group = %s.group, rank = s.rank, "a peer published its failure first");
            }
            Ok(Err(e)) => {
                tracing::warn!(group = %s.group, error = %e, "could not publish this rank's failure to its peers");
            }
            Err(_) => {
                tracing::warn!(group = %s.group, timeout = ?PUBLISH_TIMEOUT, "publishing this rank's failure to its peers timed out (is the store alive?)");
            }
        }
        let _ = tx.send(());
    });
}

/// Waits (at most [`ACK_WAIT`]) until every peer acknowledged the
/// published failure.
async fn await_acks(s: &Shared) {
    let key = ack_key(&s.key);
    let t0 = tokio::time::Instant::now();
    loop {
        match s.store.add(&key, 0).await {
            Ok(n) if n >= s.peers as i64 => return,
            Ok(_) => {}
            Err(_) => return,
        }
        if t0.elapsed() >= ACK_WAIT {
            tracing::debug!(group = %s.group, "not every peer acknowledged the published failure");
            return;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}
