//! Making groups: [`GroupBuilder`] for the world group, and what every
//! group's creation shares (`connect`).

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chorus_core::flight_recorder::{self, FlightRecorder};
use chorus_core::Registry;
use chorus_store::{PrefixStore, Store};

use super::process_group::ProcessGroup;
use super::state::{GroupState, Origin, DEFAULT_TIMEOUT, GROUP_PREFIX};
use crate::backend::checked::Checker;
use crate::backend::nccl::{NcclBackend, NcclOptions};
use crate::backend::tcp::{TcpBackend, TcpOptions};
use crate::backend::Backend;
use crate::config;
use crate::error::Error;
use crate::liveness::{Liveness, PeerWitness};
use crate::propagation::ErrorPropagation;
use crate::sequence::Sequencer;
use crate::watchdog::{self, ErrorPolicy, WatchedGroup};
use chorus_core::sync::lock;

/// Builds the default (world) group from an explicit rank, size and store.
#[derive(Debug)]
pub struct GroupBuilder {
    rank: usize,
    size: usize,
    store: Option<Arc<dyn Store>>,
    name: String,
    timeout: Duration,
    tcp: TcpOptions,
    policy: ErrorPolicy,
    device: Option<usize>,
    nccl: NcclOptions,
    propagate: bool,
    liveness: Duration,
    rejoin: Duration,
    check_ops: bool,
    /// `CHORUS_RANK_RESTARTS`, read by [`ProcessGroup::builder`].
    restarts: u64,
}

impl GroupBuilder {
    /// How long a replacement rank waits to be admitted into the running
    /// group by [`rejoin_from_env`](Self::rejoin_from_env) (default
    /// [`DEFAULT_REJOIN_TIMEOUT`], 60 s, or `CHORUS_REJOIN_TIMEOUT_MS`).
    /// The survivors admit it when they re-form after a failure or call
    /// [`ProcessGroup::admit`]: make it longer than a step.
    ///
    /// [`DEFAULT_REJOIN_TIMEOUT`]: crate::process_group::DEFAULT_REJOIN_TIMEOUT
    pub fn rejoin_timeout(mut self, timeout: Duration) -> Self {
        self.rejoin = timeout;
        self
    }

    /// The peer liveness timeout (default [`DEFAULT_PEER_LIVENESS`], 10 s,
    /// or `CHORUS_PEER_LIVENESS_MS`; zero turns it off): every rank beats
    /// in the group's store from chorus's own threads, and a peer whose beat
    /// stops for this long — a stopped process, a hung or cut-off host —
    /// fails the pending works of the group with
    /// [`WorkError::PeerSilent`](chorus_core::WorkError::PeerSilent) naming it
    /// (under the group's error policy), however long their op timeout. A
    /// rank that cannot reach the store for as long fails its pending works
    /// with [`WorkError::Store`](chorus_core::WorkError::Store). Works on
    /// both backends; NCCL cannot tell a slow peer from a dead one by
    /// itself. Subgroups inherit it. See docs/FAULTS.md.
    ///
    /// [`DEFAULT_PEER_LIVENESS`]: crate::process_group::DEFAULT_PEER_LIVENESS
    pub fn peer_liveness(mut self, timeout: Duration) -> Self {
        self.liveness = timeout;
        self
    }

    /// The checked mode (default: off, or on where `CHORUS_CHECK_OPS=1`):
    /// every rank verifies every collective's signature — op, dtype, count,
    /// root, reduction — against every other rank's before it takes the
    /// op's result, so no rank returns `Ok` from an op the ranks called
    /// differently; each rank's error names both sides
    /// ([`WorkError::Mismatch`](chorus_core::WorkError::Mismatch)). Without
    /// it a mismatch fails the ranks whose frames show it, and the others
    /// at their next op (docs/FAULTS.md, "Mismatches"). It costs one
    /// exchange of signatures with every rank per op where the op's own
    /// frames do not already carry them (rooted ops, ring and chain
    /// algorithms, and every NCCL op); every rank must set it alike.
    /// Subgroups and re-formed groups inherit it. PyTorch's
    /// `TORCH_DISTRIBUTED_DEBUG=DETAIL` is the counterpart.
    pub fn check_ops(mut self, on: bool) -> Self {
        self.check_ops = on;
        self
    }

    /// Error propagation through the store (default: off, or on where
    /// `CHORUS_PROPAGATE_ERRORS=1`): the rank that detects a failure (op
    /// timeout, lost peer, mismatch, NCCL error, abort) publishes it, and
    /// the other ranks' pending works fail at once with
    /// [`WorkError::Remote`](chorus_core::WorkError::Remote) naming it, under this group's error policy,
    /// instead of each waiting out its own timeout. Subgroups inherit it.
    /// See [`crate::propagation`].
    pub fn propagate_errors(mut self, on: bool) -> Self {
        self.propagate = on;
        self
    }

