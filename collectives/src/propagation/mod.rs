//! Error propagation through the store (opt-in per group).
//!
//! Without it, when one rank of a group fails (an op timeout, a lost peer, a
//! mismatch, an NCCL asynchronous error, a heartbeat timeout, an abort),
//! the others learn of it only if their own ops need that rank: a rank that
//! waits on a third, stuck rank waits out its own op timeout.
//!
//! With propagation on, each rank of the group:
//!
//! * **publishes** its group's first error (anything but an invalid
//!   argument, which fails no group, and a [`WorkError::Remote`], which came
//!   from a peer) under the group-scoped store key `error/{epoch}`, as JSON
//!   naming the origin rank, the op's sequence number and name, the error
//!   kind and its message ([`RemoteFailure`]). The first rank to publish
//!   wins (`compare_set`); later ones leave the key alone. Publishing runs
//!   on chorus's runtime ([`chorus_store::rt`]) under [`PUBLISH_TIMEOUT`], so a
//!   store that is gone costs a warning, never a hang. It starts before any
//!   work of the group is failed ([`Registry::set_error_hook`]), and
//!   dropping the group waits up to [`FLUSH_WAIT`] for it, so a rank that
//!   exits as soon as it sees its error still tells its peers. The
//!   publisher then waits up to [`ACK_WAIT`] for every peer to acknowledge
//!   (a counter under the key), so the store — often hosted by the failing
//!   rank — stays up until the failure was delivered.
//! * **watches** that key with one background `get` on chorus's runtime
//!   (woken by the `set`, never polling; re-armed every [`WATCH_WAIT`]). When
//!   a peer's failure appears, the group's pending works fail at once with
//!   [`WorkError::Remote`] naming the origin rank and its cause, and the
//!   group's [`ErrorPolicy`] is applied as for a local error (abort the
//!   group, fail the works only, or abort the process), with a
//!   flight-recorder dump. A rank's own failure is not re-applied. The
//!   watcher stops when the store fails (e.g. its host exited at the end of
//!   the job), when the group is gone, and on [`ErrorPropagation::stop`].
//!
//! Nothing runs on an op's hot path: the publisher is a hook called once,
//! with the group's first error ([`Registry::set_error_hook`]), and the
//! watcher is a single waiting store request per group.
//!
//! The epoch in the key tells apart successive groups created under the
//! same name over the same store (a group re-created after an abort), so a
//! new group never fails on its predecessor's error; every rank of a group
//! must pass the same epoch (chorus derives it from the group's join
//! counter).
//!
//! Switch it on per group with `GroupBuilder::propagate_errors(true)` in
//! the `chorus` crate, or for every group of a process with
//! `CHORUS_PROPAGATE_ERRORS=1` (read by the group builder).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::watchdog::ErrorPolicy;
use chorus_core::Registry;
use chorus_core::{OpContext, WorkError};
use chorus_store::{Store, StoreError};

/// How long publishing an error may take before it is given up (the store
/// is gone or hung).
pub const PUBLISH_TIMEOUT: Duration = Duration::from_secs(5);

/// How long one waiting `get` of the watcher lasts before it is re-armed.
pub const WATCH_WAIT: Duration = Duration::from_secs(60);

/// How long dropping an [`ErrorPropagation`] waits for a publish still in
/// flight (so a process that exits right after an error still tells its
/// peers).
pub const FLUSH_WAIT: Duration = Duration::from_secs(2);

/// How long a rank that published its failure waits for its peers to
/// acknowledge it (each watcher adds 1 to `error/{epoch}/acks` before it
/// acts), so that the store — often hosted by the failing rank itself —
/// outlives the delivery; bounded, since a dead or stopped peer never
/// acknowledges.
pub const ACK_WAIT: Duration = Duration::from_millis(500);

/// The store key (inside the group's namespace) under which a group's
/// failure is published.
pub fn key(epoch: u64) -> String {
    format!("error/{epoch}")
}

/// What a failed rank publishes for its peers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteFailure {
    /// The rank (in the group) that detected the failure.
    pub origin_rank: usize,
    /// Sequence number of its failed op (0 if the failure belongs to no op).
    pub seq: u64,
    /// Its failed op, e.g. `"all_reduce"`.
    pub op: String,
    /// The error's kind ([`WorkError::kind`]), e.g. `"OpTimeout"`.
    pub kind: String,
    /// The error's full message.
    pub cause: String,
}

impl RemoteFailure {
    /// The failure `err` of rank `origin_rank`.
    pub fn new(origin_rank: usize, err: &WorkError) -> RemoteFailure {
        let ctx = err.context();
        RemoteFailure {
            origin_rank,
            seq: ctx.seq,
            op: ctx.op.to_string(),
            kind: err.kind().to_string(),
            cause: err.to_string(),
        }
    }
}

struct Shared {
    store: Arc<dyn Store>,
    key: String,
    group: Arc<str>,
    rank: usize,
    /// Ranks of the group besides this one (acknowledgements to wait for).
    peers: usize,
    stopped: AtomicBool,
    /// Signalled when the publish in flight is done.
    publishing: Mutex<Option<std::sync::mpsc::Receiver<()>>>,
    watcher: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Error propagation of one group on this rank: publishes the group's first
/// error and watches for its peers' (see the module docs). Stops on
/// [`stop`](Self::stop) and when dropped.
pub struct ErrorPropagation {
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
    pub fn start(
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

    /// The store key watched and published to (in the group's namespace).
    pub fn key(&self) -> &str {
        &self.shared.key
    }

    /// Whether the watcher still waits for a peer's failure (false once a
    /// failure arrived, the store failed, the group is gone or it was
    /// stopped).
    pub fn watching(&self) -> bool {
        lock(&self.shared.watcher)
            .as_ref()
            .is_some_and(|t| !t.is_finished())
    }

    /// Stops watching and publishing (at group shutdown: failures of ops
    /// after the goodbye are nobody else's concern). Idempotent; does not
    /// wait.
    pub fn stop(&self) {
        self.shared.stopped.store(true, Ordering::Release);
        if let Some(t) = lock(&self.shared.watcher).as_ref() {
            t.abort();
        }
    }

    /// Waits, at most `timeout`, for a publish in flight to finish; true if
    /// none is left in flight.
    pub fn flush(&self, timeout: Duration) -> bool {
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

/// The error hook: publishes the group's first error, in the background.
fn publish(shared: &Arc<Shared>, err: &WorkError) {
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

/// The acknowledgement counter of the published failure.
fn ack_key(key: &str) -> String {
    format!("{key}/acks")
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

/// The watcher: waits for a peer's failure and applies the policy.
async fn watch(shared: Arc<Shared>, registry: Weak<Registry>, policy: ErrorPolicy) {
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

#[cfg(test)]
mod tests;
