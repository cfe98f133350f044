//! Peer liveness through the store: a rank that stopped (SIGSTOP, a hung
//! host) or that a partition cut off is noticed within the liveness
//! timeout, however long the op in flight may run, on every backend
//! (docs/ARCHITECTURE.md, "Peer liveness" among the fault mechanisms).
//!
//! The TCP backend's transport sees a silent link by itself (keepalive);
//! NCCL cannot tell a slow peer from a dead one and spins until the op
//! timeout, and neither transport notices a peer process that is stopped
//! while its kernel still acknowledges. So every rank of a group also
//! keeps a beat in the group's store: a counter under `alive/{epoch}/{rank}`
//! that a task on chorus's runtime ([`chorus_store::rt`]) adds 1 to every
//! [`period`] — independent of the user's threads and executor, so a rank
//! busy computing still beats. The same task reads its peers' counters
//! each round. [`PeerClock`], the I/O-free part, turns those readings into
//! a verdict: a peer whose counter has not moved for the liveness timeout
//! is silent; a store that has not answered for as long means this rank is
//! cut off from the job.
//!
//! A verdict fails nothing while the group has no pending work (a peer
//! that comes back is alive again). With pending works, the group's error
//! policy is applied (by default the group is aborted, which aborts its
//! NCCL communicators) with [`WorkError::PeerSilent`] naming the peer, or
//! [`WorkError::Store`] when the store went silent.
//!
//! The same readings name the peer behind a failure that the backend
//! reports without naming it (NCCL's `ncclRemoteError`): the backend hands
//! it to the group's [`PeerWitness`], and the task fails the group with
//! [`WorkError::PeerLost`] naming the peer whose beat stopped or that left
//! (see `witness`).
//!
//! Cost: two store requests per rank and round (one `add`, one `multi_get`
//! of the peers' counters), nothing on an op's path. Off with a timeout of
//! zero.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use chorus_core::{OpContext, Registry, WorkError};
use chorus_store::Store;

use crate::watchdog::ErrorPolicy;

mod marks;
mod witness;

pub(crate) use marks::{LEFT, LOST};

use witness::{Gone, Outcome, Search};
pub(crate) use witness::{PeerWitness, Report};

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

/// What the readings say.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Every peer beat within the timeout, and the store answers.
    Alive,
    /// `peer` (a group rank) has not beaten for `silent_for`.
    PeerSilent { peer: usize, silent_for: Duration },
    /// The store has not answered for `silent_for`; `cause` is its last
    /// error.
    StoreSilent { silent_for: Duration, cause: String },
}

#[derive(Clone, Copy, Debug)]
struct Beat {
    /// The counter as last read (`None` before the first reading); at or
    /// above [`LEFT`] once the peer left.
    value: Option<i64>,
    /// When the reading last found it changed (or the clock started).
    changed: Instant,
}

/// The liveness of a group's peers from this rank's readings of their
/// beats: no I/O and no clock of its own (every call passes `now`).
#[derive(Debug)]
pub(crate) struct PeerClock {
    me: usize,
    timeout: Duration,
    beats: Vec<Beat>,
    /// When the store last answered.
    store_ok: Instant,
    store_error: Option<String>,
}

impl PeerClock {
    /// A clock for rank `me` of a group of `size`, started at `now` (every
    /// peer counts as just heard from).
    pub(crate) fn new(me: usize, size: usize, timeout: Duration, now: Instant) -> PeerClock {
        PeerClock {
            me,
            timeout,
            beats: vec![
                Beat {
                    value: None,
                    changed: now,
                };
                size
            ],
            store_ok: now,
            store_error: None,
        }
    }

    /// The peers whose counters a reading asks for, in order.
    pub(crate) fn peers(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.beats.len()).filter(move |&r| r != self.me)
    }

    /// A reading at `now`: `values[i]` is the counter of the `i`-th of
    /// [`peers`](Self::peers) (`None`: not readable).
    pub(crate) fn read(&mut self, values: &[Option<i64>], now: Instant) {
        self.store_ok = now;
        self.store_error = None;
        let peers: Vec<usize> = self.peers().collect();
        for (&peer, &v) in peers.iter().zip(values) {
            let b = &mut self.beats[peer];
            if v.is_some() && v != b.value {
                b.value = v;
                b.changed = now;
            }
        }
    }

    /// The store failed to answer at `now` with `cause`.
    pub(crate) fn store_failed(&mut self, cause: String) {
        self.store_error = Some(cause);
    }

    /// The verdict at `now`: the store's silence first (it makes every
    /// peer look silent), then the peer silent longest.
    pub(crate) fn verdict(&self, now: Instant) -> Verdict {
        let store_silent = now.saturating_duration_since(self.store_ok);
        if store_silent >= self.timeout {
            return Verdict::StoreSilent {
                silent_for: store_silent,
                cause: self
                    .store_error
                    .clone()
                    .unwrap_or_else(|| "no answer".into()),
            };
        }
        self.peers()
            .filter(|&p| self.beats[p].value.is_none_or(|v| v < LEFT))
            .map(|p| (p, now.saturating_duration_since(self.beats[p].changed)))
            .filter(|&(_, d)| d >= self.timeout)
            .max_by_key(|&(_, d)| d)
            .map_or(Verdict::Alive, |(peer, silent_for)| Verdict::PeerSilent {
                peer,
                silent_for,
            })
    }
}

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

#[cfg(test)]
mod tests;
