//! [`ProcessGroup`]: the ranks of a job (or a subgroup of them) and the
//! collectives they run together.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chorus_runtime::flight_recorder::{self, FlightRecorder, OpRecord};
use chorus_runtime::store::{PrefixStore, Store};
use chorus_runtime::watchdog::{self, ErrorPolicy, WatchedGroup};
use chorus_runtime::{OpContext, Registry, WorkError};

use crate::backend::tcp::{TcpBackend, TcpOptions};
use crate::backend::{Backend, OpKind, OpRequest};
use crate::dtype::{Element, HostBuffer, ReduceOp};
use crate::error::{Error, Rejected};
use crate::work::{OpResult, Work};

/// Default op timeout of a group (c10d's NCCL default is 10 minutes; chorus
/// takes 5 so hangs surface sooner).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// Store prefix under which every group keeps its keys.
const GROUP_PREFIX: &str = "chorus/group";

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
    /// Submission lock and sequence counters: taking a sequence number and
    /// handing the op to the backend happen under one lock, so program order
    /// is submission order even when several threads submit.
    submit: Mutex<Counters>,
    subgroups: AtomicU64,
    tcp: TcpOptions,
    timeout: Duration,
    policy: ErrorPolicy,
    /// The job's rendezvous (world group made by `init_from_env`), kept
    /// until [`ProcessGroup::shutdown`].
    rendezvous: Mutex<Option<chorus_runtime::rendezvous::Rendezvous>>,
}

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
}

impl GroupBuilder {
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
        let rdzv = chorus_runtime::rendezvous::init_from_env().await?;
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
        ProcessGroup::connect(
            self.name.into(),
            self.rank,
            members,
            store,
            self.timeout,
            self.tcp,
            self.policy,
        )
        .await
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

