//! [`TcpBackend`]: the TCP backend of one group, from connecting the mesh
//! to the ops it runs through the backend interface.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use chorus_core::flight_recorder::OpMeta;
use chorus_core::relay::Relay;
use chorus_core::{Element, HostBuffer, HostBuffers, Op, OpContext, OpFuture, WorkError};
use chorus_store::Store;
use futures::future::BoxFuture;
use tokio::sync::{mpsc, watch};

use super::dialer::Dialer;
use super::install::LinkTable;
use super::links::Links;
use super::options::{TcpOptions, MAX_CHUNK};
use super::pool::Pool;
use super::request::OpRequest;
use super::state::{Inner, PeerState, Progress, Runner};
use super::{acceptor, batch, drive, linger, setup, wire, worker};
use crate::backend::{Backend, Coalesces, Runs};
use crate::batched::{self, Batched};
use crate::error::{Error, Rejected};
use crate::sequence::{Counters, Sequencer};
use crate::work::{Assist, Work};

/// The TCP backend of one group. See the [module docs](super).
pub(crate) struct TcpBackend {
    inner: Arc<Inner>,
    /// This rank's table of connections.
    #[cfg_attr(not(test), allow(dead_code))]
    links: Arc<LinkTable>,
    tx: mpsc::UnboundedSender<OpRequest>,
    /// Set by `close`: the worker says goodbye and stops.
    close: watch::Sender<bool>,
    /// Set by the worker once it has stopped (after its goodbyes).
    done: watch::Receiver<bool>,
    /// Runs ops on their callers' threads.
    driver: Arc<drive::Driver>,
    /// The same driver for large ops (see `drive::LargeOp`), made once.
    large_op: Arc<drive::LargeOp>,
}

impl fmt::Debug for TcpBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inner.fmt(f)
    }
}

