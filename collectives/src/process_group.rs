//! [`ProcessGroup`]: the ranks of a job (or a subgroup of them) and the
//! collectives they run together.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::propagation::{self, ErrorPropagation};
use crate::watchdog::{self, ErrorPolicy, WatchedGroup};
use chorus_core::flight_recorder::{self, FlightRecorder, OpRecord};
use chorus_core::{OpContext, Registry, WorkError};
use chorus_store::{PrefixStore, Store};

use crate::backend::nccl::{self, NcclBackend, NcclOptions};
use crate::backend::tcp::{TcpBackend, TcpOptions};
use crate::backend::{Backend, OpKind, OpOutput, OpRequest};
use crate::device::{DeviceResult, DeviceWork, Op1, Op2, OpBuffer};
use crate::dtype::{Element, ReduceOp};
use crate::error::{Error, Rejected};
use crate::work::{InOut, OpResult, Work};
use chorus_core::comm_cache::CommKey;
use chorus_gpu::nccl::{CommOp, DeviceBuffer, DeviceMem, NcclCommError, NcclElement};

/// Default op timeout of a group (c10d's NCCL default is 10 minutes; chorus
/// takes 5 so hangs surface sooner).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// Store prefix under which every group keeps its keys.
const GROUP_PREFIX: &str = "chorus/group";

pub mod capture;
pub mod group;

/// A group of ranks that run collectives together.
///
/// Cheap to clone (the clones share the group). Every op is submitted to the
/// backend when it is called, in program order, and returns a [`Work`]
/// future that yields the op's buffers back when it is done.
///
/// Every rank of a group must call the same collectives in the same order
/// with matching counts and dtypes; a mismatch is reported as
/// [`WorkError::Mismatch`] naming both sides.
#[derive(Clone)]
pub struct ProcessGroup {
    inner: Arc<Group>,
    /// Per-op timeout override set by [`with_timeout`](Self::with_timeout).
    timeout: Duration,
}

struct Group {
    name: Arc<str>,
    rank: usize,
    size: usize,
    /// World rank of each member, by group rank.
    members: Vec<usize>,
    /// The job's root store (unprefixed), for subgroups.
    root_store: Arc<dyn Store>,
    registry: Arc<Registry>,
    backend: Arc<dyn Backend>,
    /// The NCCL side: device buffers go here.
    nccl: Arc<NcclBackend>,
    nccl_opts: NcclOptions,
    /// Submission lock and sequence counters: taking a sequence number and
    /// handing the op to the backend happen under one lock, so program order
    /// is submission order even when several threads submit.
    submit: Mutex<Counters>,
    subgroups: AtomicU64,
    tcp: TcpOptions,
    timeout: Duration,
    policy: ErrorPolicy,
    /// Error propagation through the store, if on (subgroups inherit it).
    /// Declared before the rendezvous so that, when dropped, it flushes a
    /// failure still being published before rank 0's store stops.
    propagation: Option<ErrorPropagation>,
    /// The job's rendezvous (world group made by `init_from_env`), kept
    /// until [`ProcessGroup::shutdown`].
    rendezvous: Mutex<Option<chorus_store::rendezvous::Rendezvous>>,
}

#[derive(Clone)]
struct Counters {
    /// Collective sequence number, equal on every rank for the same call.
    collective: u64,
    /// Number of messages sent to each peer.
    sent: Vec<u64>,
    /// Number of messages received from each peer.
    received: Vec<u64>,
}

impl fmt::Debug for ProcessGroup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProcessGroup")
            .field("name", &self.inner.name)
            .field("rank", &self.inner.rank)
            .field("size", &self.inner.size)
            .field("backend", &self.inner.backend.name())
            .finish()
    }
}

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
    propagate: Option<bool>,
}

impl GroupBuilder {
    /// Error propagation through the store (default: off, or on where
    /// `CHORUS_PROPAGATE_ERRORS=1`): the rank that detects a failure (op
    /// timeout, lost peer, mismatch, NCCL error, abort) publishes it, and
    /// the other ranks' pending works fail at once with
    /// [`WorkError::Remote`] naming it, under this group's error policy,
    /// instead of each waiting out its own timeout. Subgroups inherit it.
    /// See [`crate::propagation`].
    pub fn propagate_errors(mut self, on: bool) -> Self {
        self.propagate = Some(on);
        self
    }

    /// The CUDA device of this rank: the group's NCCL communicator is then
    /// created eagerly by [`build`](Self::build) instead of at the first
    /// device op.
    pub fn device(mut self, ordinal: usize) -> Self {
        self.device = Some(ordinal);
        self
    }

