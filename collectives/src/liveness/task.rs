//! The liveness task of one group: [`Liveness`] starts it on chorus's
//! runtime, [`LivenessTask`] stops it. Each round it beats, reads the
//! watched peers' counters and the verdict log's count (two requests),
//! publishes its own verdicts and reads the others' (rarely), and fails
//! the group's pending works by the group's error policy when a peer went
//! silent or was lost, or the store went silent.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use chorus_core::{OpContext, Registry, WorkError};
use chorus_store::Store;

use super::beat::{key, log_count_key, log_entry_key, period};
use super::marks::{LEFT, LOST};
use super::ring::{Entry, Ring, Verdict};
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

impl LivenessTask {
    /// Stops beating and reading without telling the peers: the rank
    /// looks stopped to them (a simulated rank's SIGSTOP or death).
    #[cfg(feature = "test-util")]
    pub(crate) fn halt(mut self) {
        self.stopped.store(true, Ordering::Release);
        if let Some(t) = self.task.take() {
            t.abort();
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
        let (store, key, count) = (
            self.store.clone(),
            key(self.epoch, self.rank),
            log_count_key(self.epoch),
        );
        async move {
            store.add(&key, 1).await?;
            // The verdict log's count exists from the start too: every
            // round reads it beside the watched counters.
            store.add(&count, 0).await.map(drop)
        }
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
    let count_key = log_count_key(l.epoch);
    let mut ring = Ring::new(l.rank, l.size, l.timeout, Instant::now());
    let peers: Vec<usize> = (0..l.size).filter(|&r| r != l.rank).collect();
    let mut search: Option<(String, Search)> = None;
    let mut next = tokio::time::Instant::now();
    loop {
        // A round that ran long (a slow store) delays the next rather
        // than bunching rounds up behind it.
        next = (next + period).max(tokio::time::Instant::now());
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
        if search.is_none() {
            search = l
                .witness
                .asked()
                .map(|(cause, at)| (cause, Search::new(at, period, peers.len())));
        }
        let now = round(
            &l,
            &mut ring,
            search.as_mut(),
            &peers,
            &mine,
            &count_key,
            period,
        )
        .await;
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
                    let lost: Vec<(usize, Gone)> =
                        lost.into_iter().map(|(i, g)| (peers[i], g)).collect();
                    for &(p, _) in lost.iter().filter(|(_, g)| *g == Gone::Stopped) {
                        let k = key(l.epoch, p);
                        let mark = l.store.add(&k, LOST);
                        let _ = tokio::time::timeout(period, mark).await;
                        let post = append(&*l.store, l.epoch, Entry::Lost(p));
                        let _ = tokio::time::timeout(period, post).await;
                    }
                    let err = lost_peer(ctx, &lost, cause);
                    tracing::error!(group = %l.group, rank = l.rank, error = %err, policy = ?l.policy, "peer liveness: failing the group's pending works");
                    crate::watchdog::apply_detected(l.policy, &reg, &err, "peer lost");
                    return;
                }
            }
        }
        if reg.pending() == 0 {
            continue;
        }
        if !ring.lost().is_empty() {
            let marked: Vec<(usize, Gone)> =
                ring.lost().iter().map(|&p| (p, Gone::Marked)).collect();
            let err = lost_peer(ctx, &marked, "");
            tracing::error!(group = %l.group, rank = l.rank, error = %err, policy = ?l.policy, "peer liveness: failing the group's pending works");
            crate::watchdog::apply_detected(l.policy, &reg, &err, "peer lost");
            return;
        }
        let err = match ring.verdict(now) {
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

/// One round's store work: beat, read the watched peers' counters and the
/// log's count in one request, then (rarely) the new log entries, the
/// verdicts to publish, and every peer's counter while a search runs.
/// The beat and the reading are each bounded by a third of the timeout (a
/// slow answer is still an answer: abandoning it would only add load to a
/// store that is already behind), the rest by the period. Returns when the
/// readings were taken.
async fn round(
    l: &Liveness,
    ring: &mut Ring,
    search: Option<&mut (String, Search)>,
    peers: &[usize],
    mine: &str,
    count_key: &str,
    period: Duration,
) -> Instant {
    let watched = ring.watched();
    let mut keys: Vec<String> = watched.iter().map(|&p| key(l.epoch, p)).collect();
    keys.push(count_key.to_string());
    let bound = (l.timeout / 3).max(period);
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    // One after the other: PyTorch's store, through chorus's client,
    // answered neither with both in flight at once (the control_plane
    // benchmark with --torch).
    let beat = tokio::time::timeout(bound, l.store.add(mine, 1)).await;
    let read = tokio::time::timeout(bound, l.store.multi_get(&refs, period)).await;
    let now = Instant::now();
    match (beat, read) {
        (Ok(Ok(_)), Ok(Ok(values))) => {
            let values: Vec<Option<i64>> = values.iter().map(|v| parse(v)).collect();
            let count = values.last().copied().flatten().unwrap_or(0);
            ring.read(
                &values[..watched.len()],
                u64::try_from(count).unwrap_or(0),
                now,
            );
        }
        (Ok(Err(e)), _) | (_, Ok(Err(e))) => {
            ring.store_failed(e.to_string());
            return now;
        }
        (Err(_), _) | (_, Err(_)) => {
            ring.store_failed(format!("no answer within {bound:?}"));
            return now;
        }
    }
    if let Some(unread) = ring.unread() {
        let first = *unread.start();
        let last = (*unread.end()).min(first + LOG_BATCH - 1);
        let keys: Vec<String> = (first..=last).map(|n| log_entry_key(l.epoch, n)).collect();
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let wait = period / 2;
        match tokio::time::timeout(period, l.store.multi_get(&refs, wait)).await {
            Ok(Ok(raw)) => {
                let entries: Vec<Option<Entry>> = raw.iter().map(|v| Entry::decode(v)).collect();
                ring.log_read(&entries, Instant::now());
            }
            _ => ring.log_missing(Instant::now()),
        }
    }
    for e in ring.take_posts() {
        tracing::warn!(group = %l.group, rank = l.rank, verdict = %e.encode(), "peer liveness: publishing a verdict on a watched peer");
        match tokio::time::timeout(period, append(&*l.store, l.epoch, e)).await {
            Ok(Ok(())) => {}
            _ => ring.repost(e),
        }
    }
    if let Some((_, s)) = search {
        let keys: Vec<String> = peers.iter().map(|&p| key(l.epoch, p)).collect();
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        if let Ok(Ok(values)) = tokio::time::timeout(period, l.store.multi_get(&refs, period)).await
        {
            let values: Vec<Option<i64>> = values.iter().map(|v| parse(v)).collect();
            s.read(&values, Instant::now());
        }
    }
    now
}

/// Log entries read in one request at most.
const LOG_BATCH: u64 = 256;

/// A counter's value as stored.
fn parse(v: &[u8]) -> Option<i64> {
    std::str::from_utf8(v).ok()?.trim().parse().ok()
}

/// Appends `e` to the group's verdict log: count it, then write it.
async fn append(store: &dyn Store, epoch: u64, e: Entry) -> Result<(), chorus_store::StoreError> {
    let n = store.add(&log_count_key(epoch), 1).await?;
    let n = u64::try_from(n).unwrap_or(0);
    store
        .set(&log_entry_key(epoch, n), e.encode().as_bytes())
        .await
}

/// `PeerLost` naming the first of the `lost` peers (group ranks) of a
/// failure the backend reported as `cause` (empty: this rank's backend has
/// not reported one).
fn lost_peer(ctx: OpContext, lost: &[(usize, Gone)], cause: &str) -> WorkError {
    let named: Vec<String> = lost
        .iter()
        .map(|&(p, why)| match why {
            Gone::Left => format!("rank {p} left the group"),
            Gone::Stopped => format!("rank {p}'s beat in the group's store stopped"),
            Gone::Marked => format!(
                "another rank of the group found rank {p} lost (its beat stopped after a backend \
                 reported a failed peer)"
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
        peer: lost.first().map_or(0, |&(p, _)| p),
        cause: format!("{said}{}", named.join(", ")),
    }
}