impl TcpBackend {
    /// Connects this rank to the other `size - 1` ranks of `group` through
    /// addresses exchanged in `store` (already namespaced for the group),
    /// and starts the group's worker and reader tasks on chorus's runtime;
    /// `checked`: the checked mode (every rank of the group must agree).
    /// Callable from any executor.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a bad rank, size or options;
    /// [`Error::Store`] if the store fails or a peer's address does not
    /// appear within `connect_timeout`; [`Error::Setup`] if a connection or a
    /// handshake fails or times out.
    pub(crate) async fn connect(
        store: Arc<dyn Store>,
        rank: usize,
        size: usize,
        group: Arc<str>,
        opts: TcpOptions,
        checked: bool,
    ) -> Result<Arc<TcpBackend>, Error> {
        if size == 0 || rank >= size || size > u32::MAX as usize / 2 {
            return Err(Error::InvalidArgument(format!(
                "TCP backend of group '{group}': rank {rank} is not in a group of size {size}"
            )));
        }
        if opts.chunk_bytes < 8 || opts.chunk_bytes > MAX_CHUNK {
            return Err(Error::InvalidArgument(format!(
                "TcpOptions::chunk_bytes is {}; it must be between 8 and {MAX_CHUNK}",
                opts.chunk_bytes
            )));
        }
        if !opts.liveness_timeout.is_zero() && opts.liveness_timeout < Duration::from_secs(1) {
            return Err(Error::InvalidArgument(format!(
                "TcpOptions::liveness_timeout is {:?}; it must be at least 1 s (or zero: off)",
                opts.liveness_timeout
            )));
        }
        let setup_err = |msg: String| Error::Setup {
            group: group.to_string(),
            rank,
            msg,
        };
        let me = setup::Me {
            rank,
            size,
            group: group.clone(),
            opts: opts.clone(),
            bcast: None,
            checked,
        };
        // Listen and publish this rank's address; connections are made
        // when ops first need them (see `links`).
        let listening = if size > 1 {
            let store = store.clone();
            let l = chorus_store::rt::run(async move { setup::listen(&*store, me).await })
                .await
                .map_err(setup_err)?
                .map_err(|e| match e {
                    setup::SetupError::Store(e) => Error::Store(e),
                    setup::SetupError::Other(msg) | setup::SetupError::Gone(msg) => setup_err(msg),
                })?;
            Ok(l)
        } else {
            Err(me)
        };
        let handle = chorus_store::rt::handle().map_err(setup_err)?;

        let (stop, stop_rx) = watch::channel(false);
        // Idle receive buffers kept for reuse: up to 32 MiB worth (the ring
        // reads ahead; fewer means an allocation and page faults per chunk).
        let pool_keep = (32 << 20) / opts.chunk_bytes + 8;
        let inner = Arc::new(Inner {
            rank,
            size,
            group_hash: wire::group_hash(&group),
            group,
            opts,
            pool: Pool::new(pool_keep),
            failed: Mutex::new(None),
            has_failed: AtomicBool::new(false),
            stop,
            lost: Mutex::new(None),
            peers: Mutex::new(vec![PeerState::Unconnected; size]),
            readers: Mutex::new(Vec::new()),
            linger: chorus_core::linger::Linger::new(),
            linger_start: tokio::sync::Notify::new(),
            taken: AtomicU64::new(0),
            moved: AtomicU64::new(0),
            stream_from: super::shm::stream_from(chorus_store::rt::local_ranks().unwrap_or(1)),
            shm_frames: AtomicU64::new(0),
            doorbells: Arc::new(AtomicU64::new(0)),
            shm_full: AtomicU64::new(0),
            checked,
            progress: Progress::default(),
            runner: std::sync::OnceLock::new(),
            #[cfg(test)]
            mute: AtomicBool::new(false),
        });
        let links: Arc<LinkTable> = Arc::new(Links::new(rank, size));
        let (me, host, acceptor) = match listening {
            Ok(mut l) => {
                let me = Arc::new(l.me.clone());
                let host = l.host.take();
                let task = handle.spawn(acceptor::acceptor(
                    inner.clone(),
                    links.clone(),
                    me.clone(),
                    l,
                ));
                (me, host, Some(task.abort_handle()))
            }
            Err(me) => (Arc::new(me), None, None),
        };
        let bcast = me.bcast.as_ref().map(|b| b.tx());
        let dialer = Dialer {
            inner: inner.clone(),
            links: links.clone(),
            me,
            store,
            host,
            acceptor: Mutex::new(acceptor),
        };
        let (tx, rx) = mpsc::unbounded_channel();
        let (close, close_rx) = watch::channel(false);
        let (done_tx, done) = watch::channel(false);
        let w = worker::Worker::new(inner.clone(), dialer, bcast);
        let run = linger::waking_lingering_readers(inner.clone(), async move {
            w.run(rx, stop_rx, close_rx).await;
            done_tx.send_replace(true);
        });
        let worker = Arc::new(Relay::new(run));
        let _ = inner.runner.set(Runner {
            relay: Arc::downgrade(&worker),
            handle: handle.clone(),
        });
        drive::host(&handle, &worker);
        handle.spawn(linger::sweep(inner.clone(), done.clone()));
        let spin = inner.opts.spin();
        tracing::debug!(group = %inner.group, rank, size, ?spin, "TCP backend listening");
        let driver = Arc::new(drive::Driver::new(inner.clone(), worker, handle, spin));
        Ok(Arc::new(TcpBackend {
            inner,
            links,
            tx,
            close,
            done,
            large_op: Arc::new(drive::LargeOp(driver.clone())),
            driver,
        }))
    }

    /// This rank.
    #[allow(dead_code)]
    pub(crate) fn rank(&self) -> usize {
        self.inner.rank
    }

    /// The group's size.
    #[allow(dead_code)]
    pub(crate) fn size(&self) -> usize {
        self.inner.size
    }

    /// Frames sent through shared memory so far, and frames that would have
    /// been but found every slot in use.
    #[allow(dead_code)]
    pub(crate) fn shm_stats(&self) -> (u64, u64) {
        (
            self.inner.shm_frames.load(Ordering::Relaxed),
            self.inner.shm_full.load(Ordering::Relaxed),
        )
    }

    /// Tests: doorbells this rank rang on its pipes so far.
    #[cfg(test)]
    pub(crate) fn doorbells(&self) -> u64 {
        self.inner.doorbells.load(Ordering::Relaxed)
    }

    /// Tests: whether a caller left this rank's pipes watched.
    #[cfg(test)]
    pub(crate) fn lingers(&self) -> bool {
        self.inner.linger.is_lingering()
    }

    /// Tests: the driver a large op gets where this host's ranks outnumber
    /// its cores, whatever this host's ranks and cores.
    #[cfg(test)]
    pub(crate) fn large_op_driver(&self) -> Arc<dyn Assist> {
        self.large_op.clone()
    }

    /// Tests: connections this rank has made or taken so far.
    #[cfg(test)]
    pub(crate) fn connections(&self) -> usize {
        self.links.opened()
    }

