//! [`ProcessGroup::admit`]: the members let replacement ranks in at a step
//! boundary.

use std::sync::atomic::Ordering;
use std::time::Duration;

use tracing::Instrument;

use super::rejoin::epoch_store;
use super::store_io::JOINED;
use crate::error::ReformError;
use crate::process_group::ProcessGroup;

impl ProcessGroup {
    /// Lets replacement ranks in: every member calls it at the same point
    /// (a step boundary, as torchft's per-step quorum); if any replacement
    /// rank waits to join ([`GroupBuilder::rejoin_from_env`](crate::GroupBuilder::rejoin_from_env),
    /// or `init_from_env` in a rank that `chorus-run --max-restarts`
    /// restarted), the members re-form the group with it, as
    /// [`reform`](Self::reform) does, and get the grown group; otherwise
    /// they keep this one.
    ///
    /// Rank 0 reads how many joiners announced themselves for the next
    /// epoch and broadcasts the count, so every member decides alike: one
    /// store read and one 4-byte broadcast when nobody waits. The joiners
    /// get the ranks after the members' (by world rank); the members keep
    /// their ranks. If the broadcast fails (a member died), the group is
    /// re-formed without it (and with any joiner) all the same.
    ///
    /// A grown group's new members hold none of the others' state: send it
    /// (e.g. broadcast the parameters from rank 0) before the next step.
    ///
    /// # Errors
    ///
    /// Those of [`reform`](Self::reform) when the group re-forms;
    /// [`ReformError::Store`] on rank 0 alone if it could not read the
    /// store (the others then see no joiner and keep the group; the next
    /// call tries again).
    ///
    /// # Cancel safety
    ///
    /// As [`reform`](Self::reform): let it finish.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # async fn train(mut pg: chorus::ProcessGroup) -> Result<(), chorus::Error> {
    /// let mut params = vec![0.0f32; 1024];
    /// for _step in 0..100 {
    ///     if let Some(grown) = pg.admit(Duration::from_secs(2)).await? {
    ///         pg = grown;
    ///         params = pg.broadcast(params, 0)?.await?;
    ///     }
    ///     // ... the step ...
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn admit(&self, window: Duration) -> Result<Option<ProcessGroup>, ReformError> {
        let g = &self.inner;
        let next = g.epoch + 1 + g.reforms.load(Ordering::SeqCst);
        let span = tracing::debug_span!("admit", group = %g.seq.name(), rank = g.seq.rank(), next);
        async move {
            let mut count = 0i32;
            let mut read_err = None;
            if g.seq.rank() == 0 {
                let store = epoch_store(&g.root_store, &g.base, next);
                let read = chorus_store::rt::run(async move {
                    chorus_store::Store::add(&store, JOINED, 0).await
                })
                .await
                .map_err(chorus_store::StoreError::Runtime)
                .and_then(|r| r);
                match read {
                    Ok(n) => count = i32::try_from(n.max(0)).unwrap_or(i32::MAX),
                    Err(e) => read_err = Some(e),
                }
            }
            let seen = match self.broadcast(vec![count], 0) {
                Ok(work) => work.await.map_err(|f| f.error),
                Err(rejected) => Err(rejected.error),
            };
            match seen {
                Ok(v) if v.first().copied().unwrap_or(0) == 0 => match read_err {
                    None => Ok(None),
                    Some(source) => Err(ReformError::Store {
                        group: g.seq.name().to_string(),
                        rank: g.seq.rank(),
                        epoch: next,
                        source,
                    }),
                },
                Ok(v) => {
                    tracing::info!(joiners = v[0], epoch = next, "admitting replacement ranks");
                    self.reform(window).await.map(Some)
                }
                Err(e) => {
                    tracing::warn!(error = %e, "the group failed while checking for joiners: re-forming");
                    self.reform(window).await.map(Some)
                }
            }
        }
        .instrument(span)
        .await
    }
}
