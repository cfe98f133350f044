//! [`GroupState`]: what every handle on one group shares.

use std::fmt;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use chorus_store::rendezvous::Rendezvous;
use chorus_store::Store;

use crate::backend::nccl::{NcclBackend, NcclOptions};
use crate::backend::tcp::{TcpBackend, TcpOptions};
use crate::liveness::LivenessTask;
use crate::propagation::ErrorPropagation;
use crate::sequence::Sequencer;
use crate::watchdog::ErrorPolicy;

/// Default op timeout of a group (c10d's NCCL default is 10 minutes; chorus
/// takes 5 so hangs surface sooner).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// Store prefix under which every group keeps its keys.
pub(crate) const GROUP_PREFIX: &str = "chorus/group";

/// How this rank's process came into the job: what
/// [`ProcessGroup::restarts`](crate::ProcessGroup::restarts) and
/// [`ProcessGroup::is_replacement`](crate::ProcessGroup::is_replacement)
/// answer. Groups made from a group (re-formed, subgroups) keep it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Origin {
    /// How many times the launcher restarted this rank in place
    /// (`CHORUS_RANK_RESTARTS`).
    pub(crate) restarts: u64,
    /// This rank rejoined a running group instead of the initial
    /// rendezvous.
    pub(crate) replacement: bool,
}

/// The state of one group, shared by its [`ProcessGroup`](crate::ProcessGroup)
/// handles. Its parts are the crate's own; the type is public only because
/// the buffer routing ([`OpBuffer`](crate::OpBuffer)) names it.
pub struct GroupState {
    /// Name, rank, size, registry and sequence counters.
    pub(crate) seq: Sequencer,
    /// World rank of each member, by group rank.
    pub(crate) members: Vec<usize>,
    /// The job's root store (unprefixed), for subgroups.
    pub(crate) root_store: Arc<dyn Store>,
    /// Host buffers run here.
    pub(crate) tcp: Arc<TcpBackend>,
    /// Device buffers run here.
    pub(crate) nccl: Arc<NcclBackend>,
    /// Subgroups created so far (numbers their names).
    pub(crate) subgroups: AtomicU64,
    pub(crate) tcp_opts: TcpOptions,
    pub(crate) nccl_opts: NcclOptions,
    /// The group's default op timeout.
    pub(crate) timeout: Duration,
    pub(crate) policy: ErrorPolicy,
    /// Error propagation through the store, if on (subgroups inherit it).
    /// Declared before the rendezvous so that, when dropped, it flushes a
    /// failure still being published before rank 0's store stops.
    pub(crate) propagation: Option<ErrorPropagation>,
    /// The group's peer liveness timeout (zero: off; subgroups inherit it).
    pub(crate) liveness: Duration,
    /// Beats in the store and watches the peers' (none when off or alone).
    pub(crate) liveness_task: Option<LivenessTask>,
    /// The job's rendezvous (world group made by `init_from_env`), kept
    /// until [`ProcessGroup::shutdown`](crate::ProcessGroup::shutdown).
    pub(crate) rendezvous: Mutex<Option<Rendezvous>>,
    /// The group's name at epoch 0 (re-formed groups are `{base}@{epoch}`).
    pub(crate) base: Arc<str>,
    /// 0 when created; `e + 1` when re-formed from a group at epoch `e`.
    pub(crate) epoch: u64,
    /// Re-forms attempted from this group (each forms the next epoch).
    pub(crate) reforms: AtomicU64,
    /// Its subgroups, which a re-form aborts.
    pub(crate) children: Mutex<Vec<Weak<GroupState>>>,
    /// The checked mode (subgroups and re-formed groups inherit it).
    pub(crate) check_ops: bool,
    /// How this rank's process came into the job.
    pub(crate) origin: Origin,
}

impl fmt::Debug for GroupState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GroupState")
            .field("name", self.seq.name())
            .field("rank", &self.seq.rank())
            .field("size", &self.seq.size())
            .finish_non_exhaustive()
    }
}
