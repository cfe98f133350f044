//! [`Communicator`]: one NCCL communicator with its dedicated stream, from
//! creation (wrapping the handle a non-blocking init produced) to abort and
//! drop. Ops are enqueued by `enqueue`, grouped by `batch`.

use std::fmt;
use std::os::raw::c_int;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nccl_sys::sys::{ncclComm_t, ncclConfig_t, ncclResult_t};
use nccl_sys::Nccl;

use super::error::{nccl_err, NcclCommError};
use super::event_pool::{EndEvent, EventPool};
use super::retire::RetireQueue;
use super::revoke::{stop, RawComm, RevokedSlot, Stop};
use crate::cuda::{CudaError, Device, Event, Stream, StreamPriority};
use chorus_core::sync::lock;

/// Settings of new communicators.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CommOptions {
    /// Priority of the communicator's dedicated stream.
    pub priority: StreamPriority,
    /// On abort, keep the communicator as the parent of a later
    /// [`Communicator::shrink`] instead of destroying it, where the loaded
    /// NCCL has `ncclCommShrink`: revoked (`ncclCommRevoke`, its work
    /// stops at once) where NCCL has that too, else as it is (its work
    /// stops at the shrink or the drop).
    pub keep_for_shrink: bool,
}

/// What the enqueue lock guards.
pub(super) struct EnqueueState {
    /// Input-ready events, re-recorded by every op (a stream wait captures
    /// the event's state at the call, so reuse is safe).
    pub(super) ready: [Event; 2],
    /// Ops enqueued so far (their end events complete in this order).
    pub(super) ops: u64,
}

/// One NCCL communicator with its dedicated stream.
pub struct Communicator {
    pub(super) nccl: &'static Nccl,
    comm: AtomicPtr<nccl_sys::sys::ncclComm>,
    pub(super) device: Device,
    pub(super) stream: Stream,
    rank: usize,
    pub(super) nranks: usize,
    /// Held while an op (or a split) is enqueued: NCCL communicators are not
    /// safe for concurrent calls.
    pub(super) enqueue: Mutex<EnqueueState>,
    /// Its own lock: taken before the enqueue lock (the op's registry entry
    /// gets the event first), never by the threads that finish ops.
    pool: Mutex<EventPool>,
    /// Ops nobody waits for any more, retired by the threads that let go
    /// of them (see the `retire` module).
    pub(super) retire: Arc<RetireQueue>,
    aborted: AtomicBool,
    abort_reason: Mutex<Option<String>>,
    /// Signals when the abort thread's `ncclCommAbort` (or revoke)
    /// returned; the drop waits for it (bounded), so a process that exits
    /// right after an abort does not tear NCCL down under a running abort.
    pub(super) abort_done: Mutex<Option<std::sync::mpsc::Receiver<()>>>,
    /// Keep rather than destroy on abort (see [`CommOptions`]).
    keep_for_shrink: bool,
    /// The handle kept by the abort for a shrink.
    pub(super) revoked: RevokedSlot,
    /// Set while the stream takes part in a CUDA graph capture.
    pub(super) capturing: AtomicBool,
    /// Ops in the last batch launched here: a new batch makes room for as
    /// many (groups of one program tend to repeat their size).
    pub(super) batch_len: AtomicUsize,
}

// SAFETY: the raw handle is used under `enqueue` for ops, and otherwise only
// with the calls NCCL documents as callable concurrently
// (ncclCommGetAsyncError, ncclCommAbort).
unsafe impl Send for Communicator {}
// SAFETY: as above.
unsafe impl Sync for Communicator {}

impl fmt::Debug for Communicator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Communicator")
            .field("device", &self.device.ordinal())
            .field("rank", &self.rank)
            .field("nranks", &self.nranks)
            .field("aborted", &self.is_aborted())
            .finish()
    }
}

impl Communicator {
    /// Wraps a ready NCCL handle with its own stream and events.
    pub(super) fn wrap(
        nccl: &'static Nccl,
        comm: ncclComm_t,
        device: &Device,
        rank: usize,
        nranks: usize,
        opts: CommOptions,
    ) -> Result<Communicator, NcclCommError> {
        let stream = device.new_stream(opts.priority)?;
        let ready = [device.new_event()?, device.new_event()?];
        Ok(Communicator {
            nccl,
            comm: AtomicPtr::new(comm),
            device: device.clone(),
            stream,
            rank,
            nranks,
            enqueue: Mutex::new(EnqueueState { ready, ops: 0 }),
            pool: Mutex::new(EventPool::new()),
            retire: Arc::default(),
            aborted: AtomicBool::new(false),
            abort_reason: Mutex::new(None),
            abort_done: Mutex::new(None),
            keep_for_shrink: opts.keep_for_shrink,
            revoked: RevokedSlot::default(),
            capturing: AtomicBool::new(false),
            batch_len: AtomicUsize::new(0),
        })
    }

