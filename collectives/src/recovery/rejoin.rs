//! A replacement rank finds the epoch that admits it: one [`Joiner`] per
//! epoch, from 1 on, until a roster names it or its timeout passes.

use std::sync::Arc;
use std::time::{Duration, Instant};

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
/// epoch of group `base` that admits it, for at most `wait`. Returns the
/// epoch's roster and this rank's new rank in it.
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
    let bound = Instant::now() + wait;
    let mut epoch = 1;
    loop {
        let store = epoch_store(&root, &base, epoch);
        let next = epoch_store(&root, &base, epoch + 1);
        let j = Joiner::new(world_rank, epoch);
        let outcome = {
            let (store, next) = (store, next);
            chorus_store::rt::run(async move {
                store_io::drive_join(&store, &next, world_rank, j, bound).await
            })
            .await
            .map_err(chorus_store::StoreError::Runtime)
            .and_then(|r| r)
        };
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
