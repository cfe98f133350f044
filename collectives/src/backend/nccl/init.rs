//! Creating a group's NCCL communicators: the factory behind its
//! communicator cache (unique id through the store, non-blocking init, the
//! blocking twin for ops), and the split of a parent's communicator for a
//! subgroup.

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chorus_core::comm_cache::{CommFactory, CommKey};
use chorus_gpu::cuda::Device;
use chorus_gpu::nccl::{self as gnccl, CommOptions, Communicator, NcclCommError, PendingComm};
use chorus_store::Store;

use super::options::{NcclOptions, ReformComms};
use chorus_core::sync::lock;

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
pub(super) struct NcclFactory {
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

impl NcclFactory {
    /// The factory of rank `rank`'s communicators in `group` of `size`
    /// ranks, exchanging ids through the group's `store`.
    pub(super) fn new(
        group: Arc<str>,
        rank: usize,
        size: usize,
        store: Arc<dyn Store>,
        opts: NcclOptions,
        timeout: Duration,
    ) -> Self {
        NcclFactory {
            group,
            rank,
            size,
            store,
            opts,
            timeout,
            devices: Mutex::new(BTreeMap::new()),
            preset: Mutex::new(BTreeMap::new()),
        }
    }

    /// The group's store.
    pub(super) fn store(&self) -> Arc<dyn Store> {
        self.store.clone()
    }

    /// Notes that `key`'s communicator is for device `dev` (pair keys do
    /// not name it).
    pub(super) fn note_device(&self, key: &CommKey, dev: u32) {
        lock(&self.devices).insert(key.clone(), dev);
    }

    /// Hands the first creation of `key` the ready communicator `comm`
    /// (split from a parent) instead of creating one.
    pub(super) fn preset(&self, key: CommKey, comm: Communicator) {
        lock(&self.preset).insert(key, comm);
    }
}

impl CommFactory for NcclFactory {
    type Comm = Communicator;
    type Error = NcclInitError;
    type Init = InitFuture;

    fn create(&self, key: &CommKey, store_key: String) -> InitFuture {
        tracing::info!(target: "chorus::nccl", group = %self.group, rank = self.rank, key = %key, store_key = %store_key, "creating NCCL communicator");
        if let Some(c) = lock(&self.preset).remove(key) {
            return Box::pin(async move { Ok(c) });
        }
        let (nranks, me) = match key {
            CommKey::Devices(_) => (self.size, self.rank),
            CommKey::Pair { lo, hi } if lo == hi => (1, 0),
            CommKey::Pair { lo, .. } => (2, usize::from(self.rank != *lo)),
        };
        let dev = match key {
            CommKey::Devices(d) if d.len() == 1 => Some(d[0]),
            _ => lock(&self.devices).get(key).copied(),
        };
        let store = self.store.clone();
        let opts = CommOptions {
            priority: self.opts.stream_priority,
            // The group's collective communicator is revoked on abort
            // where a re-form may shrink it.
            keep_for_shrink: matches!(key, CommKey::Devices(_))
                && self.opts.reform == ReformComms::Shrink,
        };
        let timeout = self.timeout;
        let blocking_ops = self.opts.blocking_ops;
        let key_text = key.to_string();
        let work = async move {
            let dev = dev.ok_or(NcclInitError::NoDevice(key_text))?;
            let device = Device::get(dev as usize).map_err(NcclCommError::from)?;
            let id = if me == 0 {
                let id = gnccl::unique_id()?;
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
pub(super) async fn off_thread<T: Send + 'static>(
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
pub(super) async fn poll_backoff<T>(
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
        keep_for_shrink: false,
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