    /// Tests: fails this backend as a process that dies does, without a
    /// word to its peers (no fault notice).
    #[cfg(test)]
    pub(crate) fn die(&self, cause: &WorkError) {
        self.inner.mute.store(true, Ordering::SeqCst);
        self.abort(cause);
    }

    /// The options the backend was created with.
    #[allow(dead_code)]
    pub(crate) fn options(&self) -> &TcpOptions {
        &self.inner.opts
    }
}

impl TcpBackend {
    /// Queues `req` for the worker; fails it at once when the backend has
    /// failed or its worker has stopped.
    pub(super) fn enqueue(&self, req: OpRequest) {
        // Whatever the worker finds queued is not for a caller to start.
        self.inner.linger.set_idle(false);
        self.push(req);
    }

    /// Queues `req` for the worker (see [`enqueue`](Self::enqueue)).
    fn push(&self, req: OpRequest) {
        if let Some(cause) = self.inner.failure() {
            let err = cause.for_op(req.ctx.clone());
            req.completer.fail(err, req.bufs);
            return;
        }
        if let Err(mpsc::error::SendError(req)) = self.tx.send(req) {
            let err = match self.inner.failure() {
                Some(cause) => cause.for_op(req.ctx.clone()),
                None => WorkError::Backend {
                    ctx: req.ctx.clone(),
                    msg: "the TCP backend's worker has stopped".into(),
                },
            };
            req.completer.fail(err, req.bufs);
        }
    }

    /// Takes `op`'s sequence number under the submission lock `counters`
    /// and registers its work: the work, and the request for `bufs`. With
    /// `own`, the op is one chorus issues for itself, numbered among those
    /// (see `Counters::next_own`).
    #[allow(clippy::too_many_arguments)]
    fn register(
        seq: &Sequencer,
        counters: &mut Counters,
        timeout: Duration,
        op: Op,
        name: &'static str,
        mut meta: OpMeta,
        bufs: Vec<HostBuffer>,
        own: bool,
    ) -> Result<(OpFuture<Vec<HostBuffer>>, OpRequest), (WorkError, Vec<HostBuffer>)> {
        let ctx = if own {
            counters.next_own(seq, name)
        } else {
            seq.ctx(counters.next(op), name)
        };
        meta.internal = ctx.internal.map(std::num::NonZeroU64::get);
        let deadline = Instant::now().checked_add(timeout);
        // Holding: a work failed from outside (abort, timeout) waits for
        // the worker to hand its buffers back (`Completer::fail`), which
        // it does as soon as it has stopped the op.
        let registered = OpFuture::new_holding(
            ctx.clone(),
            seq.registry(),
            deadline,
            op.is_collective(),
            meta,
        );
        let (work, completer) = match registered {
            Ok(pair) => pair,
            Err(e) => return Err((e, bufs)),
        };
        if own {
            counters.bump_own();
        } else {
            counters.bump(op, ctx.seq);
        }
        tracing::trace!(group = %seq.name(), seq = ctx.seq, internal = ?ctx.internal, op = name, "submit");
        let req = OpRequest {
            ctx,
            op,
            bufs,
            timeout,
            completer,
        };
        Ok((work, req))
    }

    /// Submits collective `op`, named `name`, on `bufs` as an op chorus
    /// issues for itself (see [`OpContext`]): numbered apart from the
    /// program's ops, named `name` in errors and flight records, and run
    /// whether or not the group waits for `admit`.
    pub(crate) fn submit_own<S: HostBuffers>(
        &self,
        seq: &Sequencer,
        timeout: Duration,
        op: Op,
        name: &'static str,
        bufs: S,
    ) -> Result<Work<S>, Rejected<S>> {
        let mut counters = seq.lock();
        self.submit_own_locked(seq, &mut counters, timeout, op, name, bufs)
    }

    /// [`submit_own`](Self::submit_own) under the submission lock
    /// `counters`, which the caller keeps (it waits for the op before
    /// submitting the one it checks).
    pub(crate) fn submit_own_locked<S: HostBuffers>(
        &self,
        seq: &Sequencer,
        counters: &mut Counters,
        timeout: Duration,
        op: Op,
        name: &'static str,
        bufs: S,
    ) -> Result<Work<S>, Rejected<S>> {
        let counts = counts(&bufs);
        if let Err(msg) = op.check(seq.size(), &counts) {
            let error = WorkError::InvalidArgument {
                ctx: counters.next_own(seq, name),
                msg,
            };
            return Err(Rejected::new(error, bufs));
        }
        let meta = Sequencer::meta(op, bufs.dtype(), counts.first().copied().unwrap_or(0));
        match Self::register(
            seq,
            counters,
            timeout,
            op,
            name,
            meta,
            bufs.into_host(),
            true,
        ) {
            Ok((work, req)) => {
                let assist = self.start_then(req, || ());
                Ok(Work::new(work, Vec::new(), assist))
            }
            Err((error, host)) => Err(Rejected::new(error, S::recover(host))),
        }
    }
}

