//! [`NcclBackend`]: the NCCL side of one group. Its communicator cache and
//! lookups, and the ops it runs through the backend interface.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use chorus_core::comm_cache::{CommCache, CommCacheError, CommKey};
use chorus_core::flight_recorder::OpMeta;
use chorus_core::profile::Phase;
use chorus_core::{profile, Completer, FinishedProbe, Op, OpContext, OpFuture, WorkError};
use chorus_gpu::nccl::{
    Communicator, DeviceBuffers, DeviceMem, EndEvent, InFlight, NcclCommError, Refused,
};
use chorus_store::Store;

use super::init::{NcclFactory, NcclInitError};
use super::options::NcclOptions;
use crate::backend::checked::{signature_of, Checker};
use crate::device_work::DeviceWork;
use crate::error::Rejected;
use crate::liveness::{PeerWitness, Report};
use crate::sequence::Sequencer;
use chorus_core::sync::lock;

/// The NCCL side of one group.
pub(crate) struct NcclBackend {
    cache: CommCache<NcclFactory>,
    pub(super) opts: NcclOptions,
    /// Communicators handed out so far, for the watchdog and subgroups.
    live: Mutex<Vec<(CommKey, Weak<Communicator>)>>,
    seen: AtomicU64,
    /// Collective communicators by device, in front of the cache.
    hot: std::sync::RwLock<Vec<(u32, Arc<Communicator>)>>,
    /// The checked mode: every launch's signatures compared across ranks
    /// before it reaches NCCL.
    pub(crate) checker: Option<Checker>,
    /// Names the peer behind an error NCCL reports without naming it (a
    /// group of several ranks with peer liveness on).
    witness: Option<Arc<PeerWitness>>,
    /// How long shrinking the predecessor's communicator took, if this
    /// group's came from a shrink (see `carry`).
    pub(super) shrunk: Mutex<Option<Duration>>,
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
        let factory = NcclFactory::new(group.clone(), rank, size, store, opts, timeout);
        NcclBackend {
            cache: CommCache::new(group, factory),
            opts,
            live: Mutex::new(Vec::new()),
            seen: AtomicU64::new(0),
            hot: std::sync::RwLock::new(Vec::new()),
            checker: None,
            witness: None,
            shrunk: Mutex::new(None),
        }
    }

    /// The group's store (its namespace of the job's store).
    pub(crate) fn store(&self) -> Arc<dyn Store> {
        self.cache.factory().store()
    }

    /// How long shrinking the predecessor's communicator took, if this
    /// group's collective communicator came from a shrink.
    pub(crate) fn shrunk(&self) -> Option<Duration> {
        *lock(&self.shrunk)
    }

    /// The backend in the checked mode: every launch's signatures are
    /// compared across ranks by `checker` before it reaches NCCL.
    pub(crate) fn checked(mut self, checker: Option<Checker>) -> NcclBackend {
        self.checker = checker;
        self
    }

    /// The backend with the witness that names the peer behind an NCCL
    /// error that names none.
    pub(crate) fn witnessed(mut self, witness: Option<Arc<PeerWitness>>) -> NcclBackend {
        self.witness = witness;
        self
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
            self.cache.factory().note_device(&key, dev);
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
        self.cache.factory().note_device(&key, dev);
        let comm = self.cache.get(key.clone()).await?;
        self.note(&key, &comm);
        Ok(comm)
    }

    fn note(&self, key: &CommKey, comm: &Arc<Communicator>) {
        let mut live = lock(&self.live);
        if !live.iter().any(|(_, w)| w.as_ptr() == Arc::as_ptr(comm)) {
            live.push((key.clone(), Arc::downgrade(comm)));
        }
        self.seen.store(self.cache.created(), Ordering::Release);
    }

    /// The live collective communicator, if one was created (for subgroup
    /// splits).
    pub(crate) fn collective_comm(&self) -> Option<Arc<Communicator>> {
        let live = lock(&self.live);
        live.iter()
            .filter(|(k, _)| !k.is_p2p())
            .filter_map(|(_, w)| w.upgrade())
            .find(|c| !c.is_aborted())
    }

    /// Installs a communicator split from the parent as this group's
    /// collective communicator for `dev`; the first op (or eager init) takes
    /// it instead of creating one.
    pub(crate) fn preset(&self, dev: u32, comm: Communicator) {
        self.cache.factory().preset(CommKey::devices([dev]), comm);
    }

    /// The watchdog's check: the first asynchronous error of a live
    /// communicator. An error that says a peer failed without naming it
    /// goes to the group's witness first, and is held back while the
    /// group's liveness task looks for the peer in the store (it then
    /// fails the group with `PeerLost` naming it); it is reported as it
    /// is once that search found every peer alive.
    pub(super) fn first_async_error(&self) -> Option<String> {
        let live: Vec<Arc<Communicator>> = lock(&self.live)
            .iter()
            .filter_map(|(_, w)| w.upgrade())
            .collect();
        for c in live {
            if c.is_aborted() {
                continue;
            }
            if let Err(e) = c.async_state() {
                let msg = format!("NCCL communicator on device {}: {e}", c.device().ordinal());
                if let (Some(w), true) = (&self.witness, e.is_peer_failure()) {
                    if w.report(&msg, Instant::now()) == Report::Hold {
                        return None;
                    }
                }
                return Some(msg);
            }
        }
        None
    }

    /// The group's collective communicators handed out so far (aborted
    /// ones too).
    pub(super) fn collectives(&self) -> Vec<Arc<Communicator>> {
        lock(&self.live)
            .iter()
            .filter(|(k, _)| !k.is_p2p())
            .filter_map(|(_, w)| w.upgrade())
            .collect()
    }

    /// Frees the revoked communicators kept for a shrink that will not come.
    pub(super) fn release_revoked(&self) {
        for (_, w) in lock(&self.live).iter() {
            if let Some(c) = w.upgrade() {
                c.abort_revoked();
            }
        }
    }

    /// Aborts every communicator of the group; they stay cached, marked
    /// aborted.
    pub(super) fn abort_all(&self, reason: &str) {
        for c in self.cache.abort(reason) {
            c.abort(reason);
        }
        // Communicators handed out but not (yet) in the cache.
        for (_, w) in lock(&self.live).iter() {
            if let Some(c) = w.upgrade() {
                c.abort(reason);
            }
        }
    }
}