    /// The CUDA device of this rank: the group's NCCL communicator is then
    /// created eagerly by [`build`](Self::build) instead of at the first
    /// device op.
    pub fn device(mut self, ordinal: usize) -> Self {
        self.device = Some(ordinal);
        self
    }

    /// Options of the NCCL backend (stream priority, blocking twin, first
    /// poll's watch).
    pub fn nccl_options(mut self, opts: NcclOptions) -> Self {
        self.nccl = opts;
        self
    }

    /// What the watchdog does when an op of this group (or of its subgroups)
    /// times out or its backend fails (default: abort the group).
    pub fn error_policy(mut self, policy: ErrorPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// This rank, from 0.
    pub fn rank(mut self, rank: usize) -> Self {
        self.rank = rank;
        self
    }

    /// Number of ranks.
    pub fn world_size(mut self, size: usize) -> Self {
        self.size = size;
        self
    }

    /// The store shared by all ranks (a `TcpStore` client, or an
    /// `InMemoryStore` shared by ranks that are tasks of one process).
    pub fn store(mut self, store: Arc<dyn Store>) -> Self {
        self.store = Some(store);
        self
    }

    /// The group's name (default `"world"`); two groups created over the
    /// same store must have different names.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Default op timeout of the group ([`DEFAULT_TIMEOUT`] if not set).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Options of the TCP backend.
    pub fn tcp_options(mut self, opts: TcpOptions) -> Self {
        self.tcp = opts;
        self
    }

    /// Joins the job described by the environment (torchrun's RANK,
    /// WORLD_SIZE, MASTER_ADDR, MASTER_PORT; SLURM; Open MPI), then connects
    /// the world group. Rank and world size set on the builder are replaced
    /// by the environment's.
    ///
    /// In a rank that `chorus-run --max-restarts` restarted in place
    /// (`CHORUS_RANK_RESTARTS` above 0) the others passed the initial
    /// rendezvous long ago: it rejoins the running group instead, as
    /// [`rejoin_from_env`](Self::rejoin_from_env) does.
    ///
    /// # Errors
    ///
    /// [`Error::Rendezvous`] naming a missing or malformed variable, or the
    /// ranks that never joined; setup errors as for [`build`](Self::build);
    /// for a restarted rank, those of [`rejoin_from_env`](Self::rejoin_from_env).
    pub async fn init_from_env(self) -> Result<ProcessGroup, Error> {
        if self.restarts > 0 {
            return self.rejoin_from_env().await;
        }
        let rdzv = chorus_store::rendezvous::init_from_env().await?;
        let pg = self.with_rendezvous(&rdzv).build().await?;
        pg.keep_rendezvous(rdzv);
        Ok(pg)
    }

    /// This builder for the job `rdzv` describes: its rank, world size and
    /// store, and (unless set) the address that routes to the store as the
    /// one peers reach this rank at.
    fn with_rendezvous(self, rdzv: &chorus_store::rendezvous::Rendezvous) -> GroupBuilder {
        let mut tcp = self.tcp.clone();
        if tcp.advertise_ip.is_loopback() {
            tcp.advertise_ip = route_ip(rdzv.store_addr());
        }
        GroupBuilder {
            rank: rdzv.rank(),
            size: rdzv.world_size(),
            store: Some(rdzv.store()),
            tcp,
            ..self
        }
    }

    /// Rejoins the running job as a replacement rank (one a launcher
    /// restarted in place after its predecessor died): connects to the
    /// job's store without the initial rendezvous, announces itself as a
    /// joiner of the world group's next epoch, and waits (at most
    /// [`rejoin_timeout`](Self::rejoin_timeout)) for the survivors to
    /// admit it, when they re-form after the failure
    /// ([`ProcessGroup::reform`]) or at a step boundary
    /// ([`ProcessGroup::admit`]). It gets the rank after the survivors'
    /// (joiners by world rank), the epoch's group (`{name}@{epoch}`), and
    /// none of the others' state: receive it (e.g. the parameters by
    /// broadcast) before the first step. The group refuses ops
    /// ([`WorkError::NotAdmitted`](chorus_core::WorkError::NotAdmitted))
    /// until [`ProcessGroup::admit`] returned it: call `admit` at the top
    /// of each step as the survivors do; its first call returns this
    /// group, as the survivors' call returns it to them, and every member
    /// then takes the state from rank 0 (docs/FAULTS.md, "Growing back").
    ///
    /// # Errors
    ///
    /// [`Error::Rendezvous`] naming a missing or malformed variable, a
    /// store that cannot be reached, or one that died with rank 0
    /// ([`RendezvousError::NoRejoin`](chorus_store::rendezvous::RendezvousError::NoRejoin));
    /// [`Error::Reform`] with [`ReformError::NotAdmitted`](crate::ReformError::NotAdmitted)
    /// if no epoch admitted it in time, or with `Store`, `Corrupt` or
    /// `Connect` as for a re-form.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future leaves this rank announced: the survivors may
    /// count it in and then fail to connect (they re-form again without
    /// it). Let it finish.
    pub async fn rejoin_from_env(self) -> Result<ProcessGroup, Error> {
        let rdzv = chorus_store::rendezvous::rejoin_from_env().await?;
        let pg = self.with_rendezvous(&rdzv).rejoin().await?;
        pg.keep_rendezvous(rdzv);
        Ok(pg)
    }

    /// Rejoins the running group named by [`name`](Self::name) over the
    /// job's [`store`](Self::store) as the replacement of world rank
    /// [`rank`](Self::rank) (of [`world_size`](Self::world_size)): what
    /// [`rejoin_from_env`](Self::rejoin_from_env) does once connected to
    /// the store, for ranks that are not started from the environment.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a rank outside the world, a missing
    /// store or a zero timeout; [`Error::Reform`] as for
    /// [`rejoin_from_env`](Self::rejoin_from_env).
    ///
    /// # Cancel safety
    ///
    /// As [`rejoin_from_env`](Self::rejoin_from_env).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # use std::sync::Arc;
    /// # use std::time::Duration;
    /// # async fn demo(store: Arc<dyn chorus::store::Store>) -> Result<(), chorus::Error> {
    /// let mut pg = chorus::ProcessGroup::builder()
    ///     .rank(2)
    ///     .world_size(3)
    ///     .store(store)
    ///     .rejoin()
    ///     .await?;
    /// // The survivors (ranks 0 and 1) are inside `admit`: so is this rank's
    /// // first call, which returns its group; then everyone takes rank 0's
    /// // state.
    /// let mut params = vec![0.0f32; 1024];
    /// if let Some(g) = pg.admit(Duration::from_secs(2)).await? {
    ///     pg = g;
    ///     params = pg.broadcast(params, 0)?.await?;
    /// }
    /// # let _ = params; Ok(()) }
    /// ```
    pub async fn rejoin(self) -> Result<ProcessGroup, Error> {
        let store = self.checked_store()?;
        let world_rank = self.rank;
        tracing::info!(group = %self.name, world_rank, "rejoining the running group as a replacement rank");
        let (roster, rank) = crate::recovery::rejoin::admitted(
            store.clone(),
            self.name.clone(),
            world_rank,
            self.rejoin,
        )
        .await?;
        tracing::info!(group = %self.name, world_rank, rank, epoch = roster.epoch, world = ?roster.world, "admitted");
        let epoch = roster.epoch;
        // The survivors let it in inside `admit` or `reform`: its first
        // call on the group must be `admit` too, so that both sides take
        // the state at the same point of their programs.
        let mut setup = Setup {
            admit_first: true,
            ..self.setup(epoch, rank, roster.world.clone(), store)
        };
        setup.origin.replacement = true;
        let pg = connect(setup)
            .await
            .map_err(|e| crate::error::ReformError::Connect {
                group: self.name.clone(),
                rank: world_rank,
                epoch,
                members: roster.members.clone(),
                source: Box::new(e),
            })?;
        if let Some(dev) = self.device {
            pg.init_device(dev).await?;
        }
        Ok(pg)
    }

    /// What connecting the group as `rank` among `members` at `epoch`
    /// takes (epoch 0: the group itself; later: its re-formed group
    /// `{name}@{epoch}`).
    fn setup(&self, epoch: u64, rank: usize, members: Vec<usize>, store: Arc<dyn Store>) -> Setup {
        let base: Arc<str> = self.name.clone().into();
        let name = if epoch == 0 {
            base.clone()
        } else {
            format!("{base}@{epoch}").into()
        };
        Setup {
            base,
            epoch,
            name,
            rank,
            members,
            root_store: store,
            timeout: self.timeout,
            tcp: self.tcp.clone(),
            policy: self.policy,
            nccl: self.nccl,
            propagate: self.propagate,
            liveness: self.liveness,
            check_ops: self.check_ops,
            admit_first: false,
            origin: Origin {
                restarts: self.restarts,
                replacement: false,
            },
        }
    }

    /// The store, once the rank, world size and op timeout are checked.
    fn checked_store(&self) -> Result<Arc<dyn Store>, Error> {
        let store = self.store.clone().ok_or_else(|| {
            Error::InvalidArgument("a store is required (GroupBuilder::store)".into())
        })?;
        if self.size == 0 || self.rank >= self.size {
            return Err(Error::InvalidArgument(format!(
                "rank {} is not in a world of size {} (expected 0 <= rank < world_size)",
                self.rank, self.size
            )));
        }
        if self.timeout.is_zero() {
            return Err(Error::InvalidArgument(
                "the op timeout must be above zero".into(),
            ));
        }
        Ok(store)
    }

    /// Connects this rank to the others and returns the group.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a rank outside the world, a missing
    /// store or a zero timeout; [`Error::Setup`] or [`Error::Store`] if the
    /// ranks cannot connect (within the TCP connect timeout).
    pub async fn build(self) -> Result<ProcessGroup, Error> {
        let store = self.checked_store()?;
        let pg = connect(self.setup(0, self.rank, (0..self.size).collect(), store)).await?;
        if let Some(dev) = self.device {
            pg.init_device(dev).await?;
        }
        Ok(pg)
    }
}

/// The local IP address that routes to `store_addr` (`host:port`): what
/// peers can reach this rank at. Falls back to loopback.
fn route_ip(store_addr: &str) -> std::net::IpAddr {
    use std::net::{IpAddr, Ipv4Addr, ToSocketAddrs, UdpSocket};
    let loopback = IpAddr::V4(Ipv4Addr::LOCALHOST);
    let Some(target) = store_addr.to_socket_addrs().ok().and_then(|mut a| a.next()) else {
        return loopback;
    };
    if target.ip().is_loopback() {
        return loopback;
    }
    // Connecting a UDP socket sends nothing; it only picks the route.
    let bind = if target.is_ipv4() {
        "0.0.0.0:0"
    } else {
        "[::]:0"
    };
    UdpSocket::bind(bind)
        .and_then(|s| s.connect(target).and_then(|()| s.local_addr()))
        .map(|a| a.ip())
        .unwrap_or(loopback)
}

impl ProcessGroup {
    /// Keeps the job's rendezvous with the world group until
    /// [`shutdown`](Self::shutdown).
    fn keep_rendezvous(&self, rdzv: chorus_store::rendezvous::Rendezvous) {
        *lock(&self.inner.rendezvous) = Some(rdzv);
    }

