//! [`ProcessGroup::reform`]: the survivors of a failure form the group's
//! next epoch.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chorus_store::wait_report::Waiting;
use chorus_store::{PrefixStore, Store};
use tracing::Instrument;

use super::quorum::{Outcome, Quorum};
use super::store_io;
use crate::backend::nccl;
use crate::error::ReformError;
use crate::process_group::builder::{connect, Setup};
use crate::process_group::state::GROUP_PREFIX;
use crate::process_group::ProcessGroup;
use crate::WorkError;
use chorus_core::sync::lock;

/// The shortest grace period after the window before a rank closes the
/// roster itself when the leader has not (it died or stalls).
const MIN_GRACE: Duration = Duration::from_secs(1);

/// Extra time the store operations of a quorum may take past the grace.
const STORE_SLACK: Duration = Duration::from_secs(5);

impl ProcessGroup {
    /// The group's epoch: 0 when created, `e + 1` for a group re-formed
    /// by [`reform`](Self::reform) from one at epoch `e`.
    pub fn epoch(&self) -> u64 {
        self.inner.epoch
    }

    /// Re-forms the group from the ranks that are still alive, after an op
    /// failed (a lost or silent peer, a timeout, a remote or aborted
    /// group): every survivor calls it, and gets the same new group, or
    /// the same error.
    ///
    /// It aborts this group first (every pending op fails, its connections
    /// close, its NCCL communicators are aborted and never used again) and
    /// its subgroups, then runs a quorum through the job's store for epoch
    /// [`epoch`](Self::epoch)` + 1`: this rank announces itself; the first
    /// rank to announce closes the roster once every old member has
    /// announced or `window` has passed, with everyone announced by then;
    /// if it does not (it died), another closes it after a grace period.
    /// The new group's members are the roster's ranks, renumbered densely
    /// in their old order ([`rank`](Self::rank) changes, [`members`](Self::members)
    /// keeps their world ranks); it has fresh sequence numbers, a fresh TCP
    /// mesh under its own store keys (name `{name}@{epoch}`), and a fresh
    /// NCCL communicator cache (new unique ids).
    ///
    /// Subgroups are not carried over: the old ones are aborted (their ops
    /// fail with a cause naming the re-form); derive new ones from the
    /// returned group with [`new_group`](Self::new_group).
    ///
    /// A rank that calls it again on the same old group (after
    /// [`ReformError::Connect`]) forms the epoch after, as the others do.
    /// The store must outlive the ranks (the launcher hosts it:
    /// `StoreHost::Launcher`), or the death of the rank hosting it ends
    /// every survivor's quorum with [`ReformError::Store`].
    ///
    /// # Errors
    ///
    /// [`ReformError::VotedOut`] if the roster was closed without this
    /// rank (it was stopped or too slow); [`ReformError::Store`] if the
    /// store failed; [`ReformError::Corrupt`] if the store holds a roster
    /// chorus did not write; [`ReformError::Connect`] if the new group
    /// could not be connected (a member died during the re-form).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future leaves this rank announced: the others may
    /// count it in and then fail to connect the new group. Let it finish
    /// (every wait in it is bounded by `window`, the grace period and the
    /// store's timeouts).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # async fn train(mut pg: chorus::ProcessGroup) -> Result<(), chorus::Error> {
    /// let mut grads = vec![0.5f32; 1024];
    /// loop {
    ///     match pg.all_reduce(grads, chorus::ReduceOp::Avg)?.await {
    ///         Ok(g) => grads = g,
    ///         Err(failed) => {
    ///             eprintln!("re-forming after: {failed}");
    ///             grads = failed.into_buffers().unwrap_or_default();
    ///             pg = pg.reform(Duration::from_secs(5)).await?;
    ///         }
    ///     }
    /// #   break;
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn reform(&self, window: Duration) -> Result<ProcessGroup, ReformError> {
        let g = &self.inner;
        let attempt = g.reforms.fetch_add(1, Ordering::SeqCst);
        let epoch = g.epoch + 1 + attempt;
        let span = tracing::info_span!("reform", group = %g.seq.name(), rank = g.seq.rank(), epoch);
        self.reform_as(epoch, window).instrument(span).await
    }

