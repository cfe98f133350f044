//! A rank's control plane without its data plane, for simulating thousands
//! of ranks on one machine (the `control_plane` benchmark and the scale
//! tests): [`SimRank`] counts itself into a group through the store,
//! exchanges a communicator id, beats and watches with the real liveness
//! task, and re-forms with the real quorum, all on its own store
//! connection, and holds one pending work that liveness fails.

use std::sync::Arc;
use std::time::{Duration, Instant};

use chorus_core::work::{Completer, OpFuture};
use chorus_core::{OpContext, Registry, WorkError};
use chorus_store::{PrefixStore, Store, StoreError};

use crate::liveness::{Liveness, LivenessTask, PeerWitness};
use crate::process_group::state::GROUP_PREFIX;
use crate::recovery::quorum::{Outcome, Quorum};
use crate::recovery::store_io::drive;
use crate::watchdog::ErrorPolicy;

/// What can go wrong with a simulated rank, naming the rank, the group and
/// the step.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// A store request of `step` failed.
    #[error("simulated rank {rank} of group '{group}': {step} failed: {source} (is the store up and reachable?)")]
    Store {
        /// The rank.
        rank: usize,
        /// The group.
        group: String,
        /// What the rank was doing.
        step: &'static str,
        /// The store's error.
        #[source]
        source: StoreError,
    },
    /// The re-forming quorum left this rank out (it announced too late).
    #[error("simulated rank {rank} of group '{group}' was voted out of epoch {epoch}")]
    VotedOut {
        /// The rank.
        rank: usize,
        /// The group.
        group: String,
        /// The epoch it is not part of.
        epoch: u64,
    },
    /// The roster in the store is not one chorus wrote.
    #[error("simulated rank {rank} of group '{group}': the roster of epoch {epoch} is corrupt")]
    Corrupt {
        /// The rank.
        rank: usize,
        /// The group.
        group: String,
        /// The epoch.
        epoch: u64,
    },
    /// The liveness work could not be registered.
    #[error("simulated rank {rank} of group '{group}': {0}", rank = .1, group = .2)]
    Work(WorkError, usize, String),
}

/// One simulated rank of a group at one epoch: what it did and what it
/// holds. Dropping it stops its liveness task as a clean leave.
#[derive(Debug)]
pub struct SimRank {
    root: Arc<dyn Store>,
    name: String,
    epoch: u64,
    rank: usize,
    size: usize,
    liveness: Duration,
    registry: Arc<Registry>,
    _work: OpFuture<u32>,
    _completer: Completer<u32>,
    task: Option<LivenessTask>,
}

impl SimRank {
    /// Joins `name` at `epoch` as `rank` of `size` through `root` (the
    /// job's store, one connection per simulated rank): counts itself in,
    /// exchanges a communicator id (rank 0 writes it, the others wait for
    /// it), beats once and starts the liveness task (timeout `liveness`)
    /// over one pending work. Runs on chorus's runtime.
    ///
    /// # Errors
    ///
    /// [`SimError::Store`] naming the step whose store request failed.
    pub async fn join(
        root: Arc<dyn Store>,
        name: &str,
        epoch: u64,
        rank: usize,
        size: usize,
        liveness: Duration,
    ) -> Result<SimRank, SimError> {
        let group = format!("{name}@{epoch}");
        let store: Arc<dyn Store> = Arc::new(PrefixStore::new(
            format!("{GROUP_PREFIX}/{group}"),
            root.clone(),
        ));
        let err = |step| {
            let group = group.clone();
            move |source| SimError::Store {
                rank,
                group,
                step,
                source,
            }
        };
        store.add("joined", 1).await.map_err(err("count in"))?;
        let id = "comm/0/id";
        if rank == 0 {
            let value = format!("simulated-id-{epoch}");
            store.set(id, value.as_bytes()).await.map_err(err("id"))?;
        } else {
            store
                .get(id, Duration::from_secs(120))
                .await
                .map_err(err("id"))?;
        }
        let registry = Arc::new(Registry::new());
        let l = Liveness {
            store,
            epoch: 0,
            group: group.clone().into(),
            rank,
            size,
            timeout: liveness,
            policy: ErrorPolicy::FailWorks,
            witness: Arc::new(PeerWitness::new(liveness)),
        };
        l.first_beat().await.map_err(err("first beat"))?;
        let ctx = OpContext::new(rank, group.clone().into(), 1, "all_reduce");
        let (work, completer) = OpFuture::<u32>::new(ctx, &registry, None)
            .map_err(|e| SimError::Work(e, rank, group))?;
        let task = (size > 1).then(|| l.start(&registry));
        Ok(SimRank {
            root,
            name: name.to_string(),
            epoch,
            rank,
            size,
            liveness,
            registry,
            _work: work,
            _completer: completer,
            task,
        })
    }

    /// This rank in its group.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The group's size.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Why the pending work failed, once liveness failed it.
    pub fn failure(&self) -> Option<WorkError> {
        self.registry.errored()
    }

    /// Stops beating without leaving, as a stopped or killed process.
    pub fn halt(&mut self) {
        if let Some(t) = self.task.take() {
            t.halt();
        }
    }

    /// Re-forms the group at the next epoch with the real quorum over
    /// `window` and joins it: the new rank, and the old ranks of the
    /// members.
    ///
    /// # Errors
    ///
    /// [`SimError::Store`], [`SimError::VotedOut`], [`SimError::Corrupt`].
    pub async fn reform(&self, window: Duration) -> Result<(SimRank, Vec<usize>), SimError> {
        let epoch = self.epoch + 1;
        let group = format!("{}@{}", self.name, self.epoch);
        let store = PrefixStore::new(
            format!("{GROUP_PREFIX}/{}/reform/{epoch}", self.name),
            self.root.clone(),
        );
        let now = Instant::now();
        let grace = window.max(Duration::from_secs(1));
        let q = Quorum::new(
            self.rank,
            (0..self.size).collect(),
            epoch,
            now,
            window,
            grace,
        );
        let outcome = drive(&store, self.rank, self.size, q, now + window + grace * 2)
            .await
            .map_err(|source| SimError::Store {
                rank: self.rank,
                group: group.clone(),
                step: "re-forming quorum",
                source,
            })?;
        let (rank, roster) = match outcome {
            Outcome::Member { rank, roster } => (rank, roster),
            Outcome::VotedOut { .. } => {
                return Err(SimError::VotedOut {
                    rank: self.rank,
                    group,
                    epoch,
                })
            }
            Outcome::Corrupt { .. } => {
                return Err(SimError::Corrupt {
                    rank: self.rank,
                    group,
                    epoch,
                })
            }
        };
        let next = SimRank::join(
            self.root.clone(),
            &self.name,
            epoch,
            rank,
            roster.members.len(),
            self.liveness,
        )
        .await?;
        Ok((next, roster.members))
    }
}