    /// A *blocking* communicator of the same ranks split from this one
    /// (`ncclCommSplit` with `blocking = 1`), with its own stream. Op calls
    /// on a blocking communicator return once the op is enqueued, without
    /// the `ncclInProgress` polling a non-blocking one needs on every call.
    /// chorus creates communicators non-blocking (so initialization has a
    /// timeout and can be aborted) and then switches to a blocking twin for
    /// ops.
    ///
    /// Every rank must call it. It blocks the calling thread until every
    /// rank did; aborting this communicator from another thread ends the
    /// wait with an error.
    ///
    /// # Errors
    ///
    /// No `ncclCommSplit` in this NCCL, an aborted communicator, or the NCCL
    /// or CUDA error.
    pub fn split_blocking(&self, opts: CommOptions) -> Result<Communicator, NcclCommError> {
        let split = self.nccl.ncclCommSplit.ok_or_else(|| {
            NcclCommError::Unavailable(format!("{} lacks ncclCommSplit", self.nccl.path()))
        })?;
        // A heap cell NCCL writes the new handle into, possibly late (the
        // parent is non-blocking): leaked if we give up before it is done.
        let mut cell: Box<ncclComm_t> = Box::new(std::ptr::null_mut());
        {
            let _g = lock(&self.enqueue);
            let comm = self.live()?;
            self.device.bind_to_thread()?;
            let mut cfg = ncclConfig_t::initializer();
            cfg.blocking = 1;
            // SAFETY: `comm` is live and we hold its enqueue lock; `cell`
            // stays at its heap address until the split is done (or is
            // leaked); NCCL copies `cfg`.
            let rc = unsafe { split(comm, 0, self.rank as c_int, &mut *cell, &mut cfg) };
            if !rc.is_success() && !rc.is_in_progress() {
                return Err(nccl_err(self.nccl, "ncclCommSplit", rc));
            }
            // The parent is non-blocking: the split completes as its job.
            if let Err(e) = self.wait_idle("ncclCommSplit", Duration::from_secs(3600)) {
                std::mem::forget(cell);
                return Err(e);
            }
        }
        let out = *cell;
        if out.is_null() {
            return Err(NcclCommError::InvalidArgument(
                "ncclCommSplit returned no communicator".into(),
            ));
        }
        Communicator::wrap(self.nccl, out, &self.device, self.rank, self.nranks, opts).inspect_err(
            |_| {
                // SAFETY: `out` is the new handle nobody else holds.
                unsafe { (self.nccl.ncclCommAbort)(out) };
            },
        )
    }

    /// This rank in the communicator.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of ranks.
    pub fn nranks(&self) -> usize {
        self.nranks
    }

    /// The device.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The dedicated stream ops run on.
    pub fn stream(&self) -> &Stream {
        &self.stream
    }

    /// True once aborted.
    pub fn is_aborted(&self) -> bool {
        self.aborted.load(Ordering::Acquire)
    }

    pub(super) fn live(&self) -> Result<ncclComm_t, NcclCommError> {
        if self.is_aborted() {
            let why = lock(&self.abort_reason).clone().unwrap_or_default();
            return Err(NcclCommError::Aborted(why));
        }
        Ok(self.comm.load(Ordering::Acquire))
    }

    /// [`live`](Self::live), and not taking part in a graph capture (its
    /// stream would capture the op).
    pub(super) fn live_outside_capture(&self) -> Result<ncclComm_t, NcclCommError> {
        let comm = self.live()?;
        if self.capturing.load(Ordering::Acquire) {
            return Err(NcclCommError::Capturing);
        }
        Ok(comm)
    }

    /// `ncclCommGetAsyncError`: `Ok(true)` while a non-blocking call is in
    /// progress, `Ok(false)` when idle and healthy.
    ///
    /// # Errors
    ///
    /// The communicator's asynchronous error (a failed peer, a network
    /// error), or [`NcclCommError::Aborted`].
    pub fn async_state(&self) -> Result<bool, NcclCommError> {
        let comm = self.live()?;
        let mut state = ncclResult_t::ncclSuccess;
        // SAFETY: `comm` is live (not aborted); this call is allowed
        // concurrently with others on the communicator.
        let rc = unsafe { (self.nccl.ncclCommGetAsyncError)(comm, &mut state) };
        if !rc.is_success() {
            return Err(nccl_err(self.nccl, "ncclCommGetAsyncError", rc));
        }
        if state.is_in_progress() {
            return Ok(true);
        }
        if !state.is_success() {
            return Err(nccl_err(
                self.nccl,
                "NCCL communicator (async error)",
                state,
            ));
        }
        Ok(false)
    }