    /// Options of the NCCL backend (stream priority).
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
    /// # Errors
    ///
    /// [`Error::Rendezvous`] naming a missing or malformed variable, or the
    /// ranks that never joined; setup errors as for [`build`](Self::build).
    pub async fn init_from_env(self) -> Result<ProcessGroup, Error> {
        let rdzv = chorus_store::rendezvous::init_from_env().await?;
        let mut tcp = self.tcp.clone();
        if tcp.advertise_ip.is_loopback() {
            tcp.advertise_ip = route_ip(rdzv.store_addr());
        }
        let pg = GroupBuilder {
            rank: rdzv.rank(),
            size: rdzv.world_size(),
            store: Some(rdzv.store()),
            tcp,
            ..self
        }
        .build()
        .await?;
        *pg.inner
            .rendezvous
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(rdzv);
        Ok(pg)
    }

    /// Connects this rank to the others and returns the group.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a rank outside the world, a missing
    /// store or a zero timeout; [`Error::Setup`] or [`Error::Store`] if the
    /// ranks cannot connect (within the TCP connect timeout).
    pub async fn build(self) -> Result<ProcessGroup, Error> {
        let store = self.store.ok_or_else(|| {
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
        let members = (0..self.size).collect();
        let pg = ProcessGroup::connect(
            self.name.into(),
            self.rank,
            members,
            store,
            self.timeout,
            self.tcp,
            self.policy,
            self.nccl,
            self.propagate.unwrap_or_else(propagation::enabled_from_env),
        )
        .await?;
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
    /// Joins the job described by the environment and returns the world
    /// group: `ProcessGroup::builder().init_from_env()` with the defaults.
    ///
    /// # Errors
    ///
    /// As [`GroupBuilder::init_from_env`].
    pub async fn init_from_env() -> Result<ProcessGroup, Error> {
        ProcessGroup::builder().init_from_env().await
    }

    /// Leaves the job at its end, on every rank: closes the group's
    /// connections gracefully (says goodbye to every peer and waits, at most
    /// 2 s, for theirs, so no rank exits while another still reads what it
    /// sent), then leaves the rendezvous (rank 0 waits for every rank to
    /// leave, then stops the store server). Ops submitted afterwards fail.
    ///
    /// # Errors
    ///
    /// [`Error::Rendezvous`] if some ranks did not leave in time (rank 0).
    pub async fn shutdown(&self) -> Result<(), Error> {
        // Failures after the goodbye are nobody else's concern.
        if let Some(p) = &self.inner.propagation {
            p.stop();
        }
        // Goodbyes first: no rank closes while another still reads from it.
        let close = self.inner.backend.close();
        chorus_store::rt::run(close)
            .await
            .map_err(|msg| Error::Setup {
                group: self.inner.name.to_string(),
                rank: self.inner.rank,
                msg,
            })?;
        let rdzv = self
            .inner
            .rendezvous
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        match rdzv {
            Some(r) => Ok(r.shutdown().await?),
            None => Ok(()),
        }
    }

    /// A builder for the world group.
    pub fn builder() -> GroupBuilder {
        GroupBuilder {
            rank: 0,
            size: 1,
            store: None,
            name: "world".into(),
            timeout: DEFAULT_TIMEOUT,
            tcp: TcpOptions::default(),
            policy: ErrorPolicy::default(),
            device: None,
            nccl: NcclOptions::default(),
            propagate: None,
        }
    }

    #[allow(clippy::too_many_arguments)]
    async fn connect(
        name: Arc<str>,
        rank: usize,
        members: Vec<usize>,
        root_store: Arc<dyn Store>,
        timeout: Duration,
        tcp: TcpOptions,
        policy: ErrorPolicy,
        nccl_opts: NcclOptions,
        propagate: bool,
    ) -> Result<ProcessGroup, Error> {
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
        let backend: Arc<dyn Backend> =
            TcpBackend::connect(store.clone(), rank, size, name.clone(), tcp.clone()).await?;
        let nccl = Arc::new(NcclBackend::new(
            name.clone(),
            rank,
            size,
            store,
            nccl_opts,
            timeout,
        ));
        let recorder = Arc::new(FlightRecorder::new(flight_recorder::DEFAULT_CAPACITY));
        let registry = Arc::new(Registry::with_recorder(recorder));
        let hook_backend = backend.clone();
        let hook_nccl = nccl.clone();
        registry.set_abort_hook(move |cause| {
            // The dump first: it records the ops as they stood when the
            // group failed, before the backends fail them.
            watchdog::on_group_error(cause);
            hook_backend.abort(cause);
            hook_nccl.abort(&cause.to_string());
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
        tracing::debug!(group = %name, rank, size, "group ready");
        Ok(ProcessGroup {
            inner: Arc::new(Group {
                name,
                rank,
                size,
                members,
                root_store,
                registry,
                backend,
                nccl,
                nccl_opts,
                submit: Mutex::new(Counters {
                    collective: 0,
                    sent: vec![0; size],
                    received: vec![0; size],
                }),
                subgroups: AtomicU64::new(0),
                tcp,
                timeout,
                policy,
                propagation,
                rendezvous: Mutex::new(None),
            }),
            timeout,
        })
    }

    /// This rank's index in the group.
    pub fn rank(&self) -> usize {
        self.inner.rank
    }

    /// Number of ranks in the group.
    pub fn size(&self) -> usize {
        self.inner.size
    }

    /// The group's name (`"world"`, or `"world/1"` for its first subgroup).
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// World ranks of the members, by group rank.
    pub fn members(&self) -> &[usize] {
        &self.inner.members
    }

    /// The backend's name (`"tcp"`).
    pub fn backend_name(&self) -> &'static str {
        self.inner.backend.name()
    }

    /// The op timeout applied to ops submitted through this handle.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// A handle on the same group whose ops use `timeout` instead of the
    /// group's default (the per-op override).
    pub fn with_timeout(&self, timeout: Duration) -> ProcessGroup {
        ProcessGroup {
            inner: self.inner.clone(),
            timeout,
        }
    }

    /// Number of ops submitted and not yet finished.
    pub fn pending(&self) -> usize {
        self.inner.registry.pending()
    }

    /// The ops in the group's flight recorder, oldest first.
    pub fn flight_record(&self) -> Vec<OpRecord> {
        self.inner
            .registry
            .recorder()
            .map(|r| r.snapshot())
            .unwrap_or_default()
    }

    /// Writes the flight recorders of every group of this process into the
    /// dump folder (`CHORUS_TRACE_DIR`) and returns the file's path; read it
    /// with `chorus-trace`.
    ///
    /// # Errors
    ///
    /// The I/O error.
    pub fn dump_flight_recorder(&self) -> std::io::Result<std::path::PathBuf> {
        watchdog::dump_all("request")
    }

    /// The group's first error, once it has failed or was aborted.
    pub fn error(&self) -> Option<WorkError> {
        self.inner.registry.errored()
    }

    /// Aborts the group: closes its connections and fails every pending op
    /// with [`WorkError::Aborted`]; every later op fails at once. Ops cannot
    /// be recalled otherwise (dropping a work does not cancel it).
    pub fn abort(&self, reason: &str) {
        let ctx = OpContext {
            rank: self.inner.rank,
            group: self.inner.name.clone(),
            seq: 0,
            op: "abort",
        };
        let cause = WorkError::Aborted {
            ctx,
            reason: reason.to_string(),
        };
        tracing::warn!(group = %self.inner.name, reason, "group aborted");
        self.inner.registry.abort(&cause);
    }

    /// Creates a subgroup of the given world ranks (in that order).
    ///
    /// Every rank of this group must call it, with the same list, in the same
    /// order relative to other `new_group` calls (as in c10d). Ranks in the
    /// list get `Some(group)`; the others get `None`. The subgroup has its
    /// own store prefix, sequence numbers and connections.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for an empty list, a duplicate or a rank
    /// outside this group; setup errors as for the world group.
    pub async fn new_group(&self, ranks: &[usize]) -> Result<Option<ProcessGroup>, Error> {
        let g = &self.inner;
        if ranks.is_empty() {
            return Err(Error::InvalidArgument(
                "new_group needs at least one rank".into(),
            ));
        }
        let mut seen = vec![false; g.size];
        for &r in ranks {
            match g.members.iter().position(|&m| m == r) {
                None => {
                    return Err(Error::InvalidArgument(format!(
                        "rank {r} is not a member of group '{}' (members: {:?})",
                        g.name, g.members
                    )))
                }
                Some(i) if seen[i] => {
                    return Err(Error::InvalidArgument(format!(
                        "rank {r} appears twice in new_group({ranks:?})"
                    )))
                }
                Some(i) => seen[i] = true,
            }
        }
        // Counted only once the call is valid, so every rank numbers its
        // subgroups the same way.
        let k = g.subgroups.fetch_add(1, Ordering::SeqCst) + 1;
        let me = g.members[g.rank];
        let sub_rank = ranks.iter().position(|&r| r == me);
        // Split the parent's NCCL communicator where one exists: every rank
        // of the parent takes part, those outside with no colour.
        let split = match g.nccl.collective_comm() {
            Some(parent) => {
                let dev = parent.device().ordinal() as u32;
                nccl::split(parent, sub_rank, ranks.len(), g.nccl_opts, g.timeout)
                    .await
                    .map_err(|e| Error::Setup {
                        group: format!("{}/{k}", g.name),
                        rank: g.rank,
                        msg: format!("splitting the parent's NCCL communicator failed: {e}"),
                    })?
                    .map(|c| (dev, c))
            }
            None => None,
        };
        let Some(sub_rank) = sub_rank else {
            return Ok(None);
        };
        let name: Arc<str> = format!("{}/{k}", g.name).into();
        let group = ProcessGroup::connect(
            name,
            sub_rank,
            ranks.to_vec(),
            g.root_store.clone(),
            g.timeout,
            g.tcp.clone(),
            g.policy,
            g.nccl_opts,
            g.propagation.is_some(),
        )
        .await?;
        if let Some((dev, comm)) = split {
            group.inner.nccl.preset(dev, comm);
            group.init_device(dev as usize).await?;
        }
        Ok(Some(group))
    }

    fn ctx(&self, seq: u64, op: &'static str) -> OpContext {
        OpContext {
            rank: self.inner.rank,
            group: self.inner.name.clone(),
            seq,
            op,
        }
    }

    /// The error of a coalesced op given no buffer.
    pub(crate) fn invalid_coalesced(&self, op: Op1) -> WorkError {
        self.invalid(
            0,
            coalesced_op_name(op.comm_op()),
            "a coalesced op needs at least one buffer".into(),
        )
    }

    fn invalid(&self, seq: u64, op: &'static str, msg: String) -> WorkError {
        WorkError::InvalidArgument {
            ctx: self.ctx(seq, op),
            msg,
        }
    }

    /// Validates nothing; registers and submits `kind` in program order.
    fn submit<R: OpResult>(&self, kind: OpKind) -> Result<Work<R>, (WorkError, OpKind)> {
        let g = &self.inner;
        let mut counters = g.submit.lock().unwrap_or_else(|p| p.into_inner());
        let (work, req) = self.register(&mut counters, kind)?;
        g.backend.submit(req);
        drop(counters);
        Ok(Work::new(work))
    }

    /// Takes the next sequence number of `kind`, registers its work and
    /// builds its request (the caller holds the submission lock and hands
    /// the request to the backend before releasing it).
    fn register(
        &self,
        counters: &mut Counters,
        kind: OpKind,
    ) -> Result<(chorus_core::OpFuture<OpOutput>, OpRequest), (WorkError, OpKind)> {
        let g = &self.inner;
        let op = kind.name();
        let seq = match &kind {
            OpKind::Send { peer, .. } => counters.sent[*peer] + 1,
            OpKind::Recv { peer, .. } => counters.received[*peer] + 1,
            _ => counters.collective + 1,
        };
        let ctx = self.ctx(seq, op);
        let deadline = Instant::now() + self.timeout;
        let (work, completer) = match chorus_core::OpFuture::new_recorded(
            ctx.clone(),
            &g.registry,
            Some(deadline),
            kind.is_collective(),
            kind.meta(),
        ) {
            Ok(pair) => pair,
            Err(e) => return Err((e, kind)),
        };
        match &kind {
            OpKind::Send { peer, .. } => counters.sent[*peer] = seq,
            OpKind::Recv { peer, .. } => counters.received[*peer] = seq,
            _ => counters.collective = seq,
        }
        tracing::trace!(group = %g.name, seq, op, "submit");
        let req = OpRequest {
            ctx,
            kind,
            timeout: self.timeout,
            completer,
        };
        Ok((work, req))
    }

    /// Checks a root or peer rank.
    fn check_rank(&self, op: &'static str, what: &str, r: usize) -> Result<(), WorkError> {
        if r >= self.inner.size {
            return Err(self.invalid(
                0,
                op,
                format!(
                    "{what} {r} is not a rank of a group of size {}",
                    self.inner.size
                ),
            ));
        }
        Ok(())
    }
}

/// Unwraps the buffers of a refused op.
fn give_back<T: Element>(kind: OpKind) -> Vec<Vec<T>> {
    let bufs = kind.into_buffers();
    bufs.into_iter()
        .filter_map(|b| T::from_host(b).ok())
        .collect()
}

pub(crate) fn one<T: Element>(kind: OpKind) -> Vec<T> {
    give_back::<T>(kind).into_iter().next().unwrap_or_default()
}

pub(crate) fn two<T: Element>(kind: OpKind) -> (Vec<T>, Vec<T>) {
    let mut it = give_back::<T>(kind).into_iter();
    let a = it.next().unwrap_or_default();
    let b = it.next().unwrap_or_default();
    (a, b)
}

/// Validation of host ops: the checks that need no backend, then the op.
impl ProcessGroup {
    /// Checks a one-buffer host op and builds it; the buffer comes back on
    /// refusal.
    pub(crate) fn host_one<T: Element>(
        &self,
        buf: Vec<T>,
        op: Op1,
    ) -> Result<OpKind, Rejected<Vec<T>>> {
        let checked = match op {
            Op1::AllReduce(_) => Ok(()),
            Op1::Broadcast { root } | Op1::Reduce { root, .. } => {
                self.check_rank(op.name(), "root", root)
            }
            Op1::Send { peer } | Op1::Recv { peer } => self.check_peer(op.name(), peer),
        };
        if let Err(error) = checked {
            return Err(Rejected {
                error,
                buffers: buf,
            });
        }
        let buf = T::into_host(buf);
        Ok(match op {
            Op1::AllReduce(op) => OpKind::AllReduce { buf, op },
            Op1::Broadcast { root } => OpKind::Broadcast { buf, root },
            Op1::Reduce { root, op } => OpKind::Reduce { buf, root, op },
            Op1::Send { peer } => OpKind::Send { buf, peer },
            Op1::Recv { peer } => OpKind::Recv { buf, peer },
        })
    }

    /// Checks the lengths of a two-buffer host op and builds it; the
    /// buffers come back on refusal.
    pub(crate) fn host_two<T: Element>(
        &self,
        input: Vec<T>,
        output: Vec<T>,
        op: Op2,
    ) -> Result<OpKind, Rejected<InOut<T>>> {
        let n = self.inner.size;
        let (i, o) = (input.len(), output.len());
        let msg = match op {
            Op2::AllGather if Some(o) != i.checked_mul(n) => Some(format!(
                "output has {o} elements; expected size × input = {n} × {i} = {}",
                i.saturating_mul(n)
            )),
            Op2::ReduceScatter(_) if Some(i) != o.checked_mul(n) => Some(format!(
                "input has {i} elements; expected size × output = {n} × {o} = {}",
                o.saturating_mul(n)
            )),
            Op2::AllToAll if i != o || i % n != 0 => Some(format!(
                "input has {i} and output {o} elements; both must be the same multiple of the group size {n}"
            )),
            _ => None,
        };
        if let Some(msg) = msg {
            return Err(Rejected {
                error: self.invalid(0, op.name(), msg),
                buffers: (input, output),
            });
        }
        let (input, output) = (T::into_host(input), T::into_host(output));
        Ok(match op {
            Op2::AllGather => OpKind::AllGather { input, output },
            Op2::ReduceScatter(op) => OpKind::ReduceScatter { input, output, op },
            Op2::AllToAll => OpKind::AllToAll { input, output },
        })
    }

    /// Submits a checked host op whose result is `R`; a refusal gives the
    /// buffers back through `back`.
    pub(crate) fn host_submit<R: OpResult, B>(
        &self,
        kind: OpKind,
        back: fn(OpKind) -> B,
    ) -> Result<Work<R>, Rejected<B>> {
        self.submit(kind).map_err(|(error, kind)| Rejected {
            error,
            buffers: back(kind),
        })
    }

    /// Completes when every rank of the group has entered the barrier.
    pub fn barrier(&self) -> Result<Work<()>, Rejected<()>> {
        self.submit(OpKind::Barrier)
            .map_err(|(error, _)| Rejected { error, buffers: () })
    }

    fn check_peer(&self, op: &'static str, peer: usize) -> Result<(), WorkError> {
        self.check_rank(op, "peer", peer)?;
        if peer == self.inner.rank {
            return Err(self.invalid(0, op, format!("rank {peer} cannot {op} to itself")));
        }
        Ok(())
    }
}

/// The collectives. Each is submitted at once, in program order, and returns
/// a work that gives the buffers back. The buffer type picks the backend:
/// host `Vec<T>` runs on the TCP backend and returns a [`Work`]; device
/// buffers ([`DeviceBuffer<T>`](crate::DeviceBuffer),
/// [`RawDeviceBuffer`](crate::RawDeviceBuffer)) run on NCCL and return a
/// [`DeviceWork`] with explicit completion levels.
///
/// The first device op of a group on a device creates its NCCL communicator
/// (every rank must reach it) and blocks until it is ready, unless the
/// device was given at creation ([`GroupBuilder::device`]) or to
/// [`ProcessGroup::init_device`].
///
/// # Errors
///
/// Each returns [`Rejected`] (with the buffers, untouched) if the arguments
/// are invalid, the group has already failed, or the NCCL communicator
/// cannot be created; the work itself fails with a [`WorkError`] if the op
/// fails while running.
impl ProcessGroup {
    /// Reduces `buf` across all ranks, in place: every rank gets the result.
    pub fn all_reduce<B: OpBuffer>(&self, buf: B, op: ReduceOp) -> Result<B::Work, Rejected<B>> {
        B::submit1(self, buf, Op1::AllReduce(op))
    }

    /// Reduces each buffer of `bufs` across all ranks, as one op with one
    /// work (PyTorch's `all_reduce_coalesced`): every rank passes buffers of
    /// the same lengths and dtypes in the same order, and the work yields
    /// them back in that order. For many small buffers (gradient buckets)
    /// this costs one op where [`group`](Self::group) costs one work per
    /// buffer.
    ///
    /// * **NCCL** (device buffers): one `ncclGroupStart` … `ncclGroupEnd`
    ///   with one `ncclAllReduce` per buffer (NCCL fuses them into one
    ///   launch), one input-ready wait per producer stream and one end event;
    ///   the [`DeviceWork`] has the usual completion
    ///   levels.
    /// * **TCP** (host buffers): one all_reduce of the concatenation,
    ///   split back when it finishes ([`CoalescedWork`](crate::work::CoalescedWork)).
    ///
    /// The op takes one sequence number.
    ///
    /// # Errors
    ///
    /// No buffer, a buffer that does not fit, or a failed group: the
    /// buffers come back untouched in the [`Rejected`]. On NCCL, a failure
    /// inside the NCCL group (after part of it may have been enqueued)
    /// keeps the buffers until the stream has passed it, and the rejection
    /// holds none.
    ///
    /// # Cancel safety
    ///
    /// As for every op: dropping the work detaches it.
    pub fn all_reduce_coalesced<B: OpBuffer>(
        &self,
        bufs: Vec<B>,
        op: ReduceOp,
    ) -> Result<B::ManyWork, Rejected<Vec<B>>> {
        B::submit_many(self, bufs, Op1::AllReduce(op))
    }

    /// Copies `root`'s `buf` into every rank's `buf` (same length on every
    /// rank).
    pub fn broadcast<B: OpBuffer>(&self, buf: B, root: usize) -> Result<B::Work, Rejected<B>> {
        B::submit1(self, buf, Op1::Broadcast { root })
    }

    /// Reduces `buf` across all ranks into `root`'s `buf`; the other ranks'
    /// buffers come back unchanged (TCP) or unspecified (NCCL).
    pub fn reduce<B: OpBuffer>(
        &self,
        buf: B,
        root: usize,
        op: ReduceOp,
    ) -> Result<B::Work, Rejected<B>> {
        B::submit1(self, buf, Op1::Reduce { root, op })
    }

    /// Gathers every rank's `input` into `output` (length `size × input.len()`),
    /// in rank order. Yields `(input, output)`.
    pub fn all_gather<B: OpBuffer>(
        &self,
        input: B,
        output: B,
    ) -> Result<B::PairWork, Rejected<(B, B)>> {
        B::submit2(self, input, output, Op2::AllGather)
    }

    /// Reduces `input` (length `size × output.len()`) across ranks; rank r
    /// receives block r of the result in `output`. Yields `(input, output)`.
    pub fn reduce_scatter<B: OpBuffer>(
        &self,
        input: B,
        output: B,
        op: ReduceOp,
    ) -> Result<B::PairWork, Rejected<(B, B)>> {
        B::submit2(self, input, output, Op2::ReduceScatter(op))
    }

    /// Exchanges equal blocks: block j of this rank's `input` goes to rank j,
    /// and block i of `output` comes from rank i. Both have `size × k`
    /// elements. Yields `(input, output)`.
    pub fn all_to_all<B: OpBuffer>(
        &self,
        input: B,
        output: B,
    ) -> Result<B::PairWork, Rejected<(B, B)>> {
        B::submit2(self, input, output, Op2::AllToAll)
    }

    /// Sends `buf` to rank `dst`, which must post a matching
    /// [`recv`](Self::recv) of the same length. Yields `buf` back.
    pub fn send<B: OpBuffer>(&self, buf: B, dst: usize) -> Result<B::Work, Rejected<B>> {
        B::submit1(self, buf, Op1::Send { peer: dst })
    }

    /// Receives from rank `src` into `buf`, whose length must equal the
    /// sender's. Yields `buf` filled.
    pub fn recv<B: OpBuffer>(&self, buf: B, src: usize) -> Result<B::Work, Rejected<B>> {
        B::submit1(self, buf, Op1::Recv { peer: src })
    }

    /// Sends `send` to `peer` and receives `recv` from it, as one grouped
    /// NCCL op on the pair's point-to-point communicator (`peer` may be this
    /// rank). Yields `(send, recv)`.
    pub fn send_recv<T: NcclElement>(
        &self,
        send: DeviceBuffer<T>,
        recv: DeviceBuffer<T>,
        peer: usize,
    ) -> Result<
        DeviceWork<(DeviceBuffer<T>, DeviceBuffer<T>)>,
        Rejected<(DeviceBuffer<T>, DeviceBuffer<T>)>,
    > {
        crate::device::two(self.device_submit(CommOp::SendRecv { peer }, vec![send, recv]))
    }

    /// Creates the group's NCCL communicator on `device` now (eager init)
    /// instead of at the first device op. Every rank of the group must call
    /// it. A no-op if it exists.
    ///
    /// # Errors
    ///
    /// [`Error::Setup`] if NCCL or CUDA is unavailable or the communicator
    /// cannot be created.
    pub async fn init_device(&self, device: usize) -> Result<(), Error> {
        let dev = u32::try_from(device)
            .map_err(|_| Error::InvalidArgument(format!("device {device} is out of range")))?;
        self.inner
            .nccl
            .comm_async(CommKey::devices([dev]), dev)
            .await
            .map_err(|e| Error::Setup {
                group: self.inner.name.to_string(),
                rank: self.inner.rank,
                msg: e.to_string(),
            })?;
        Ok(())
    }

    /// How many NCCL communicators this group has created (each creation
    /// also emits a `tracing` event "creating NCCL communicator").
    pub fn nccl_comms_created(&self) -> u64 {
        self.inner.nccl.comms_created()
    }

    /// Registers and enqueues a device op in program order.
    pub(crate) fn device_submit<R: DeviceResult>(
        &self,
        op: CommOp,
        bufs: Vec<R::Buf>,
    ) -> Result<DeviceWork<R>, (WorkError, Vec<R::Buf>)> {
        self.device_submit_as(op, bufs, false)
    }

    /// Registers and enqueues a coalesced device op: the one-buffer `op` on
    /// each of `bufs` inside one NCCL group, as one op with one work.
    pub(crate) fn device_submit_coalesced<R: DeviceResult>(
        &self,
        op: CommOp,
        bufs: Vec<R::Buf>,
    ) -> Result<DeviceWork<R>, (WorkError, Vec<R::Buf>)> {
        self.device_submit_as(op, bufs, true)
    }

    fn device_submit_as<R: DeviceResult>(
        &self,
        op: CommOp,
        bufs: Vec<R::Buf>,
        coalesced: bool,
    ) -> Result<DeviceWork<R>, (WorkError, Vec<R::Buf>)> {
        let g = &self.inner;
        let name = if coalesced {
            coalesced_op_name(op)
        } else {
            device_op_name(op)
        };
        let Some(first) = bufs.first() else {
            return Err((self.invalid(0, name, "no buffer given".into()), bufs));
        };
        let dev = first.stream().device().ordinal() as u32;
        let count = if coalesced {
            bufs.iter().map(|b| b.count()).sum()
        } else {
            first.count()
        };
        let dtype = first.nccl_type().name();
        // Key and the op in the communicator's ranks.
        let (key, cop, peer) = match op {
            CommOp::Send { peer } | CommOp::Recv { peer } | CommOp::SendRecv { peer } => {
                if let Err(e) = self.check_rank(name, "peer", peer) {
                    return Err((e, bufs));
                }
                if peer == g.rank && !matches!(op, CommOp::SendRecv { .. }) {
                    return Err((
                        self.invalid(0, name, format!("rank {peer} cannot {name} to itself")),
                        bufs,
                    ));
                }
                let p = usize::from(peer > g.rank);
                let cop = match op {
                    CommOp::Send { .. } => CommOp::Send { peer: p },
                    CommOp::Recv { .. } => CommOp::Recv { peer: p },
                    _ => CommOp::SendRecv { peer: p },
                };
                (Some(CommKey::pair(g.rank, peer)), cop, Some(peer))
            }
            CommOp::Broadcast { root } | CommOp::Reduce { root, .. } => {
                if let Err(e) = self.check_rank(name, "root", root) {
                    return Err((e, bufs));
                }
                (None, op, Some(root))
            }
            _ => (None, op, None),
        };
        let prof = chorus_core::profile::on();
        if prof {
            chorus_core::profile::start();
        }
        let found = match key {
            Some(k) => g.nccl.comm(k, dev),
            None => g.nccl.collective(dev),
        };
        let comm = match found {
            Ok(c) => c,
            Err(e) => return Err((lookup_error(self.ctx(0, name), &e), bufs)),
        };
        if prof {
            chorus_core::profile::stamp(0);
        }
        // The op's end event first: the registry entry asks it before the
        // watchdog times the op out (the work completes lazily).
        let end = match comm.reserve_end_event() {
            Ok(e) => e,
            Err(e) => return Err((comm_error(&self.ctx(0, name), e.into()), bufs)),
        };
        if prof {
            chorus_core::profile::stamp(1);
        }
        let mut counters = g.submit.lock().unwrap_or_else(|p| p.into_inner());
        let seq = counters.next_device(op);
        let ctx = self.ctx(seq, name);
        let meta = chorus_core::flight_recorder::OpMeta {
            dtype: Some(std::borrow::Cow::Borrowed(dtype)),
            count: count as u64,
            peer,
        };
        let probe: std::sync::Arc<dyn chorus_core::FinishedProbe> = end.clone();
        if prof {
            chorus_core::profile::stamp(2);
        }
        let (work, completer) = match self.register_device::<R>(ctx, op, meta, Some(probe)) {
            Ok(pair) => pair,
            Err(e) => return Err((e, bufs)),
        };
        let submitted = if coalesced {
            comm.submit_coalesced_with_end(cop, bufs, Some(end))
        } else {
            comm.submit_with_end(cop, bufs, Some(end))
        };
        match submitted {
            Ok(inflight) => {
                if prof {
                    chorus_core::profile::stamp(7);
                }
                counters.bump_device(op, seq);
                drop(counters);
                // Nothing goes to the completion reactor here: the work
                // holds the op until it is polled, dropped or taken back.
                let work = DeviceWork::held(work, inflight, completer);
                if prof {
                    chorus_core::profile::stamp(8);
                    chorus_core::profile::finish();
                }
                Ok(work)
            }
            Err((e, bufs)) => {
                drop(counters);
                let err = comm_error(work.context(), e);
                completer.complete(Err(err.clone()));
                drop(work);
                Err((err, bufs))
            }
        }
    }
}

impl Counters {
    /// The sequence number the device op `op` takes next (`op` names group
    /// ranks).
    fn next_device(&self, op: CommOp) -> u64 {
        match op {
            CommOp::Send { peer } => self.sent[peer] + 1,
            CommOp::Recv { peer } => self.received[peer] + 1,
            CommOp::SendRecv { peer } => self.sent[peer].max(self.received[peer]) + 1,
            _ => self.collective + 1,
        }
    }

    /// Records that the device op `op` took `seq`.
    fn bump_device(&mut self, op: CommOp, seq: u64) {
        match op {
            CommOp::Send { peer } => self.sent[peer] = seq,
            CommOp::Recv { peer } => self.received[peer] = seq,
            CommOp::SendRecv { peer } => {
                self.sent[peer] = seq;
                self.received[peer] = seq;
            }
            _ => self.collective = seq,
        }
    }
}

impl ProcessGroup {
    /// Registers the work of a device op (flight recorder, deadline),
    /// recorded as started: it is enqueued right after.
    fn register_device<R: DeviceResult>(
        &self,
        ctx: OpContext,
        op: CommOp,
        meta: chorus_core::flight_recorder::OpMeta,
        probe: Option<std::sync::Arc<dyn chorus_core::FinishedProbe>>,
    ) -> Result<DevicePair<R>, WorkError> {
        let collective = !matches!(
            op,
            CommOp::Send { .. } | CommOp::Recv { .. } | CommOp::SendRecv { .. }
        );
        let now = Instant::now();
        if chorus_core::profile::on() {
            chorus_core::profile::stamp(3);
        }
        chorus_core::OpFuture::new_started(
            ctx,
            &self.inner.registry,
            now,
            Some(self.timeout),
            collective,
            meta,
            probe,
        )
    }
}

/// The registered work of a device op and its completer.
type DevicePair<R> = (
    chorus_core::OpFuture<Option<Vec<<R as DeviceResult>::Buf>>>,
    chorus_core::Completer<Option<Vec<<R as DeviceResult>::Buf>>>,
);

/// Hands an enqueued op of a group to the completion reactor through `set`
/// (one reactor entry for the group's ops, which share one end event).
fn watch_device<B: DeviceMem>(
    inflight: chorus_gpu::nccl::InFlight<B>,
    completer: crate::device::DeviceCompleter<B>,
    set: &mut chorus_gpu::nccl::WatchSet,
) -> chorus_gpu::nccl::Watched<B> {
    inflight.watch_in(crate::device::finisher(completer), set)
}

/// A refused or failed enqueue as the op's error.
fn comm_error(ctx: &OpContext, e: NcclCommError) -> WorkError {
    match e {
        NcclCommError::InvalidArgument(msg) => WorkError::InvalidArgument {
            ctx: ctx.clone(),
            msg,
        },
        // Refused before anything ran: the group stays healthy.
        e @ NcclCommError::Capturing => WorkError::InvalidArgument {
            ctx: ctx.clone(),
            msg: e.to_string(),
        },
        NcclCommError::Aborted(reason) => WorkError::Aborted {
            ctx: ctx.clone(),
            reason,
        },
        other => WorkError::Backend {
            ctx: ctx.clone(),
            msg: other.to_string(),
        },
    }
}

/// A communicator that could not be had, as the op's error.
fn lookup_error(
    ctx: OpContext,
    e: &chorus_core::comm_cache::CommCacheError<nccl::NcclInitError>,
) -> WorkError {
    if e.is_aborted() {
        WorkError::Aborted {
            ctx,
            reason: e.to_string(),
        }
    } else {
        WorkError::Backend {
            ctx,
            msg: e.to_string(),
        }
    }
}

/// The name of a coalesced device op (flight recorder, errors).
fn coalesced_op_name(op: CommOp) -> &'static str {
    match op {
        CommOp::AllReduce(_) => "all_reduce_coalesced",
        CommOp::Broadcast { .. } => "broadcast_coalesced",
        CommOp::Reduce { .. } => "reduce_coalesced",
        _ => "coalesced",
    }
}

fn device_op_name(op: CommOp) -> &'static str {
    match op {
        CommOp::AllReduce(_) => "all_reduce",
        CommOp::Broadcast { .. } => "broadcast",
        CommOp::Reduce { .. } => "reduce",
        CommOp::AllGather => "all_gather",
        CommOp::ReduceScatter(_) => "reduce_scatter",
        CommOp::AllToAll => "all_to_all",
        CommOp::Send { .. } => "send",
        CommOp::Recv { .. } => "recv",
        CommOp::SendRecv { .. } => "send_recv",
    }
}
