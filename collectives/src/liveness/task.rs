//! The liveness task of one group: [`Liveness`] starts it on chorus's
//! runtime, [`LivenessTask`] stops it. Each round it beats, reads the
//! peers' counters, and fails the group's pending works by the group's
//! error policy when a peer went silent, was lost or left, or the store
//! went silent.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use chorus_core::{OpContext, Registry, WorkError};
use chorus_store::Store;

use super::beat::{key, period};
use super::clock::{PeerClock, Verdict};
use super::marks::{LEFT, LOST};
use super::witness::{Gone, Outcome, PeerWitness, Search};
use crate::watchdog::ErrorPolicy;

/// What the liveness task of one group needs.
pub(crate) struct Liveness {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) epoch: u64,
    pub(crate) group: Arc<str>,
    pub(crate) rank: usize,
    pub(crate) size: usize,
    pub(crate) timeout: Duration,
    pub(crate) policy: ErrorPolicy,
    /// Where the group's backends report failures that name no peer.
    pub(crate) witness: Arc<PeerWitness>,
}

/// The running liveness task of one group; stops when dropped or when the
/// group is gone.
#[derive(Debug)]
pub(crate) struct LivenessTask {
    stopped: Arc<AtomicBool>,
    task: Option<tokio::task::JoinHandle<()>>,
    store: Arc<dyn Store>,
    key: String,
    period: Duration,
}

impl LivenessTask {
    /// Stops beating and reading, and tells the peers this rank left (in
    /// the background, bounded by a period): at group shutdown and when the
    /// group is dropped. Idempotent.
    pub(crate) fn stop(&self) {
        if self.stopped.swap(true, Ordering::AcqRel) {
            return;
        }
        if let Some(t) = &self.task {
            t.abort();
        }
        if let Ok(h) = chorus_store::rt::handle() {
            let (store, key, period) = (self.store.clone(), self.key.clone(), self.period);
            h.spawn(async move {
                let _ = tokio::time::timeout(period, store.add(&key, LEFT)).await;
            });
        }
    }
}

impl Drop for LivenessTask {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Liveness {
    /// The first beat, before the group's backends connect (so every
    /// rank's counter exists once the group is up).
    ///
    /// # Errors
    ///
    /// The store's error.
    pub(crate) fn first_beat(
        &self,
    ) -> impl std::future::Future<Output = Result<(), chorus_store::StoreError>> + Send + 'static
    {
        let (store, key) = (self.store.clone(), key(self.epoch, self.rank));
        async move { store.add(&key, 1).await.map(drop) }
    }

