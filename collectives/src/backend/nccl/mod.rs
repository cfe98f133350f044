//! The NCCL backend: device buffers of a [`ProcessGroup`](crate::ProcessGroup)
//! go here, host vectors to the TCP backend (like c10d's
//! `"cpu:gloo,cuda:nccl"`).
//!
//! * **Communicator cache** (DESIGN §3): one [`CommCache`] per group. Key:
//!   `CommKey::devices([dev])` for collectives (this rank's device), the
//!   sorted rank pair for single point-to-point ops. Lazy, single-flight;
//!   the unique id goes through the group's store under the key the cache
//!   chooses (`comm/{n}` for collectives, `p2p/{lo}:{hi}` for pairs).
//! * **Non-blocking init**: `ncclCommInitRankConfig` with `blocking = 0`,
//!   awaited as a future on chorus's runtime that re-polls
//!   `ncclCommGetAsyncError` on a timer (no thread spins on it).
//! * **Subgroups** split from the parent's communicator (`ncclCommSplit`)
//!   when the parent has one; ranks outside take part with no colour.
//! * **Counting**: [`NcclBackend::comms_created`] and a `tracing` event
//!   (`target: "chorus::nccl"`, "creating NCCL communicator") per creation.
//! * **Errors**: the watchdog polls `ncclCommGetAsyncError` on every live
//!   communicator ([`NcclBackend::async_error`]); abort marks every cached
//!   communicator aborted (it stays cached) and calls `ncclCommAbort`.

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use chorus_core::comm_cache::{CommCache, CommCacheError, CommFactory, CommKey};
use chorus_gpu::cuda::{Device, StreamPriority};
use chorus_gpu::nccl::{self as rnccl, CommOptions, Communicator, NcclCommError, PendingComm};
use chorus_store::Store;

/// Settings of a group's NCCL backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NcclOptions {
    /// Priority of each communicator's dedicated stream (default: the
    /// device's normal priority; `Highest` keeps collectives from being
    /// starved by compute kernels).
    pub stream_priority: StreamPriority,
    /// Run ops on a blocking twin of each group communicator (default true;
    /// `CHORUS_NCCL_BLOCKING=0` turns it off). Communicators are created
    /// non-blocking, so that initialization has a timeout and can be
    /// aborted; ops on a non-blocking communicator of several ranks return
    /// `ncclInProgress` and cost 60–190 µs of polling each (2× H200), so
    /// after initialization chorus splits a blocking twin (same ranks) and
    /// issues ops there. A twin that cannot be made within the group's
    /// timeout fails the initialization. Subgroup communicators split by
    /// `new_group` stay non-blocking.
    pub blocking_ops: bool,
}

impl Default for NcclOptions {
    fn default() -> Self {
        NcclOptions {
            stream_priority: StreamPriority::default(),
            blocking_ops: std::env::var("CHORUS_NCCL_BLOCKING").map_or(true, |v| v != "0"),
        }
    }
}

/// Why a communicator could not be created.
#[derive(Clone, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NcclInitError {
    /// NCCL or CUDA refused.
    #[error(transparent)]
    Nccl(#[from] NcclCommError),
    /// The unique id could not be exchanged.
    #[error("exchanging the NCCL unique id through the store failed: {0}")]
    Store(String),
    /// The initialization did not finish in time.
    #[error("NCCL communicator initialization did not finish within {0:?} (are all ranks calling the same op?)")]
    Timeout(Duration),
    /// No device is known for a point-to-point key.
    #[error("no device is known for the point-to-point communicator {0}")]
    NoDevice(String),
}

type InitFuture = Pin<Box<dyn Future<Output = Result<Communicator, NcclInitError>> + Send>>;

/// Creates the NCCL communicators of one group.
pub(crate) struct NcclFactory {
    group: Arc<str>,
    rank: usize,
    size: usize,
    store: Arc<dyn Store>,
    opts: NcclOptions,
    timeout: Duration,
    /// The device each pending key is for (pair keys do not name one).
    devices: Mutex<BTreeMap<CommKey, u32>>,
    /// Communicators split from the parent at subgroup creation, taken by
    /// the first `create` of their key.
    preset: Mutex<BTreeMap<CommKey, Communicator>>,
}

impl fmt::Debug for NcclFactory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NcclFactory")
            .field("group", &self.group)
            .field("rank", &self.rank)
            .finish()
    }
}