impl TcpBackend {
    /// Hands a registered op to the worker and lets go of the submission
    /// lock `counters`. A small op that finds the worker waiting is
    /// started on this thread (see `drive`); its work then gets the driver,
    /// to run the rest on the awaiting caller's thread.
    fn start(&self, req: OpRequest, counters: MutexGuard<'_, Counters>) -> Option<Arc<dyn Assist>> {
        self.start_then(req, || drop(counters))
    }

    /// [`start`](Self::start), with `unlock` letting go of whatever
    /// ordered the submission, once the op is queued.
    pub(super) fn start_then(
        &self,
        req: OpRequest,
        unlock: impl FnOnce(),
    ) -> Option<Arc<dyn Assist>> {
        let bytes: usize = req.bufs.iter().map(|b| b.as_bytes().len()).sum();
        if !self.driver.is_small(bytes) {
            self.enqueue(req);
            unlock();
            return self
                .driver
                .drives_large()
                .then(|| self.large_op.clone() as Arc<dyn Assist>);
        }
        let claim = self.driver.claim_idle_worker();
        if claim.is_some() {
            self.push(req);
        } else {
            self.enqueue(req);
        }
        unlock();
        if let Some(c) = claim {
            self.driver.kick(c);
        }
        self.driver
            .spins()
            .then(|| self.driver.clone() as Arc<dyn Assist>)
    }
}

/// The element counts of `bufs`' buffers, in order.
fn counts<S: HostBuffers>(bufs: &S) -> Vec<usize> {
    (0..bufs.len()).filter_map(|i| bufs.count(i)).collect()
}

/// Host ops of a group, staged until launch. Dropped unlaunched, it fails
/// their works: the ops never ran.
#[derive(Default)]
pub(crate) struct TcpStaged(Vec<HostEntry>);

impl fmt::Debug for TcpStaged {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TcpStaged")
            .field("ops", &self.0.len())
            .finish()
    }
}

impl TcpStaged {
    /// Number of ops staged.
    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }
}

/// A staged host op and where its work goes.
struct HostEntry {
    op: Op,
    /// Its context before launch (no sequence number yet), for errors.
    ctx: OpContext,
    meta: OpMeta,
    bufs: Vec<HostBuffer>,
    deliver: Box<dyn FnOnce(Result<OpFuture<Vec<HostBuffer>>, WorkError>)>,
}

impl Drop for TcpStaged {
    fn drop(&mut self) {
        for e in self.0.drain(..) {
            let err = batched::cancelled(&e.ctx);
            (e.deliver)(Err(err));
        }
    }
}

impl Backend for TcpBackend {
    type Staged = TcpStaged;

    fn name(&self) -> &'static str {
        "tcp"
    }

    fn launch(
        &self,
        seq: &Sequencer,
        timeout: Duration,
        mut staged: TcpStaged,
    ) -> Result<(), WorkError> {
        let entries = std::mem::take(&mut staged.0);
        let mut counters = seq.lock();
        let mut reqs = Vec::with_capacity(entries.len());
        let mut failure: Option<WorkError> = None;
        for e in entries {
            if let Some(err) = &failure {
                (e.deliver)(Err(err.for_op(e.ctx)));
                continue;
            }
            let HostEntry {
                op,
                ctx,
                meta,
                bufs,
                deliver,
            } = e;
            match Self::register(seq, &mut counters, timeout, op, ctx.op, meta, bufs, false) {
                Ok((work, req)) => {
                    deliver(Ok(work));
                    reqs.push(req);
                }
                Err((err, _)) => {
                    deliver(Err(err.clone()));
                    failure = Some(err);
                }
            }
        }
        if let Some(err) = failure {
            // Nothing of a group runs unless all of it does.
            drop(counters);
            for r in reqs {
                let e = err.for_op(r.ctx.clone());
                r.completer.fail(e, r.bufs);
            }
            return Err(err);
        }
        for r in batch::fuse(reqs) {
            self.enqueue(r);
        }
        Ok(())
    }

    fn close(&self) -> BoxFuture<'static, ()> {
        self.close.send_replace(true);
        let mut done = self.done.clone();
        Box::pin(async move {
            // The worker's goodbye and its wait for the peers' are bounded;
            // this bound only guards against a worker that cannot run.
            let _ = tokio::time::timeout(Duration::from_secs(10), done.wait_for(|d| *d)).await;
        })
    }

    fn abort(&self, cause: &WorkError) {
        self.inner.fail(cause);
        // The worker closes the write halves and fails the queue when it sees
        // the stop signal; the readers stop now.
        self.inner.stop_readers();
    }
}

