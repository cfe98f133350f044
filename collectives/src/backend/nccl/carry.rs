//! The NCCL part of re-forming a group: when only ranks were lost, the
//! survivors' communicator can come from the old group's (revoked) one by
//! `ncclCommShrink` instead of a fresh initialization with a new unique id
//! (`ReformComms`).
//!
//! Every new rank must take the same path, or the ones that shrink wait
//! for ranks that initialize a fresh communicator (and the other way
//! round) until the timeout. So the new group votes through its store
//! first: each rank says whether it can shrink (its NCCL has
//! `ncclCommShrink`, its old collective communicator was kept at the
//! abort); only if all can do they shrink. Three store requests per rank.

use std::sync::Arc;
use std::time::{Duration, Instant};

use chorus_core::comm_cache::CommKey;
use chorus_gpu::nccl::{CommOptions, Communicator, NcclCommError};
use chorus_store::Store;

use super::backend::NcclBackend;
use super::init::{off_thread, poll_backoff, NcclInitError};
use super::options::ReformComms;
use chorus_core::sync::lock;

/// What [`carry_over`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Carried {
    /// The new group's collective communicator on this device was shrunk
    /// from the old one.
    Shrunk { device: u32, took: Duration },
    /// Nothing: the new group creates its communicators afresh.
    Fresh,
}

/// The store keys of the vote (in the new group's namespace).
const YES: &str = "nccl/shrink/yes";
const VOTES: &str = "nccl/shrink/votes";
const VERDICT: &str = "nccl/shrink/verdict";

/// After the re-form's roster agreed, on every member of the new group
/// (`new`, `size` ranks, reached through `store`): shrinks the old group's
/// (`old`) revoked collective communicator without the old ranks `lost`
/// into the new group's, if every member can; `lost` is empty where ranks
/// joined (the new group is then not only survivors). Else frees what the old
/// group kept and leaves the new group to create its communicators. The
/// vote waits at most `vote_wait` for the others, the shrink `timeout`.
///
/// # Errors
///
/// The store's error during the vote, or the shrink's (the group is then
/// inconsistent: re-form again, which forms the next epoch afresh).
pub(crate) async fn carry_over(
    old: &NcclBackend,
    new: &NcclBackend,
    store: Arc<dyn Store>,
    size: usize,
    lost: &[usize],
    vote_wait: Duration,
    timeout: Duration,
) -> Result<Carried, NcclInitError> {
    if lost.is_empty() {
        // Nobody lost (or ranks joined, whose processes have no
        // communicator to shrink): every member knows it from the roster.
        old.release_revoked();
        return Ok(Carried::Fresh);
    }
    let parent = match old.opts.reform {
        ReformComms::Shrink => revoked(old, vote_wait).await,
        ReformComms::Fresh => None,
    };
    let all = vote(store, size, parent.is_some(), vote_wait).await?;
    let Some(parent) = parent.filter(|_| all) else {
        old.release_revoked();
        return Ok(Carried::Fresh);
    };
    let t0 = Instant::now();
    let opts = CommOptions {
        priority: new.opts.stream_priority,
        keep_for_shrink: new.opts.reform == ReformComms::Shrink,
    };
    let excl = lost.to_vec();
    let p = parent.clone();
    let shrunk = off_thread(&parent, timeout, move || p.shrink(&excl, opts)).await;
    let comm = match shrunk {
        Ok(c) => c,
        Err(e) => {
            parent.abort_revoked();
            return Err(e);
        }
    };
    let device = comm.device().ordinal() as u32;
    new.preset(device, comm);
    new.comm_async(CommKey::devices([device]), device)
        .await
        .map_err(|e| NcclInitError::Nccl(NcclCommError::InvalidArgument(e.to_string())))?;
    let took = t0.elapsed();
    *lock(&new.shrunk) = Some(took);
    Ok(Carried::Shrunk { device, took })
}

/// Every member says whether it `can`; true when all can. The last voter
/// publishes the verdict, which the others wait for.
async fn vote(
    store: Arc<dyn Store>,
    size: usize,
    can: bool,
    timeout: Duration,
) -> Result<bool, NcclInitError> {
    let work = async move {
        if can {
            store.add(YES, 1).await?;
        }
        if store.add(VOTES, 1).await? == size as i64 {
            let yes = store.add(YES, 0).await?;
            let verdict: &[u8] = if yes == size as i64 { b"1" } else { b"0" };
            store.set(VERDICT, verdict).await?;
        }
        store.get(VERDICT, timeout).await
    };
    let verdict = chorus_store::rt::run(work)
        .await
        .map_err(NcclInitError::Store)?
        .map_err(|e| NcclInitError::Store(e.to_string()))?;
    Ok(verdict == b"1")
}

/// The old group's collective communicator once its revoke finished (at
/// most `limit` from now), if it is revoked and quiet: the parent of a
/// shrink.
async fn revoked(old: &NcclBackend, limit: Duration) -> Option<Arc<Communicator>> {
    let comms = old.collectives();
    let res = poll_backoff(limit, || {
        let states: Vec<Option<bool>> = comms.iter().map(|c| c.revoked_parent()).collect();
        if states.contains(&None) {
            return Ok(None);
        }
        Ok(Some(states.iter().position(|s| *s == Some(true))))
    })
    .await;
    match res {
        Ok(Some(i)) => Some(comms[i].clone()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chorus_store::InMemoryStore;

    /// Every member of a group of `can.len()` votes `can[i]` on one store.
    fn votes(can: &[bool]) -> Vec<bool> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let store: Arc<dyn Store> = Arc::new(InMemoryStore::new());
            let n = can.len();
            let tasks: Vec<_> = can
                .iter()
                .map(|&c| {
                    let store = store.clone();
                    tokio::spawn(async move { vote(store, n, c, Duration::from_secs(10)).await })
                })
                .collect();
            let mut out = Vec::new();
            for t in tasks {
                out.push(t.await.unwrap().unwrap());
            }
            out
        })
    }

    #[test]
    fn every_member_shrinks_only_if_all_can() {
        assert_eq!(votes(&[true, true, true]), [true, true, true]);
        assert_eq!(votes(&[true, false, true, true]), [false; 4]);
        assert_eq!(votes(&[false, false]), [false, false]);
        assert_eq!(votes(&[true]), [true]);
    }

    #[test]
    fn a_member_that_never_votes_ends_the_wait_with_an_error() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let store: Arc<dyn Store> = Arc::new(InMemoryStore::new());
        let r = rt.block_on(vote(store, 2, true, Duration::from_millis(100)));
        assert!(matches!(r, Err(NcclInitError::Store(_))), "{r:?}");
    }

    #[test]
    fn the_setting_reads_shrink_and_fresh() {
        assert_eq!(ReformComms::parse("shrink"), Some(ReformComms::Shrink));
        assert_eq!(ReformComms::parse(" fresh "), Some(ReformComms::Fresh));
        assert_eq!(ReformComms::parse("grow"), None);
        assert_eq!(ReformComms::default(), ReformComms::Fresh);
    }
}