    /// Leaves the job at its end: drops this rank's part of the rendezvous
    /// (rank 0 waits for every rank to leave, then stops the store server).
    /// Groups made with [`GroupBuilder::build`] have nothing to leave.
    ///
    /// # Errors
    ///
    /// [`Error::Rendezvous`] if some ranks did not leave in time (rank 0).
    pub async fn shutdown(&self) -> Result<(), Error> {
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
        }
    }

    async fn connect(
        name: Arc<str>,
        rank: usize,
        members: Vec<usize>,
        root_store: Arc<dyn Store>,
        timeout: Duration,
        tcp: TcpOptions,
        policy: ErrorPolicy,
    ) -> Result<ProcessGroup, Error> {
        let size = members.len();
        let store: Arc<dyn Store> = Arc::new(PrefixStore::new(
            format!("{GROUP_PREFIX}/{name}"),
            root_store.clone(),
        ));
        let backend: Arc<dyn Backend> =
            TcpBackend::connect(store, rank, size, name.clone(), tcp.clone()).await?;
        let recorder = Arc::new(FlightRecorder::new(flight_recorder::DEFAULT_CAPACITY));
        let registry = Arc::new(Registry::with_recorder(recorder));
        let hook_backend = backend.clone();
        registry.set_abort_hook(move |cause| hook_backend.abort(cause));
        watchdog::watch(WatchedGroup {
            name: name.clone(),
            rank,
            size,
            registry: Arc::downgrade(&registry),
            policy,
            check: None,
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
                submit: Mutex::new(Counters {
                    collective: 0,
                    sent: vec![0; size],
                    received: vec![0; size],
                }),
                subgroups: AtomicU64::new(0),
                tcp,
                timeout,
                policy,
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
        let Some(sub_rank) = ranks.iter().position(|&r| r == me) else {
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
        )
        .await?;
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

    fn invalid(&self, seq: u64, op: &'static str, msg: String) -> WorkError {
        WorkError::InvalidArgument {
            ctx: self.ctx(seq, op),
            msg,
        }
    }

    /// Validates nothing; registers and submits `kind` in program order.
    fn submit<R: OpResult>(&self, kind: OpKind) -> Result<Work<R>, (WorkError, OpKind)> {
        let g = &self.inner;
        let op = kind.name();
        let mut counters = g.submit.lock().unwrap_or_else(|p| p.into_inner());
        let seq = match &kind {
            OpKind::Send { peer, .. } => counters.sent[*peer] + 1,
            OpKind::Recv { peer, .. } => counters.received[*peer] + 1,
            _ => counters.collective + 1,
        };
        let ctx = self.ctx(seq, op);
        let deadline = Instant::now() + self.timeout;
        let (work, completer) = match chorus_runtime::Work::new_recorded(
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
        g.backend.submit(OpRequest {
            ctx,
            kind,
            timeout: self.timeout,
            completer,
        });
        drop(counters);
        Ok(Work::new(work))
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
    let bufs: Vec<HostBuffer> = match kind {
        OpKind::AllReduce { buf, .. }
        | OpKind::Broadcast { buf, .. }
        | OpKind::Reduce { buf, .. }
        | OpKind::Send { buf, .. }
        | OpKind::Recv { buf, .. } => vec![buf],
        OpKind::AllGather { input, output }
        | OpKind::ReduceScatter { input, output, .. }
        | OpKind::AllToAll { input, output } => vec![input, output],
        OpKind::Barrier => vec![],
    };
    bufs.into_iter()
        .filter_map(|b| T::from_host(b).ok())
        .collect()
}

fn one<T: Element>(kind: OpKind) -> Vec<T> {
    give_back::<T>(kind).into_iter().next().unwrap_or_default()
}

fn two<T: Element>(kind: OpKind) -> (Vec<T>, Vec<T>) {
    let mut it = give_back::<T>(kind).into_iter();
    let a = it.next().unwrap_or_default();
    let b = it.next().unwrap_or_default();
    (a, b)
}

/// The collectives. Each is submitted at once; the returned [`Work`] yields
/// the buffers back.
///
/// # Errors
///
/// Each returns [`Rejected`] (with the buffers, untouched) if the arguments
/// are invalid or the group has already failed; the work itself fails with a
/// [`WorkError`] if the op fails while running.
impl ProcessGroup {
    /// Reduces `buf` across all ranks, in place: every rank gets the result.
    pub fn all_reduce<T: Element>(
        &self,
        buf: Vec<T>,
        op: ReduceOp,
    ) -> Result<Work<Vec<T>>, Rejected<Vec<T>>> {
        let kind = OpKind::AllReduce {
            buf: T::into_host(buf),
            op,
        };
        self.submit(kind).map_err(|(error, kind)| Rejected {
            error,
            buffers: one(kind),
        })
    }

    /// Copies `root`'s `buf` into every rank's `buf` (same length on every
    /// rank).
    pub fn broadcast<T: Element>(
        &self,
        buf: Vec<T>,
        root: usize,
    ) -> Result<Work<Vec<T>>, Rejected<Vec<T>>> {
        if let Err(error) = self.check_rank("broadcast", "root", root) {
            return Err(Rejected {
                error,
                buffers: buf,
            });
        }
        let kind = OpKind::Broadcast {
            buf: T::into_host(buf),
            root,
        };
        self.submit(kind).map_err(|(error, kind)| Rejected {
            error,
            buffers: one(kind),
        })
    }

    /// Reduces `buf` across all ranks into `root`'s `buf`; the other ranks'
    /// buffers come back unchanged.
    pub fn reduce<T: Element>(
        &self,
        buf: Vec<T>,
        root: usize,
        op: ReduceOp,
    ) -> Result<Work<Vec<T>>, Rejected<Vec<T>>> {
        if let Err(error) = self.check_rank("reduce", "root", root) {
            return Err(Rejected {
                error,
                buffers: buf,
            });
        }
        let kind = OpKind::Reduce {
            buf: T::into_host(buf),
            root,
            op,
        };
        self.submit(kind).map_err(|(error, kind)| Rejected {
            error,
            buffers: one(kind),
        })
    }

    /// Gathers every rank's `input` into `output` (length `size × input.len()`),
    /// in rank order. Yields `(input, output)`.
    pub fn all_gather<T: Element>(
        &self,
        input: Vec<T>,
        output: Vec<T>,
    ) -> Result<Work<(Vec<T>, Vec<T>)>, Rejected<(Vec<T>, Vec<T>)>> {
        let n = self.inner.size;
        if Some(output.len()) != input.len().checked_mul(n) {
            let error = self.invalid(
                0,
                "all_gather",
                format!(
                    "output has {} elements; expected size × input = {n} × {} = {}",
                    output.len(),
                    input.len(),
                    input.len().saturating_mul(n)
                ),
            );
            return Err(Rejected {
                error,
                buffers: (input, output),
            });
        }
        let kind = OpKind::AllGather {
            input: T::into_host(input),
            output: T::into_host(output),
        };
        self.submit(kind).map_err(|(error, kind)| Rejected {
            error,
            buffers: two(kind),
        })
    }

    /// Reduces `input` (length `size × output.len()`) across ranks; rank r
    /// receives block r of the result in `output`. Yields `(input, output)`.
    pub fn reduce_scatter<T: Element>(
        &self,
        input: Vec<T>,
        output: Vec<T>,
        op: ReduceOp,
    ) -> Result<Work<(Vec<T>, Vec<T>)>, Rejected<(Vec<T>, Vec<T>)>> {
        let n = self.inner.size;
        if Some(input.len()) != output.len().checked_mul(n) {
            let error = self.invalid(
                0,
                "reduce_scatter",
                format!(
                    "input has {} elements; expected size × output = {n} × {} = {}",
                    input.len(),
                    output.len(),
                    output.len().saturating_mul(n)
                ),
            );
            return Err(Rejected {
                error,
                buffers: (input, output),
            });
        }
        let kind = OpKind::ReduceScatter {
            input: T::into_host(input),
            output: T::into_host(output),
            op,
        };
        self.submit(kind).map_err(|(error, kind)| Rejected {
            error,
            buffers: two(kind),
        })
    }

    /// Exchanges equal blocks: block j of this rank's `input` goes to rank j,
    /// and block i of `output` comes from rank i. Both have `size × k`
    /// elements. Yields `(input, output)`.
    pub fn all_to_all<T: Element>(
        &self,
        input: Vec<T>,
        output: Vec<T>,
    ) -> Result<Work<(Vec<T>, Vec<T>)>, Rejected<(Vec<T>, Vec<T>)>> {
        let n = self.inner.size;
        if input.len() != output.len() || input.len() % n != 0 {
            let error = self.invalid(
                0,
                "all_to_all",
                format!(
                    "input has {} and output {} elements; both must be the same multiple of the group size {n}",
                    input.len(),
                    output.len()
                ),
            );
            return Err(Rejected {
                error,
                buffers: (input, output),
            });
        }
        let kind = OpKind::AllToAll {
            input: T::into_host(input),
            output: T::into_host(output),
        };
        self.submit(kind).map_err(|(error, kind)| Rejected {
            error,
            buffers: two(kind),
        })
    }

    /// Sends `buf` to rank `dst`, which must post a matching
    /// [`recv`](Self::recv) of the same length. Yields `buf` back.
    pub fn send<T: Element>(
        &self,
        buf: Vec<T>,
        dst: usize,
    ) -> Result<Work<Vec<T>>, Rejected<Vec<T>>> {
        if let Err(error) = self.check_peer("send", dst) {
            return Err(Rejected {
                error,
                buffers: buf,
            });
        }
        let kind = OpKind::Send {
            buf: T::into_host(buf),
            peer: dst,
        };
        self.submit(kind).map_err(|(error, kind)| Rejected {
            error,
            buffers: one(kind),
        })
    }

    /// Receives from rank `src` into `buf`, whose length must equal the
    /// sender's. Yields `buf` filled.
    pub fn recv<T: Element>(
        &self,
        buf: Vec<T>,
        src: usize,
    ) -> Result<Work<Vec<T>>, Rejected<Vec<T>>> {
        if let Err(error) = self.check_peer("recv", src) {
            return Err(Rejected {
                error,
                buffers: buf,
            });
        }
        let kind = OpKind::Recv {
            buf: T::into_host(buf),
            peer: src,
        };
        self.submit(kind).map_err(|(error, kind)| Rejected {
            error,
            buffers: one(kind),
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