impl<S: HostBuffers> Runs<S> for TcpBackend {
    type Work = Work<S>;

    fn submit(
        &self,
        seq: &Sequencer,
        timeout: Duration,
        op: Op,
        bufs: S,
    ) -> Result<Work<S>, Rejected<S>> {
        let name = op.name();
        if matches!(op, Op::SendRecv { .. }) {
            let error = seq.invalid(
                op,
                name,
                "send_recv runs on device buffers; on host buffers stage a send and a recv in \
                 a batch (ProcessGroup::batch)"
                    .into(),
            );
            return Err(Rejected::new(error, bufs));
        }
        let counts = counts(&bufs);
        if let Err(error) = seq.check(op, name, &counts) {
            return Err(Rejected::new(error, bufs));
        }
        let meta = Sequencer::meta(op, bufs.dtype(), counts.first().copied().unwrap_or(0));
        let mut counters = seq.lock();
        match Self::register(
            seq,
            &mut counters,
            timeout,
            op,
            name,
            meta,
            bufs.into_host(),
            false,
        ) {
            Ok((work, req)) => {
                let assist = self.start(req, counters);
                Ok(Work::new(work, Vec::new(), assist))
            }
            Err((error, host)) => {
                drop(counters);
                Err(Rejected::new(error, S::recover(host)))
            }
        }
    }

    fn stage(
        &self,
        seq: &Sequencer,
        staged: &mut TcpStaged,
        op: Op,
        bufs: S,
    ) -> Result<Batched<Work<S>>, Rejected<S>> {
        let name = op.name();
        let counts = counts(&bufs);
        if let Err(error) = seq.check(op, name, &counts) {
            return Err(Rejected::new(error, bufs));
        }
        let ctx = seq.ctx(0, name);
        let cell = batched::cell();
        let into = cell.clone();
        staged.0.push(HostEntry {
            op,
            ctx: ctx.clone(),
            meta: Sequencer::meta(op, bufs.dtype(), counts.first().copied().unwrap_or(0)),
            bufs: bufs.into_host(),
            deliver: Box::new(move |r| {
                batched::put(&into, r.map(|w| Work::new(w, Vec::new(), None)))
            }),
        });
        Ok(Batched::new(cell, ctx))
    }
}

impl<T: Element> Coalesces<Vec<T>> for TcpBackend {
    type Work = Work<Vec<Vec<T>>>;

    /// One op on the buffers' concatenation (one message exchange), cut
    /// back into one buffer per input when it has finished.
    fn submit_coalesced(
        &self,
        seq: &Sequencer,
        timeout: Duration,
        op: Op,
        bufs: Vec<Vec<T>>,
    ) -> Result<Work<Vec<Vec<T>>>, Rejected<Vec<Vec<T>>>> {
        let name = op.coalesced_name();
        if bufs.is_empty() || !op.coalescable() {
            let msg = if bufs.is_empty() {
                "a coalesced op needs at least one buffer".to_string()
            } else {
                format!("{op} cannot be coalesced; all_reduce, broadcast and reduce can")
            };
            return Err(Rejected::new(seq.invalid(op, name, msg), bufs));
        }
        let lens: Vec<usize> = bufs.iter().map(Vec::len).collect();
        let total = lens.iter().sum();
        if let Err(error) = seq.check(op, name, &[total]) {
            return Err(Rejected::new(error, bufs));
        }
        let meta = Sequencer::meta(op, Some(T::DTYPE), total);
        let fused = vec![T::into_host(bufs.concat())];
        let mut counters = seq.lock();
        match Self::register(seq, &mut counters, timeout, op, name, meta, fused, false) {
            Ok((work, req)) => {
                let assist = self.start(req, counters);
                Ok(Work::new(work, lens, assist))
            }
            Err((error, host)) => {
                drop(counters);
                let parts = host
                    .into_iter()
                    .next()
                    .map(|fused| fused.split(&lens))
                    .unwrap_or_default();
                Err(Rejected::new(error, Vec::<Vec<T>>::recover(parts)))
            }
        }
    }
}
