//! Drives a [`Quorum`] (a survivor) or a [`Joiner`] (a replacement rank)
//! through the job's store: one store operation per action, each bounded,
//! nothing decided here.

use std::time::{Duration, Instant};

use chorus_store::{Store, StoreError};

use super::joiner::{JoinAction, JoinOutcome, Joiner};
use super::quorum::{Action, Outcome, Quorum};

/// Key of old rank `r`'s announcement.
fn alive_key(r: usize) -> String {
    format!("alive/{r}")
}

/// Key of the `n`-th joiner's world rank (from 1).
fn join_key(n: i64) -> String {
    format!("join/{n}")
}

const ANNOUNCED: &str = "announced";
/// How many joiners announced themselves (the count of `join/*` keys).
pub(super) const JOINED: &str = "joined";
const ROSTER: &str = "roster";

/// Runs `q` to its end over `store` (the keys of its epoch, under their
/// own prefix). Every store operation must end by `bound`.
///
/// # Errors
///
/// The store's error, or [`StoreError::Timeout`] for an operation still
/// running at `bound`.
pub(crate) async fn drive(
    store: &dyn Store,
    me: usize,
    size: usize,
    mut q: Quorum,
    bound: Instant,
) -> Result<Outcome, StoreError> {
    loop {
        match q.poll(Instant::now()) {
            Action::Announce => {
                let key = alive_key(me);
                bounded(bound, &key, store.set(&key, b"1")).await?;
                let n = bounded(bound, ANNOUNCED, store.add(ANNOUNCED, 1)).await?;
                q.announced(u64::try_from(n).unwrap_or(0));
            }
            Action::Observe => {
                let roster = read_roster(store, bound).await?;
                let n = bounded(bound, ANNOUNCED, store.add(ANNOUNCED, 0)).await?;
                let j = bounded(bound, JOINED, store.add(JOINED, 0)).await?;
                q.observed(
                    roster.as_deref(),
                    u64::try_from(n).unwrap_or(0),
                    u64::try_from(j).unwrap_or(0),
                );
            }
            Action::AwaitRoster(d) => {
                let wait = d.max(Duration::from_millis(1));
                match bounded(bound, ROSTER, store.get(ROSTER, wait)).await {
                    Ok(v) => q.roster_seen(Some(&v)),
                    Err(StoreError::Timeout { .. }) if Instant::now() < bound => {
                        q.roster_seen(None)
                    }
                    Err(e) => return Err(e),
                }
            }
            Action::Wait(d) => tokio::time::sleep(d).await,
            Action::Collect => {
                // One request for every old rank's flag where the store
                // can (chorus's own), key by key where it cannot.
                let keys: Vec<String> = (0..size).map(alive_key).collect();
                let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
                let alive = bounded(bound, ANNOUNCED, store.present(&refs)).await?;
                let joiners = read_joiners(store, bound).await?;
                q.collected(&alive, &joiners, Instant::now());
            }
            Action::Close(roster) => {
                let stored = bounded(
                    bound,
                    ROSTER,
                    store.compare_set(ROSTER, b"", &roster.encode()),
                )
                .await?;
                q.closed(&stored);
            }
            Action::Done(outcome) => return Ok(outcome),
        }
    }
}

/// How far a survivors' quorum got, for the report of a rank waiting in
/// it: how many old ranks announced themselves, and how many replacement
/// ranks wait to join.
pub(super) async fn quorum_progress(store: &dyn Store, size: usize) -> Option<String> {
    let n = store.add(ANNOUNCED, 0).await.ok()?;
    let j = store.add(JOINED, 0).await.ok()?;
    Some(format!(
        "{n} of {size} ranks announced themselves, {j} replacement rank(s) wait to join"
    ))
}

/// How far the joiners of an epoch got, for the report of a replacement
/// rank waiting to be admitted.
pub(super) async fn join_progress(store: &dyn Store, epoch: u64) -> Option<String> {
    let j = store.add(JOINED, 0).await.ok()?;
    let closed = store.check(&[ROSTER]).await.ok()?;
    Some(format!(
        "epoch {epoch}: {j} replacement rank(s) announced, roster {}",
        if closed { "closed" } else { "not closed yet" }
    ))
}

/// Runs `j` to its end over `store` (the keys of its epoch); `next` holds
/// the keys of the epoch after. Every store
/// operation must end by `bound`.
///
/// # Errors
///
/// As [`drive`].
pub(super) async fn drive_join(
    store: &dyn Store,
    next: &dyn Store,
    world_rank: usize,
    mut j: Joiner,
    bound: Instant,
) -> Result<JoinOutcome, StoreError> {
    let started = Instant::now();
    loop {
        // Store operations that finish at once never time out: the
        // search ends at `bound` here.
        if Instant::now() >= bound {
            return Err(StoreError::Timeout {
                keys: vec![ROSTER.to_string()],
                after: bound.saturating_duration_since(started),
            });
        }
        match j.poll() {
            JoinAction::Probe => {
                j.probed(bounded(bound, ROSTER, store.check(&[ROSTER])).await?);
            }
            JoinAction::Announce => {
                let n = bounded(bound, JOINED, store.add(JOINED, 1)).await?;
                let key = join_key(n);
                let value = world_rank.to_string();
                bounded(bound, &key, store.set(&key, value.as_bytes())).await?;
                j.announced();
            }
            JoinAction::Observe => {
                let roster = read_key(store, ROSTER, bound).await?;
                let later = bounded(bound, ROSTER, next.check(&[ROSTER])).await?;
                j.observed(roster.as_deref(), later);
            }
            JoinAction::Wait(d) => tokio::time::sleep(d).await,
            JoinAction::Done(outcome) => return Ok(outcome),
        }
    }
}

/// The world ranks of the joiners announced so far (a joiner that counted
/// itself but has not written its rank yet is skipped).
async fn read_joiners(store: &dyn Store, bound: Instant) -> Result<Vec<usize>, StoreError> {
    let count = bounded(bound, JOINED, store.add(JOINED, 0)).await?;
    let mut out = Vec::new();
    for n in 1..=count {
        let key = join_key(n);
        if let Some(v) = read_key(store, &key, bound).await? {
            if let Some(w) = std::str::from_utf8(&v).ok().and_then(|s| s.parse().ok()) {
                out.push(w);
            }
        }
    }
    Ok(out)
}

/// The stored roster, if the key exists.
async fn read_roster(store: &dyn Store, bound: Instant) -> Result<Option<Vec<u8>>, StoreError> {
    read_key(store, ROSTER, bound).await
}

/// The value of `key`, if it exists (keys here are never deleted).
async fn read_key(
    store: &dyn Store,
    key: &str,
    bound: Instant,
) -> Result<Option<Vec<u8>>, StoreError> {
    if !bounded(bound, key, store.check(&[key])).await? {
        return Ok(None);
    }
    // It exists and is never deleted: the get returns at once.
    let left = bound.saturating_duration_since(Instant::now());
    store
        .get(key, left.max(Duration::from_millis(1)))
        .await
        .map(Some)
}

/// `op`, failing with a timeout on `key` if it is still running at `bound`.
async fn bounded<T>(
    bound: Instant,
    key: &str,
    op: impl std::future::Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    let left = bound.saturating_duration_since(Instant::now());
    match tokio::time::timeout(left, op).await {
        Ok(r) => r,
        Err(_) => Err(StoreError::Timeout {
            keys: vec![key.to_string()],
            after: left,
        }),
    }
}