/// The registered work of a device op and its completer.
pub(super) type DevicePair<C> = (OpFuture<Option<C>>, Completer<Option<C>>);

/// Registers the work of a device op (flight recorder, deadline), recorded
/// as submitted at `now` (the ops of a group share one reading): it is
/// enqueued right after. `probe` (the op's end event) lets the watchdog
/// retire an op that finished but was not polled yet instead of timing it
/// out.
pub(super) fn register<C: DeviceBuffers>(
    seq: &Sequencer,
    timeout: Duration,
    ctx: OpContext,
    op: Op,
    meta: OpMeta,
    probe: Option<Arc<dyn FinishedProbe>>,
    now: Instant,
) -> Result<DevicePair<C>, WorkError> {
    OpFuture::new_started(
        ctx,
        seq.registry(),
        now,
        Some(timeout),
        op.is_collective(),
        meta,
        probe,
    )
}

/// Checks a device op of a group, a capture or a single submission (`op`
/// in group ranks) against the group — its root or peer; the buffers'
/// shapes are checked by the communicator that runs it — and returns its
/// device and what the flight recorder keeps of it (`count`: the element
/// count it records).
pub(crate) fn device_check<C: DeviceBuffers>(
    seq: &Sequencer,
    op: Op,
    name: &'static str,
    bufs: &C,
    count: impl FnOnce(&C) -> usize,
) -> Result<(u32, OpMeta), WorkError> {
    let Some(first) = bufs.get(0) else {
        return Err(seq.invalid(op, name, "no buffer given".into()));
    };
    seq.check_ranks(op, name)?;
    let dev = first.stream().device().ordinal() as u32;
    Ok((dev, Sequencer::meta(op, Some(first.dtype()), count(bufs))))
}