/// A delay that works under any executor: a sleep on chorus's runtime.
async fn pause(d: Duration) {
    if let Ok(h) = chorus_store::rt::handle() {
        let _ = h.spawn(tokio::time::sleep(d)).await;
    } else {
        std::thread::sleep(d);
    }
}

impl CommFactory for NcclFactory {
    type Comm = Communicator;
    type Error = NcclInitError;
    type Init = InitFuture;

    fn create(&self, key: &CommKey, store_key: String) -> InitFuture {
        tracing::info!(target: "chorus::nccl", group = %self.group, rank = self.rank, key = %key, store_key = %store_key, "creating NCCL communicator");
        if let Some(c) = self
            .preset
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key)
        {
            return Box::pin(async move { Ok(c) });
        }
        let (nranks, me) = match key {
            CommKey::Devices(_) => (self.size, self.rank),
            CommKey::Pair { lo, hi } if lo == hi => (1, 0),
            CommKey::Pair { lo, .. } => (2, usize::from(self.rank != *lo)),
        };
        let dev = match key {
            CommKey::Devices(d) if d.len() == 1 => Some(d[0]),
            _ => self
                .devices
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(key)
                .copied(),
        };
        let store = self.store.clone();
        let opts = CommOptions {
            priority: self.opts.stream_priority,
        };
        let timeout = self.timeout;
        let blocking_ops = self.opts.blocking_ops;
        let key_text = key.to_string();
        let work = async move {
            let dev = dev.ok_or(NcclInitError::NoDevice(key_text))?;
            let device = Device::get(dev as usize).map_err(NcclCommError::from)?;
            let id = if me == 0 {
                let id = rnccl::unique_id()?;
                store
                    .set(&store_key, &id)
                    .await
                    .map_err(|e| NcclInitError::Store(e.to_string()))?;
                id
            } else {
                let v = store
                    .get(&store_key, timeout)
                    .await
                    .map_err(|e| NcclInitError::Store(e.to_string()))?;
                <[u8; 128]>::try_from(v.as_slice()).map_err(|_| {
                    NcclInitError::Store(format!(
                        "store key '{store_key}' holds {} bytes, not a 128-byte NCCL unique id",
                        v.len()
                    ))
                })?
            };
            let mut pending = PendingComm::init(&device, nranks, me, &id, opts)?;
            let comm = await_pending(&mut pending, timeout).await?;
            if blocking_ops {
                blocking_twin(comm, opts, timeout).await
            } else {
                Ok(comm)
            }
        };
        Box::pin(async move {
            match chorus_store::rt::run(work).await {
                Ok(r) => r,
                Err(e) => Err(NcclInitError::Store(e)),
            }
        })
    }
}

/// Splits a blocking twin of the fresh non-blocking `comm` (see
/// [`NcclOptions::blocking_ops`]).
async fn blocking_twin(
    comm: Communicator,
    opts: CommOptions,
    timeout: Duration,
) -> Result<Communicator, NcclInitError> {
    let parent = Arc::new(comm);
    let p = parent.clone();
    off_thread(&parent, timeout, move || p.split_blocking(opts)).await
}

/// Runs `f`, a call that may block until every rank made it (a split of a
/// blocking communicator), on a thread of its own; after `timeout` aborts
/// `parent`, which ends that wait, and fails.
async fn off_thread<T: Send + 'static>(
    parent: &Arc<Communicator>,
    timeout: Duration,
    f: impl FnOnce() -> Result<T, NcclCommError> + Send + 'static,
) -> Result<T, NcclInitError> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("chorus-nccl-split".into())
        .spawn(move || {
            let _ = tx.send(f());
        })
        .map_err(|e| {
            NcclInitError::Nccl(NcclCommError::InvalidArgument(format!(
                "cannot start the thread of a communicator split: {e}"
            )))
        })?;
    let res = poll_backoff(timeout, move || match rx.try_recv() {
        Ok(r) => Ok(Some(r.map_err(NcclInitError::from))),
        Err(std::sync::mpsc::TryRecvError::Disconnected) => {
            Err(NcclInitError::Nccl(NcclCommError::InvalidArgument(
                "the communicator split's thread ended without a result".into(),
            )))
        }
        Err(std::sync::mpsc::TryRecvError::Empty) => Ok(None),
    })
    .await;
    if matches!(res, Err(NcclInitError::Timeout(_))) {
        parent.abort("a communicator split did not finish in time");
    }
    res?
}

