//! A replacement rank finds the epoch that admits it: one [`Joiner`] per
//! epoch, from 1 on, until a roster names it or its timeout passes.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chorus_store::wait_report::Waiting;
use chorus_store::{PrefixStore, Store};

use super::joiner::{JoinOutcome, Joiner};
use super::quorum::Roster;
use super::store_io;
use crate::error::ReformError;
use crate::process_group::state::GROUP_PREFIX;

/// The store of group `base`'s re-form keys of `epoch`.
pub(crate) fn epoch_store(root: &Arc<dyn Store>, base: &str, epoch: u64) -> PrefixStore {
    PrefixStore::new(
        format!("{GROUP_PREFIX}/{base}/reform/{epoch}"),
        root.clone(),
    )
}

/// Waits, as the replacement rank with world rank `world_rank`, for an
/// epoch of group `base` that admits it, for at most `wait`, reporting
/// while it lasts. Returns the epoch's roster and this rank's new rank in
/// it.
///
/// # Errors
///
/// [`ReformError::NotAdmitted`] when `wait` passed; [`ReformError::Store`]
/// or [`ReformError::Corrupt`] as for a re-form.
pub(crate) async fn admitted(
    root: Arc<dyn Store>,
    base: String,
    world_rank: usize,
    wait: Duration,
) -> Result<(Roster, usize), ReformError> {
    let started = Instant::now();
    // The epoch searched, for the reports.
    let searching = Arc::new(AtomicU64::new(1));
    let what = format!(
        "world rank {world_rank} waits to be admitted into group '{base}' as a replacement rank \
         (store keys {GROUP_PREFIX}/{base}/reform/<epoch>/)"
    );
    let hint = "the members admit it when they call ProcessGroup::admit at a step boundary, or \
                reform after a failure";
    let (probe_root, probe_base, seen) = (root.clone(), base.clone(), searching.clone());
    let found = search(
        root,
        base.clone(),
        world_rank,
        started + wait,
        wait,
        searching,
    );
    let reported = Waiting::new(what, started, wait)
        .progress(move || {
            let epoch = seen.load(Ordering::Relaxed);
            let store = epoch_store(&probe_root, &probe_base, epoch);
            async move { store_io::join_progress(&store, epoch).await }
        })
        .hint(hint)
        .run(found);
    // Dropping this future stops the search (at its next await), as it
    // would stop a search run on the caller's executor.
    let (cancel, cancelled) = futures::channel::oneshot::channel::<()>();
    let _cancel = cancel;
    let runtime_failed = |msg| ReformError::Store {
        group: base.clone(),
        rank: world_rank,
        epoch: 1,
        source: chorus_store::StoreError::Runtime(msg),
    };
    chorus_store::rt::run(async move {
        tokio::select! {
            r = reported => Some(r),
            _ = cancelled => None,
        }
    })
    .await
    .map_err(runtime_failed)?
    .unwrap_or_else(|| Err(runtime_failed("the search was cancelled".into())))
}

/// The search itself, on chorus's I/O runtime: one [`Joiner`] per epoch
/// from 1 on (`searching` says which), until `bound`.
async fn search(
    root: Arc<dyn Store>,
    base: String,
    world_rank: usize,
    bound: Instant,
    wait: Duration,
    searching: Arc<AtomicU64>,
) -> Result<(Roster, usize), ReformError> {
    let mut epoch = 1;
    loop {
        searching.store(epoch, Ordering::Relaxed);
        let store = epoch_store(&root, &base, epoch);
        let next = epoch_store(&root, &base, epoch + 1);
        let j = Joiner::new(world_rank, epoch);
        let outcome = store_io::drive_join(&store, &next, world_rank, j, bound).await;
        match outcome {
            Ok(JoinOutcome::Member { rank, roster }) => return Ok((roster, rank)),
            Ok(JoinOutcome::Passed) => epoch += 1,
            Ok(JoinOutcome::Corrupt { value }) => {
                return Err(ReformError::Corrupt {
                    group: base,
                    epoch,
                    value: String::from_utf8_lossy(&value).into_owned(),
                })
            }
            Err(chorus_store::StoreError::Timeout { .. }) if Instant::now() >= bound => {
                return Err(ReformError::NotAdmitted {
                    group: base,
                    world_rank,
                    epoch,
                    after: wait,
                })
            }
            Err(source) => {
                return Err(ReformError::Store {
                    group: base,
                    rank: world_rank,
                    epoch,
                    source,
                })
            }
        }
    }
}
