//! [`ProcessGroup::admit`]: the one call, at the top of each step, through
//! which a group grows back (replacement ranks let in) and recovers (a
//! failed group re-formed); when it returns a group, every member takes the
//! state from rank 0.

use std::sync::atomic::Ordering;
use std::time::Duration;

use chorus_core::{Op, WorkError};
use tracing::Instrument;

use super::rejoin::epoch_store;
use super::store_io::JOINED;
use crate::error::ReformError;
use crate::process_group::ProcessGroup;

/// The name of `admit`'s own exchange in errors and flight records.
const ADMIT: &str = "admit";

impl ProcessGroup {
    /// The step boundary of a fault-tolerant loop: every member calls it at
    /// the top of each step, and takes the state from rank 0 whenever it
    /// returns a group (`Some`). It returns
    ///
    /// * **this group, at once**, on its first call on a group that took in
    ///   replacement ranks — the group a replacement rank got from
    ///   [`GroupBuilder::rejoin_from_env`](crate::GroupBuilder::rejoin_from_env)
    ///   (or `init_from_env` in a rank `chorus-run --max-restarts`
    ///   restarted), or one [`reform`](Self::reform) grew. Such a group
    ///   refuses every op ([`WorkError::NotAdmitted`]) until then, so that
    ///   survivors and replacements take the state at the same point of
    ///   the same program;
    /// * **a re-formed group** when this group has failed (an op failed:
    ///   a lost or silent peer, a timeout, an abort), as `reform(window)`
    ///   does, with any replacement rank that waits;
    /// * **a grown group** when a replacement rank waits to join: rank 0
    ///   reads how many announced themselves for the next epoch and
    ///   broadcasts the count (chorus's own exchange, named `admit` in
    ///   errors and flight records and numbered apart from the program's
    ///   ops), so every member decides alike; the members keep their ranks,
    ///   the replacements get the ranks after theirs (by world rank);
    /// * **`None`** otherwise: one store read on rank 0 and a 4-byte
    ///   broadcast.
    ///
    /// So one loop serves the first ranks, the survivors of a failure and
    /// the replacements alike (see the example; docs/FAULTS.md, "Growing
    /// back"). A new group's members hold different states (a replacement
    /// none at all): send it from rank 0 before the step.
    ///
    /// # Errors
    ///
    /// [`ReformError::Mismatch`] when the group failed because its ranks
    /// called different ops, including a member that called `admit` where
    /// another called one of its own ops: a new group would fail the same
    /// way, so it is not re-formed. Otherwise those of
    /// [`reform`](Self::reform) when the group re-forms (after
    /// [`ReformError::Connect`] call `admit` again: it re-forms the epoch
    /// after); [`ReformError::Store`] on rank 0 alone if it could not read
    /// the store (the others then see no joiner and keep the group; the
    /// next call tries again).
    ///
    /// # Cancel safety
    ///
    /// As [`reform`](Self::reform): let it finish.
    ///
    /// # Examples
    ///
    /// The same loop on every rank, replacements included:
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # async fn train() -> Result<(), chorus::Error> {
    /// let mut pg = chorus::ProcessGroup::init_from_env().await?; // rejoins if restarted
    /// let mut params = vec![0.0f32; 1024];
    /// let mut step = 0;
    /// while step < 100 {
    ///     if let Some(g) = pg.admit(Duration::from_secs(2)).await? {
    ///         pg = g;
    ///         // Take the state from rank 0; a failure here fails the group,
    ///         // and the next admit re-forms it.
    ///         match pg.broadcast(params.clone(), 0)?.await {
    ///             Ok(p) => params = p,
    ///             Err(_) => continue,
    ///         }
    ///     }
    ///     let grads = params.clone(); // ... the step's gradients ...
    ///     match pg.all_reduce(grads, chorus::ReduceOp::Avg)?.await {
    ///         Ok(g) => {
    ///             // ... apply g to params ...
    ///             # let _ = g;
    ///             step += 1;
    ///         }
    ///         Err(failed) => eprintln!("step {step} failed: {failed}; re-forming"),
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn admit(&self, window: Duration) -> Result<Option<ProcessGroup>, ReformError> {
        let g = &self.inner;
        let next = g.epoch + 1 + g.reforms.load(Ordering::SeqCst);
        let span = tracing::debug_span!("admit", group = %g.seq.name(), rank = g.seq.rank(), next);
        async move {
            if g.seq.take_admit_first() {
                tracing::info!("a group with replacement ranks: taking the state from rank 0");
                return Ok(Some(self.clone()));
            }
            if let Some(e) = self.error() {
                return self.recover(e, window).await;
            }
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
            let seen = match g.tcp.submit_own(
                &g.seq,
                self.timeout,
                Op::Broadcast { root: 0 },
                ADMIT,
                vec![count],
            ) {
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
                    self.reform_admitted(window).await
                }
                Err(e) => self.recover(e, window).await,
            }
        }
        .instrument(span)
        .await
    }

    /// After this group failed with `e`: a re-formed group, unless the
    /// ranks called different ops (which a new group would repeat).
    async fn recover(
        &self,
        e: WorkError,
        window: Duration,
    ) -> Result<Option<ProcessGroup>, ReformError> {
        let e = match e {
            WorkError::GroupErrored { cause, .. } => (*cause).clone(),
            e => e,
        };
        if let WorkError::Mismatch { .. } = e {
            tracing::error!(error = %e, "the ranks called different ops: not re-forming");
            return Err(ReformError::Mismatch {
                group: self.name().to_string(),
                rank: self.rank(),
                source: Box::new(e),
            });
        }
        tracing::warn!(error = %e, "the group failed: re-forming");
        self.reform_admitted(window).await
    }

    /// [`reform`](Self::reform), for a group `admit` returns: the members
    /// take the state as soon as they have it, so it does not wait for
    /// another `admit`.
    async fn reform_admitted(&self, window: Duration) -> Result<Option<ProcessGroup>, ReformError> {
        let new = self.reform(window).await?;
        new.inner.seq.take_admit_first();
        Ok(Some(new))
    }
}