    async fn reform_as(&self, epoch: u64, window: Duration) -> Result<ProcessGroup, ReformError> {
        let g = &self.inner;
        let (old, me, size) = (g.seq.name().to_string(), g.seq.rank(), g.seq.size());
        tracing::warn!(group = %old, rank = me, epoch, "re-forming the group");
        // The peer liveness found silent or lost (before the abort below
        // replaces the group's error): the quorum need not wait for it.
        let gone = match g.seq.registry().errored() {
            Some(WorkError::PeerSilent { peer, .. } | WorkError::PeerLost { peer, .. }) => {
                vec![peer]
            }
            _ => Vec::new(),
        };
        self.abort(&format!("the group is being re-formed as epoch {epoch}"));
        let children = std::mem::take(&mut *lock(&g.children));
        for child in children.iter().filter_map(std::sync::Weak::upgrade) {
            let sub = ProcessGroup {
                inner: child,
                timeout: self.timeout,
            };
            sub.abort(&format!(
                "its parent group '{old}' was re-formed as epoch {epoch}: subgroups are not carried \
                 over, derive them from the new group with new_group"
            ));
        }

        let store: Arc<dyn Store> = Arc::new(PrefixStore::new(
            format!("{GROUP_PREFIX}/{}/reform/{epoch}", g.base),
            g.root_store.clone(),
        ));
        let now = Instant::now();
        let grace = window.max(MIN_GRACE);
        let bound = now + window + grace + STORE_SLACK;
        let q = Quorum::new(me, g.members.clone(), epoch, now, window, grace).expect_gone(gone);
        let store_err = |source| ReformError::Store {
            group: old.clone(),
            rank: me,
            epoch,
            source,
        };
        // The quorum waits for the others: say so while it lasts.
        let what = format!(
            "rank {me} of group '{old}' waits for its {size} ranks to agree on epoch {epoch} \
             (store keys {GROUP_PREFIX}/{}/reform/{epoch}/)",
            g.base
        );
        let hint = format!(
            "every survivor must call reform (or admit); the roster closes once all {size} \
             announced themselves or the window of {window:?} passed"
        );
        let outcome = chorus_store::rt::run(async move {
            let store = store.as_ref();
            Waiting::new(what, now, bound - now)
                .progress(move || store_io::quorum_progress(store, size))
                .hint(hint)
                .run(store_io::drive(store, me, size, q, bound))
                .await
        })
        .await
        .map_err(|msg| store_err(chorus_store::StoreError::Runtime(msg)))?
        .map_err(store_err)?;

        let (rank, roster) = match outcome {
            Outcome::Member { rank, roster } => (rank, roster),
            Outcome::VotedOut { roster } => {
                tracing::error!(group = %old, rank = me, epoch, members = ?roster.members, "voted out");
                return Err(ReformError::VotedOut {
                    group: old,
                    rank: me,
                    epoch,
                    members: roster.members,
                });
            }
            Outcome::Corrupt { value } => {
                return Err(ReformError::Corrupt {
                    group: old,
                    epoch,
                    value: String::from_utf8_lossy(&value).into_owned(),
                })
            }
        };
        tracing::info!(group = %old, old_rank = me, rank, epoch, members = ?roster.members, joiners = ?roster.joiners, "roster agreed");
        let members = roster.world.clone();
        let new = connect(Setup {
            base: g.base.clone(),
            epoch,
            name: format!("{}@{epoch}", g.base).into(),
            rank,
            members,
            root_store: g.root_store.clone(),
            timeout: g.timeout,
            tcp: g.tcp_opts.clone(),
            policy: g.policy,
            nccl: g.nccl_opts,
            propagate: g.propagation.is_some(),
            liveness: g.liveness,
            check_ops: g.check_ops,
            admit_first: !roster.joiners.is_empty(),
            origin: g.origin,
        })
        .await
        .map_err(|e| ReformError::Connect {
            group: old.clone(),
            rank: me,
            epoch,
            members: roster.members.clone(),
            source: Box::new(e),
        })?;
        // NCCL: the survivors' communicator from the old one where only
        // ranks were lost and every member can shrink it.
        let lost: Vec<usize> = if roster.joiners.is_empty() {
            (0..size)
                .filter(|r| roster.new_rank(*r).is_none())
                .collect()
        } else {
            Vec::new()
        };
        let carried = nccl::carry_over(
            &g.nccl,
            &new.inner.nccl,
            new.inner.nccl.store(),
            roster.world.len(),
            &lost,
            grace + STORE_SLACK,
            g.timeout,
        )
        .await
        .map_err(|e| ReformError::Connect {
            group: old.clone(),
            rank: me,
            epoch,
            members: roster.members.clone(),
            source: Box::new(crate::Error::Setup {
                group: new.name().to_string(),
                rank,
                msg: format!("carrying the NCCL communicator over to the new group failed: {e}"),
            }),
        })?;
        if let nccl::Carried::Shrunk { device, took } = carried {
            tracing::info!(group = %old, epoch, device, ?took, lost = ?lost, "NCCL communicator shrunk for the new group");
        }
        // The job's rendezvous (and the store it may host) lives on with
        // the new group.
        let rdv = lock(&g.rendezvous).take();
        *lock(&new.inner.rendezvous) = rdv;
        Ok(new)
    }
}
