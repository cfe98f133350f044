//! Drives a [`Quorum`] through the job's store: one store operation per
//! action, each bounded, nothing decided here.

use std::time::{Duration, Instant};

use chorus_store::{Store, StoreError};

use super::quorum::{Action, Outcome, Quorum};

/// Key of old rank `r`'s announcement.
fn alive_key(r: usize) -> String {
    format!("alive/{r}")
}

const ANNOUNCED: &str = "announced";
const ROSTER: &str = "roster";

/// Runs `q` to its end over `store` (the keys of its epoch, under their
/// own prefix). Every store operation must end by `bound`.
///
/// # Errors
///
/// The store's error, or [`StoreError::Timeout`] for an operation still
/// running at `bound`.
pub(super) async fn drive(
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
                q.observed(roster.as_deref(), u64::try_from(n).unwrap_or(0));
            }
            Action::Wait(d) => tokio::time::sleep(d).await,
            Action::Collect => {
                let mut alive = Vec::with_capacity(size);
                for r in 0..size {
                    let key = alive_key(r);
                    alive.push(bounded(bound, &key, store.check(&[key.as_str()])).await?);
                }
                q.collected(&alive);
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

/// The stored roster, if the key exists.
async fn read_roster(store: &dyn Store, bound: Instant) -> Result<Option<Vec<u8>>, StoreError> {
    if !bounded(bound, ROSTER, store.check(&[ROSTER])).await? {
        return Ok(None);
    }
    // It exists and is never deleted: the get returns at once.
    let left = bound.saturating_duration_since(Instant::now());
    store
        .get(ROSTER, left.max(Duration::from_millis(1)))
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
