//! The watcher: a peer's failure, applied to this rank's group.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use chorus_core::Registry;
use chorus_core::{OpContext, WorkError};
use chorus_store::StoreError;

use super::failure::{ack_key, RemoteFailure};
use super::shared::Shared;
use super::timing::{PUBLISH_TIMEOUT, WATCH_WAIT};
use crate::watchdog::ErrorPolicy;

/// The watcher: waits for a peer's failure and applies the policy.
pub(super) async fn watch(shared: Arc<Shared>, registry: Weak<Registry>, policy: ErrorPolicy) {
    let value = loop {
        if shared.stopped.load(Ordering::Acquire) || registry.strong_count() == 0 {
            return;
        }
        match shared.store.get(&shared.key, WATCH_WAIT).await {
            Ok(v) => break v,
            Err(StoreError::Timeout { .. }) => continue,
            Err(e) => {
                tracing::debug!(group = %shared.group, error = %e, "error propagation stops watching: the store failed");
                return;
            }
        }
    };
    if shared.stopped.load(Ordering::Acquire) {
        return;
    }
    let Some(reg) = registry.upgrade() else {
        return;
    };
    let (origin, cause) = match serde_json::from_slice::<RemoteFailure>(&value) {
        Ok(f) => (f.origin_rank, f.cause),
        Err(e) => {
            tracing::warn!(group = %shared.group, key = %shared.key, error = %e, "the published failure is not readable; ignored");
            return;
        }
    };
    if origin == shared.rank {
        return;
    }
    // Acknowledge first: the publisher keeps the store up until its peers
    // did (bounded), and this rank may exit as soon as its works fail.
    let _ = tokio::time::timeout(PUBLISH_TIMEOUT, shared.store.add(&ack_key(&shared.key), 1)).await;
    if reg.errored().is_some() {
        // The group failed here already.
        return;
    }
    let err = WorkError::Remote {
        ctx: OpContext {
            rank: shared.rank,
            group: shared.group.clone(),
            seq: 0,
            op: "propagation",
            internal: None,
        },
        origin,
        cause,
    };
    tracing::error!(group = %shared.group, error = %err, ?policy, "a peer failed; failing this rank's pending works");
    crate::watchdog::apply_remote(policy, &reg, &err);
}