    /// Aborts the communicator: its ops in flight stop (`ncclCommAbort`;
    /// with [`CommOptions::keep_for_shrink`] it is kept as the parent of a
    /// [`shrink`](Self::shrink) instead, see there), and every later use
    /// fails with [`NcclCommError::Aborted`]. Idempotent; returns at once
    /// (NCCL's call runs on a thread of its own).
    pub fn abort(&self, reason: &str) {
        if self.aborted.swap(true, Ordering::AcqRel) {
            return;
        }
        *lock(&self.abort_reason) = Some(reason.to_string());
        let comm = self.comm.swap(std::ptr::null_mut(), Ordering::AcqRel);
        if !comm.is_null() {
            let how = match (self.keep_for_shrink, self.nccl.ncclCommShrink) {
                (true, Some(_)) => Stop::Keep(self.nccl.ncclCommRevoke),
                _ => Stop::Abort,
            };
            tracing::warn!(
                device = self.device.ordinal(),
                reason,
                how = ?how,
                "aborting NCCL communicator"
            );
            // ncclCommAbort can block until the communicator's stream drains
            // (e.g. behind a producer stream that never completes), and a
            // blocking communicator's revoke until it is quiet: run either
            // on its own thread so the caller (a timed-out blocking wait, the
            // watchdog) returns at once. The communicator is already unusable.
            let (nccl, raw, slot) = (self.nccl, RawComm(comm), self.revoked.clone());
            let device = self.device.ordinal() as i32;
            let (tx, rx) = std::sync::mpsc::channel();
            let run = move || {
                stop(nccl, raw, how, &slot, device);
                let _ = tx.send(());
            };
            match std::thread::Builder::new()
                .name("chorus-nccl-abort".into())
                .spawn(run)
            {
                Ok(_) => *lock(&self.abort_done) = Some(rx),
                Err(e) => {
                    tracing::error!(error = %e, "cannot start the NCCL abort thread; the communicator is leaked")
                }
            }
        }
    }

    /// Numbers an op whose end event `end` was just recorded on the stream
    /// (under the enqueue lock `st`, never inside a graph capture) and
    /// notes it as the stream's newest (see `progress`); returns its
    /// position.
    pub(super) fn recorded(&self, st: &mut EnqueueState, end: &Arc<EndEvent>) -> u64 {
        st.ops += 1;
        self.retire.progress.recorded(st.ops, end);
        st.ops
    }

    /// A free end event from the pool (see `EventPool`).
    pub(super) fn end_event(&self) -> Result<Arc<EndEvent>, CudaError> {
        lock(&self.pool).take(|| self.device.new_event())
    }

    /// Polls `ncclCommGetAsyncError` until no call is in progress.
    pub(super) fn wait_idle(
        &self,
        what: &'static str,
        limit: Duration,
    ) -> Result<(), NcclCommError> {
        // Spin first: an op call that returned ncclInProgress is usually
        // done within microseconds, and a sleep costs at least the thread's
        // timer slack (50 µs by default). Then yield, then sleep with
        // backoff for long waits (init, split).
        const SPIN: Duration = Duration::from_micros(200);
        const YIELD: Duration = Duration::from_millis(2);
        let t0 = Instant::now();
        let mut pause = Duration::from_micros(10);
        while self.async_state()? {
            let waited = t0.elapsed();
            if waited > limit {
                return Err(NcclCommError::Timeout { what, after: limit });
            }
            if waited < SPIN {
                std::hint::spin_loop();
            } else if waited < YIELD {
                std::thread::yield_now();
            } else {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(1));
            }
        }
        Ok(())
    }
}

/// How long dropping an aborted communicator waits for its abort to finish.
const ABORT_JOIN_LIMIT: Duration = Duration::from_secs(10);

impl Drop for Communicator {
    fn drop(&mut self) {
        if let Some(rx) = self
            .abort_done
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            if rx.recv_timeout(ABORT_JOIN_LIMIT).is_err() {
                tracing::error!(
                    device = self.device.ordinal(),
                    limit = ?ABORT_JOIN_LIMIT,
                    "ncclCommAbort has not returned; leaving it running"
                );
            }
        }
        if let Some(kept) = lock(&self.revoked).take() {
            // Kept for a shrink that never came.
            // SAFETY: the handle is exclusively ours (taken from the slot).
            unsafe { (self.nccl.ncclCommAbort)(kept.raw.0) };
        }
        let comm = self.comm.swap(std::ptr::null_mut(), Ordering::AcqRel);
        if comm.is_null() {
            return;
        }
        // Let the GPU finish what was enqueued, then finalize and destroy.
        let _ = self.stream.synchronize();
        let clean = match self.nccl.ncclCommFinalize {
            Some(fin) => {
                // SAFETY: `comm` is live and exclusively ours (we are being
                // dropped).
                let rc = unsafe { fin(comm) };
                let mut ok = rc.is_success() || rc.is_in_progress();
                let t0 = Instant::now();
                while ok {
                    let mut st = ncclResult_t::ncclSuccess;
                    // SAFETY: as above.
                    let rc = unsafe { (self.nccl.ncclCommGetAsyncError)(comm, &mut st) };
                    if !rc.is_success() || !(st.is_success() || st.is_in_progress()) {
                        ok = false;
                    } else if st.is_success() {
                        break;
                    } else if t0.elapsed() > Duration::from_secs(10) {
                        ok = false;
                    } else {
                        std::thread::sleep(Duration::from_micros(100));
                    }
                }
                ok
            }
            None => true,
        };
        // SAFETY: `comm` is exclusively ours; after either call it is gone.
        unsafe {
            if clean {
                (self.nccl.ncclCommDestroy)(comm);
            } else {
                (self.nccl.ncclCommAbort)(comm);
            }
        }
    }
}