    /// Joins the job described by the environment and returns the world
    /// group: `ProcessGroup::builder().init_from_env()` with the defaults.
    ///
    /// # Errors
    ///
    /// As [`GroupBuilder::init_from_env`].
    pub async fn init_from_env() -> Result<ProcessGroup, Error> {
        ProcessGroup::builder().init_from_env().await
    }

    /// A builder for the world group, starting from the environment's
    /// settings (`CHORUS_SHM`, `CHORUS_NCCL_BLOCKING`, `CHORUS_POLL_SPIN_US`,
    /// `CHORUS_PROPAGATE_ERRORS`; see docs/CONFIG.md), which its methods
    /// override, and from `CHORUS_RANK_RESTARTS` (what
    /// [`restarts`](ProcessGroup::restarts) reports).
    pub fn builder() -> GroupBuilder {
        GroupBuilder {
            rank: 0,
            size: 1,
            store: None,
            name: "world".into(),
            timeout: DEFAULT_TIMEOUT,
            tcp: TcpOptions::from_env(),
            policy: ErrorPolicy::default(),
            device: None,
            nccl: NcclOptions::from_env(),
            propagate: config::propagate_errors(),
            liveness: config::peer_liveness(),
            rejoin: config::rejoin_timeout(),
            check_ops: config::check_ops(),
            restarts: config::rank_restarts(),
        }
    }
}

/// What [`connect`] makes a group from.
pub(crate) struct Setup {
    /// The group's name at epoch 0; re-formed groups are named
    /// `{base}@{epoch}`.
    pub(crate) base: Arc<str>,
    /// 0 for a new group, `e + 1` for one re-formed from epoch `e`.
    pub(crate) epoch: u64,
    pub(crate) name: Arc<str>,
    pub(crate) rank: usize,
    pub(crate) members: Vec<usize>,
    pub(crate) root_store: Arc<dyn Store>,
    pub(crate) timeout: Duration,
    pub(crate) tcp: TcpOptions,
    pub(crate) policy: ErrorPolicy,
    pub(crate) nccl: NcclOptions,
    pub(crate) propagate: bool,
    pub(crate) liveness: Duration,
    /// The checked mode ([`GroupBuilder::check_ops`]).
    pub(crate) check_ops: bool,
    /// The group takes in replacement ranks: it refuses ops until `admit`
    /// returned it (see `ProcessGroup::admit`).
    pub(crate) admit_first: bool,
    /// How this rank's process came into the job.
    pub(crate) origin: Origin,
}

/// Connects this rank's part of a group: counts it in through the store,
/// connects the TCP backend, prepares the NCCL one (lazy), and registers
/// the group with the watchdog (and error propagation, if on).
pub(crate) async fn connect(setup: Setup) -> Result<ProcessGroup, Error> {
    let Setup {
        base,
        epoch: group_epoch,
        name,
        rank,
        members,
        root_store,
        timeout,
        tcp,
        policy,
        nccl: nccl_opts,
        propagate,
        liveness,
        check_ops,
        admit_first,
        origin,
    } = setup;
    config::apply_profile();
    let size = members.len();
    let store: Arc<dyn Store> = Arc::new(PrefixStore::new(
        format!("{GROUP_PREFIX}/{name}"),
        root_store.clone(),
    ));
    // Count this rank in through the store first: a store that is gone
    // (its host died) shows up here as a store error, not as a backend
    // setup failure.
    let joined = store.clone();
    let joined = chorus_store::rt::run(async move { joined.add("joined", 1).await })
        .await
        .map_err(|e| Error::Setup {
            group: name.to_string(),
            rank,
            msg: e,
        })??;
    // Ranks of a group re-created under the same name count on: the
    // epoch tells its error key from its predecessor's.
    let epoch = u64::try_from(joined - 1).unwrap_or(0) / size as u64;
    let prop_store = store.clone();
    // The first beat before the backends connect: once the group is up,
    // every rank's counter exists.
    let beats = (size > 1 && !liveness.is_zero()).then(|| Liveness {
        store: store.clone(),
        epoch,
        group: name.clone(),
        rank,
        size,
        timeout: liveness,
        policy,
        witness: Arc::new(PeerWitness::new(liveness)),
    });
    if let Some(b) = &beats {
        let first = b.first_beat();
        chorus_store::rt::run(first)
            .await
            .map_err(|msg| Error::Setup {
                group: name.to_string(),
                rank,
                msg,
            })??;
    }
    let tcp_backend = TcpBackend::connect(
        store.clone(),
        rank,
        size,
        name.clone(),
        tcp.clone(),
        check_ops,
    )
    .await?;
    let nccl = Arc::new(
        NcclBackend::new(name.clone(), rank, size, store, nccl_opts, timeout)
            .checked(check_ops.then(|| Checker::new(tcp_backend.clone(), timeout)))
            .witnessed(beats.as_ref().map(|b| b.witness.clone())),
    );
    let recorder = Arc::new(FlightRecorder::new(flight_recorder::DEFAULT_CAPACITY));
    let registry = Arc::new(Registry::with_recorder(recorder));
    let hook_tcp = tcp_backend.clone();
    let hook_nccl = nccl.clone();
    registry.set_abort_hook(move |cause| {
        // The dump first: it records the ops as they stood when the
        // group failed, before the backends fail them.
        watchdog::on_group_error(cause);
        hook_tcp.abort(cause);
        hook_nccl.abort(cause);
    });
    let check_nccl = Arc::downgrade(&nccl);
    watchdog::watch(WatchedGroup {
        name: name.clone(),
        rank,
        size,
        registry: Arc::downgrade(&registry),
        policy,
        check: Some(Arc::new(move || {
            check_nccl.upgrade().and_then(|n| n.async_error())
        })),
    });
    let propagation = propagate.then(|| {
        ErrorPropagation::start(
            prop_store,
            epoch,
            &registry,
            name.clone(),
            rank,
            size,
            policy,
        )
    });
    let liveness_task = beats.map(|b| b.start(&registry));
    tracing::debug!(group = %name, rank, size, "group ready");
    Ok(ProcessGroup {
        inner: Arc::new(GroupState {
            seq: Sequencer::new(name, rank, size, registry, admit_first),
            members,
            root_store,
            tcp: tcp_backend,
            nccl,
            subgroups: AtomicU64::new(0),
            tcp_opts: tcp,
            nccl_opts,
            timeout,
            policy,
            propagation,
            liveness,
            liveness_task,
            rendezvous: Mutex::new(None),
            base,
            epoch: group_epoch,
            reforms: AtomicU64::new(0),
            children: Mutex::new(Vec::new()),
            check_ops,
            origin,
        }),
        timeout,
    })
}