/// Calls `poll` until it yields a value, pausing on a timer between calls
/// (50 µs doubling to 5 ms); [`NcclInitError::Timeout`] after `timeout`.
async fn poll_backoff<T>(
    timeout: Duration,
    mut poll: impl FnMut() -> Result<Option<T>, NcclInitError>,
) -> Result<T, NcclInitError> {
    let t0 = Instant::now();
    let mut d = Duration::from_micros(50);
    loop {
        if let Some(v) = poll()? {
            return Ok(v);
        }
        if t0.elapsed() > timeout {
            return Err(NcclInitError::Timeout(timeout));
        }
        pause(d).await;
        d = (d * 2).min(Duration::from_millis(5));
    }
}

/// Polls a pending init or split until it finishes, pausing on a timer
/// between polls (50 µs doubling to 5 ms).
async fn await_pending(
    pending: &mut PendingComm,
    timeout: Duration,
) -> Result<Communicator, NcclInitError> {
    match await_pending_split(pending, timeout).await? {
        Some(c) => Ok(c),
        None => Err(NcclInitError::Nccl(NcclCommError::InvalidArgument(
            "NCCL returned no communicator".into(),
        ))),
    }
}

async fn await_pending_split(
    pending: &mut PendingComm,
    timeout: Duration,
) -> Result<Option<Communicator>, NcclInitError> {
    // The limit counts from the start of the init or split.
    let left = timeout.saturating_sub(pending.elapsed());
    poll_backoff(left, || pending.poll().map_err(NcclInitError::from)).await
}

/// The NCCL side of one group.
pub(crate) struct NcclBackend {
    cache: CommCache<NcclFactory>,
    /// Communicators handed out so far, for the watchdog and subgroups.
    live: Mutex<Vec<(CommKey, Weak<Communicator>)>>,
    seen: AtomicU64,
    /// Collective communicators by device, in front of the cache.
    hot: std::sync::RwLock<Vec<(u32, Arc<Communicator>)>>,
}

impl fmt::Debug for NcclBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NcclBackend")
            .field("group", &self.cache.group())
            .field("created", &self.cache.created())
            .finish()
    }
}

impl NcclBackend {
    /// A backend that creates nothing until first use.
    pub(crate) fn new(
        group: Arc<str>,
        rank: usize,
        size: usize,
        store: Arc<dyn Store>,
        opts: NcclOptions,
        timeout: Duration,
    ) -> NcclBackend {
        let factory = NcclFactory {
            group: group.clone(),
            rank,
            size,
            store,
            opts,
            timeout,
            devices: Mutex::new(BTreeMap::new()),
            preset: Mutex::new(BTreeMap::new()),
        };
        NcclBackend {
            cache: CommCache::new(group, factory),
            live: Mutex::new(Vec::new()),
            seen: AtomicU64::new(0),
            hot: std::sync::RwLock::new(Vec::new()),
        }
    }

    /// How many communicators this group created (successful or not).
    pub(crate) fn comms_created(&self) -> u64 {
        self.cache.created()
    }

    /// The communicator for `key` on device `dev`: from the cache, or
    /// created now (blocking the caller until every rank has joined; lazy
    /// init as in c10d). Concurrent callers share one initialization.
    pub(crate) fn comm(
        &self,
        key: CommKey,
        dev: u32,
    ) -> Result<Arc<Communicator>, CommCacheError<NcclInitError>> {
        if key.is_p2p() {
            // Pair keys do not name the device; the factory reads it here.
            self.cache
                .factory()
                .devices
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(key.clone(), dev);
        }
        let mut fut = self.cache.get(key.clone());
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let r = match Pin::new(&mut fut).poll(&mut cx) {
            Poll::Ready(r) => r,
            // Not cached: wait for the initialization (the first poll
            // started it; this call resumes it).
            Poll::Pending => futures::executor::block_on(fut),
        };
        let comm = r?;
        if self.seen.load(Ordering::Acquire) != self.cache.created() {
            self.note(&key, &comm);
        }
        Ok(comm)
    }