/// A refused or failed enqueue as the op's error.
pub(crate) fn comm_error(ctx: &OpContext, e: NcclCommError) -> WorkError {
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
pub(crate) fn lookup_error(ctx: OpContext, e: &CommCacheError<NcclInitError>) -> WorkError {
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

impl NcclBackend {
    /// Registers and enqueues a device op in program order. `count` is the
    /// element count its flight record keeps; `enqueue` hands the op to its
    /// communicator (one NCCL call, or a coalesced group), which checks it,
    /// with the one clock reading its registration took.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn submit_as<C: DeviceBuffers>(
        &self,
        seq: &Sequencer,
        timeout: Duration,
        op: Op,
        name: &'static str,
        bufs: C,
        count: impl FnOnce(&C) -> usize,
        enqueue: impl FnOnce(
            &Communicator,
            Op,
            C,
            Arc<EndEvent>,
            Instant,
        ) -> Result<InFlight<C>, Refused<C>>,
    ) -> Result<DeviceWork<C>, Rejected<C>> {
        let (dev, meta) = match device_check(seq, op, name, &bufs, count) {
            Ok(v) => v,
            Err(e) => return Err(Rejected::new(e, bufs)),
        };
        // A lone send or recv runs on the pair's communicator, whose ranks
        // are 0 and 1 (the lower group rank is 0).
        let rank = seq.rank();
        let (key, cop) = match op {
            Op::Send { peer } | Op::Recv { peer } | Op::SendRecv { peer } => (
                Some(CommKey::pair(rank, peer)),
                op.with_peer(usize::from(peer > rank)),
            ),
            _ => (None, op),
        };
        let prof = profile::on();
        if prof {
            profile::start();
        }
        let found = match key {
            Some(k) => self.comm(k, dev),
            None => self.collective(dev),
        };
        let comm = match found {
            Ok(c) => c,
            Err(e) => {
                return Err(Rejected::new(
                    lookup_error(seq.refused_ctx(op, name), &e),
                    bufs,
                ))
            }
        };
        if prof {
            profile::stamp(Phase::CommLookup);
        }
        // The op's end event first: the registry entry asks it before the
        // watchdog times the op out (the work completes lazily).
        let end = match comm.reserve_end_event() {
            Ok(e) => e,
            Err(e) => {
                return Err(Rejected::new(
                    comm_error(&seq.refused_ctx(op, name), e.into()),
                    bufs,
                ))
            }
        };
        if prof {
            profile::stamp(Phase::EndEvent);
        }
        let mut counters = seq.lock();
        let n = counters.next(op);
        let ctx = seq.ctx(n, name);
        if let Some(checker) = &self.checker {
            if let Err(e) = checker.verify(seq, &mut counters, &ctx, &[signature_of(op, &meta)]) {
                return Err(Rejected::new(e, bufs));
            }
        }
        let probe: Arc<dyn FinishedProbe> = end.clone();
        if prof {
            profile::stamp(Phase::Sequence);
        }
        let now = Instant::now();
        if prof {
            profile::stamp(Phase::Clock);
        }
        let (work, completer) = match register::<C>(seq, timeout, ctx, op, meta, Some(probe), now) {
            Ok(pair) => pair,
            Err(e) => return Err(Rejected::new(e, bufs)),
        };
        match enqueue(&comm, cop, bufs, end, now) {
            Ok(inflight) => {
                if prof {
                    profile::stamp(Phase::SubmitInflight);
                }
                counters.bump(op, n);
                drop(counters);
                // Nothing goes to the completion reactor here: the work
                // holds the op until it is polled, dropped or taken back.
                let work = DeviceWork::held(work, inflight, completer, self.opts.poll_spin);
                if prof {
                    profile::stamp(Phase::Handle);
                    profile::finish();
                }
                Ok(work)
            }
            Err((e, bufs)) => {
                drop(counters);
                let err = comm_error(work.context(), e);
                completer.complete(Err(err.clone()));
                drop(work);
                Err(Rejected::new(err, bufs))
            }
        }
    }
}
