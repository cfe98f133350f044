//! [`ErrorPropagation`]: one group's propagation on this rank, started,
//! stopped and flushed.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chorus_core::Registry;
use chorus_store::Store;

use super::failure::key;
use super::publish::publish;
use super::shared::Shared;
use super::timing::FLUSH_WAIT;
use super::watcher::watch;
use crate::watchdog::ErrorPolicy;
use chorus_core::sync::lock;

/// Error propagation of one group on this rank: publishes the group's first
/// error and watches for its peers' (see the module docs). Stops on
/// [`stop`](Self::stop) and when dropped.
pub(crate) struct ErrorPropagation {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for ErrorPropagation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ErrorPropagation")
            .field("group", &self.shared.group)
            .field("rank", &self.shared.rank)
            .field("key", &self.shared.key)
            .field("stopped", &self.shared.stopped.load(Ordering::Relaxed))
            .finish()
    }
}

impl ErrorPropagation {
    /// Starts propagation for the group whose in-flight ops are in
    /// `registry`: sets the registry's error hook (publish) and starts the
    /// watcher on chorus's runtime. `store` is the group's own (prefixed)
    /// store; `epoch` is the same on every rank of the group; `rank` is this
    /// rank in the group, `size` the group's size; `policy` is applied when
    /// a peer's failure arrives.
    ///
    /// If chorus's runtime cannot start, logs a warning and propagates
    /// nothing.
    pub(crate) fn start(
        store: Arc<dyn Store>,
        epoch: u64,
        registry: &Arc<Registry>,
        group: Arc<str>,
        rank: usize,
        size: usize,
        policy: ErrorPolicy,
    ) -> ErrorPropagation {
        let shared = Arc::new(Shared {
            store,
            key: key(epoch),
            group,
            rank,
            peers: size.saturating_sub(1),
            stopped: AtomicBool::new(false),
            publishing: Mutex::new(None),
            watcher: Mutex::new(None),
        });
        let weak = Arc::downgrade(&shared);
        registry.set_error_hook(move |err| {
            if let Some(s) = weak.upgrade() {
                publish(&s, err);
            }
        });
        match chorus_store::rt::handle() {
            Ok(h) => {
                let task = h.spawn(watch(shared.clone(), Arc::downgrade(registry), policy));
                *lock(&shared.watcher) = Some(task);
            }
            Err(e) => {
                tracing::warn!(group = %shared.group, error = %e, "error propagation is off: chorus's runtime is unavailable");
            }
        }
        ErrorPropagation { shared }
    }

    /// Whether the watcher still waits for a peer's failure (false once a
    /// failure arrived, the store failed, the group is gone or it was
    /// stopped).
    #[cfg(test)]
    pub(crate) fn watching(&self) -> bool {
        lock(&self.shared.watcher)
            .as_ref()
            .is_some_and(|t| !t.is_finished())
    }

    /// Stops watching and publishing (at group shutdown: failures of ops
    /// after the goodbye are nobody else's concern). Idempotent; does not
    /// wait.
    pub(crate) fn stop(&self) {
        self.shared.stopped.store(true, Ordering::Release);
        if let Some(t) = lock(&self.shared.watcher).as_ref() {
            t.abort();
        }
    }

    /// Waits, at most `timeout`, for a publish in flight to finish; true if
    /// none is left in flight.
    pub(crate) fn flush(&self, timeout: Duration) -> bool {
        let rx = lock(&self.shared.publishing).take();
        match rx {
            None => true,
            Some(rx) => match rx.recv_timeout(timeout) {
                Ok(()) | Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => true,
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                    *lock(&self.shared.publishing) = Some(rx);
                    false
                }
            },
        }
    }
}

impl Drop for ErrorPropagation {
    fn drop(&mut self) {
        self.stop();
        if !self.flush(FLUSH_WAIT) {
            tracing::warn!(group = %self.shared.group, "dropping the group before its failure was published to its peers");
        }
    }
}