    /// The collective communicator on `dev`: from a small read-mostly list
    /// in front of the cache (no key allocation, no cache lock on the hot
    /// path), else through [`comm`](Self::comm). An aborted communicator is
    /// returned as it is; submitting to it fails with `Aborted`.
    pub(crate) fn collective(
        &self,
        dev: u32,
    ) -> Result<Arc<Communicator>, CommCacheError<NcclInitError>> {
        {
            let hot = self.hot.read().unwrap_or_else(|p| p.into_inner());
            if let Some((_, c)) = hot.iter().find(|(d, _)| *d == dev) {
                return Ok(c.clone());
            }
        }
        let c = self.comm(CommKey::devices([dev]), dev)?;
        let mut hot = self.hot.write().unwrap_or_else(|p| p.into_inner());
        if !hot.iter().any(|(d, _)| *d == dev) {
            hot.push((dev, c.clone()));
        }
        Ok(c)
    }

    /// The same as [`comm`](Self::comm), awaited (eager init).
    pub(crate) async fn comm_async(
        &self,
        key: CommKey,
        dev: u32,
    ) -> Result<Arc<Communicator>, CommCacheError<NcclInitError>> {
        self.cache
            .factory()
            .devices
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key.clone(), dev);
        let comm = self.cache.get(key.clone()).await?;
        self.note(&key, &comm);
        Ok(comm)
    }

    fn note(&self, key: &CommKey, comm: &Arc<Communicator>) {
        let mut live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        if !live.iter().any(|(_, w)| w.as_ptr() == Arc::as_ptr(comm)) {
            live.push((key.clone(), Arc::downgrade(comm)));
        }
        self.seen.store(self.cache.created(), Ordering::Release);
    }

    /// The live collective communicator, if one was created (for subgroup
    /// splits).
    pub(crate) fn collective_comm(&self) -> Option<Arc<Communicator>> {
        let live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        live.iter()
            .filter(|(k, _)| !k.is_p2p())
            .filter_map(|(_, w)| w.upgrade())
            .find(|c| !c.is_aborted())
    }

    /// Installs a communicator split from the parent as this group's
    /// collective communicator for `dev`; the first op (or eager init) takes
    /// it instead of creating one.
    pub(crate) fn preset(&self, dev: u32, comm: Communicator) {
        self.cache
            .factory()
            .preset
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(CommKey::devices([dev]), comm);
    }

    /// The watchdog's check: the first asynchronous error of a live
    /// communicator.
    pub(crate) fn async_error(&self) -> Option<String> {
        let live: Vec<Arc<Communicator>> = self
            .live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter_map(|(_, w)| w.upgrade())
            .collect();
        for c in live {
            if c.is_aborted() {
                continue;
            }
            if let Err(e) = c.async_state() {
                return Some(format!(
                    "NCCL communicator on device {}: {e}",
                    c.device().ordinal()
                ));
            }
        }
        None
    }

    /// Aborts every communicator of the group; they stay cached, marked
    /// aborted.
    pub(crate) fn abort(&self, reason: &str) {
        for c in self.cache.abort(reason) {
            c.abort(reason);
        }
        // Communicators handed out but not (yet) in the cache.
        for (_, w) in self.live.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            if let Some(c) = w.upgrade() {
                c.abort(reason);
            }
        }
    }
}

/// Splits `parent` for a subgroup: every rank of the parent group calls it;
/// members (`color` `Some`) get the new communicator.
pub(crate) async fn split(
    parent: Arc<Communicator>,
    member: Option<usize>,
    sub_size: usize,
    opts: NcclOptions,
    timeout: Duration,
) -> Result<Option<Communicator>, NcclInitError> {
    let opts = CommOptions {
        priority: opts.stream_priority,
    };
    let rank = parent.rank();
    let t0 = Instant::now();
    let work = async move {
        // A blocking parent (a blocking twin) blocks the split call until
        // every rank made it: on a thread of its own, under the timeout.
        let p2 = parent.clone();
        let mut p = off_thread(&parent, timeout, move || {
            PendingComm::split(
                &p2,
                member.map(|_| 0),
                member.unwrap_or(rank),
                sub_size,
                member.unwrap_or(0),
                opts,
            )
        })
        .await?;
        await_pending_split(&mut p, timeout).await
    };
    let r = chorus_store::rt::run(work)
        .await
        .map_err(NcclInitError::Store)?;
    tracing::debug!(elapsed = ?t0.elapsed(), "NCCL split finished");
    r
}