    /// Starts beating and watching on chorus's runtime for the group whose
    /// works are in `registry`. Without the runtime, logs a warning and
    /// watches nothing.
    pub(crate) fn start(self, registry: &Arc<Registry>) -> LivenessTask {
        let stopped = Arc::new(AtomicBool::new(false));
        let (store, key, period) = (
            self.store.clone(),
            key(self.epoch, self.rank),
            period(self.timeout),
        );
        let task = match chorus_store::rt::handle() {
            Ok(h) => Some(h.spawn(run(self, Arc::downgrade(registry), stopped.clone()))),
            Err(e) => {
                tracing::warn!(group = %self.group, error = %e, "peer liveness is off: chorus's runtime is unavailable");
                None
            }
        };
        LivenessTask {
            stopped,
            task,
            store,
            key,
            period,
        }
    }
}

async fn run(l: Liveness, registry: Weak<Registry>, stopped: Arc<AtomicBool>) {
    let period = period(l.timeout);
    let mine = key(l.epoch, l.rank);
    let mut clock = PeerClock::new(l.rank, l.size, l.timeout, Instant::now());
    let peers: Vec<usize> = clock.peers().collect();
    let keys: Vec<String> = peers.iter().map(|&p| key(l.epoch, p)).collect();
    let mut search: Option<(String, Search)> = None;
    // Peers another rank marked lost, at the last reading.
    let mut marked: Vec<(usize, Gone)> = Vec::new();
    let mut next = tokio::time::Instant::now();
    loop {
        next += period;
        tokio::time::sleep_until(next).await;
        if stopped.load(Ordering::Acquire) {
            return;
        }
        let Some(reg) = registry.upgrade() else {
            return;
        };
        if reg.errored().is_some() {
            // The group failed: nothing left to watch for.
            return;
        }
        // Beat, then read: each bounded by the period, so a store that
        // hangs costs rounds, never the task.
        let beat = tokio::time::timeout(period, l.store.add(&mine, 1)).await;
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let read = tokio::time::timeout(period, l.store.multi_get(&refs, period)).await;
        let now = Instant::now();
        match (beat, read) {
            (Ok(Ok(_)), Ok(Ok(values))) => {
                let values: Vec<Option<i64>> = values
                    .iter()
                    .map(|v| std::str::from_utf8(v).ok()?.trim().parse().ok())
                    .collect();
                clock.read(&values, now);
                marked = values
                    .iter()
                    .enumerate()
                    .filter(|(_, v)| v.is_some_and(|v| v >= LOST))
                    .map(|(i, _)| (i, Gone::Marked))
                    .collect();
                if search.is_none() {
                    search = l
                        .witness
                        .asked()
                        .map(|(cause, at)| (cause, Search::new(at, period, peers.len())));
                }
                if let Some((_, s)) = &mut search {
                    s.read(&values, now);
                }
            }
            (Ok(Err(e)), _) | (_, Ok(Err(e))) => clock.store_failed(e.to_string()),
            (Err(_), _) | (_, Err(_)) => clock.store_failed(format!("no answer within {period:?}")),
        }
        let ctx = OpContext {
            rank: l.rank,
            group: l.group.clone(),
            seq: 0,
            op: "liveness",
            internal: None,
        };
        // A failure the backend reported without naming the peer fails
        // the group whether or not works are pending: its communicator
        // is broken.
        if let Some((cause, s)) = &search {
            match s.outcome(now) {
                Outcome::Looking => {}
                Outcome::NoneLost => {
                    tracing::warn!(group = %l.group, rank = l.rank, cause = %cause, "every peer still beats: the backend's error stands as it is");
                    l.witness.clear();
                    search = None;
                }
                Outcome::Lost(lost) => {
                    // Tell the others (their backends may not have seen the
                    // failure), then fail the group.
                    // (Once: a peer already marked is not marked again.)
                    for &(i, _) in lost.iter().filter(|(_, g)| *g == Gone::Stopped) {
                        let mark = l.store.add(&keys[i], LOST);
                        let _ = tokio::time::timeout(period, mark).await;
                    }
                    let err = lost_peer(ctx, &peers, &lost, cause);
                    tracing::error!(group = %l.group, rank = l.rank, error = %err, policy = ?l.policy, "peer liveness: failing the group's pending works");
                    crate::watchdog::apply_detected(l.policy, &reg, &err, "peer lost");
                    return;
                }
            }
        }
        if reg.pending() == 0 {
            continue;
        }
        if !marked.is_empty() {
            let err = lost_peer(ctx, &peers, &marked, "");
            tracing::error!(group = %l.group, rank = l.rank, error = %err, policy = ?l.policy, "peer liveness: failing the group's pending works");
            crate::watchdog::apply_detected(l.policy, &reg, &err, "peer lost");
            return;
        }
        let err = match clock.verdict(now) {
            Verdict::Alive => continue,
            // The backend said a peer failed, and this one went silent:
            // it is the one lost.
            Verdict::PeerSilent { peer, silent_for } if search.is_some() => WorkError::PeerLost {
                ctx,
                peer,
                cause: format!(
                    "the backend reported a failed peer without naming it ({}); rank {peer}'s \
                     beat in the group's store stopped {silent_for:?} ago",
                    search.as_ref().map_or("", |(c, _)| c.as_str())
                ),
            },
            Verdict::PeerSilent { peer, .. } => WorkError::PeerSilent {
                ctx,
                peer,
                after: l.timeout,
            },
            Verdict::StoreSilent { silent_for, cause } => WorkError::Store {
                ctx,
                cause: format!(
                    "the store has not answered for {silent_for:?} (the liveness timeout) while \
                     works were pending: this rank is cut off from the job (a partition, or the \
                     store's host is gone); last error: {cause}"
                ),
            },
        };
        tracing::error!(group = %l.group, rank = l.rank, error = %err, policy = ?l.policy, "peer liveness: failing the group's pending works");
        crate::watchdog::apply_detected(l.policy, &reg, &err, "peer silent");
        return;
    }
}

/// `PeerLost` naming the first of the `lost` peers (indices into `peers`)
/// of a failure the backend reported as `cause` (empty: this rank's
/// backend has not reported one).
fn lost_peer(ctx: OpContext, peers: &[usize], lost: &[(usize, Gone)], cause: &str) -> WorkError {
    let named: Vec<String> = lost
        .iter()
        .map(|&(i, why)| match why {
            Gone::Left => format!("rank {} left the group", peers[i]),
            Gone::Stopped => format!("rank {}'s beat in the group's store stopped", peers[i]),
            Gone::Marked => format!(
                "another rank of the group found rank {} lost (its beat stopped after a backend \
                 reported a failed peer)",
                peers[i]
            ),
        })
        .collect();
    let said = if cause.is_empty() {
        String::new()
    } else {
        format!("the backend reported a failed peer without naming it ({cause}); ")
    };
    WorkError::PeerLost {
        ctx,
        peer: peers[lost[0].0],
        cause: format!("{said}{}", named.join(", ")),
    }
}
