//! [`OpFuture`], the future of one registered op, its [`Completer`] and
//! the state they share (see the module above for the rules).

/// A handle that wakes a work's future before its op completes
/// ([`Completer::early_wake`]).
#[derive(Clone)]
pub struct EarlyWake(DynArc<dyn WakesEarly>);

impl fmt::Debug for EarlyWake {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EarlyWake").finish_non_exhaustive()
    }
}

impl EarlyWake {
    /// Wakes the future awaiting the work (if it is awaited): it polls
    /// again and finds the op still pending. For a backend that expects
    /// the op to end soon and wants the awaiting thread awake when it does.
    pub fn wake(&self) {
        self.0.wake_early();
    }
}

trait WakesEarly: Send + Sync {
    fn wake_early(&self);
}

impl<T: Send> WakesEarly for Shared<T> {
    fn wake_early(&self) {
        self.slot.wake_early();
    }
}

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
#[cfg(not(loom))]
use std::time::Duration;
use std::time::Instant;

use super::registry::{Fail, FinishedProbe, Registry};
use super::slot::{Outcome, Slot, WorkStatus};
use crate::error::{Failed, OpContext, WorkError};
use crate::flight_recorder::{FlightRecorder, OpMeta};
use crate::sync::{Arc, AtomicBool, DynArc, Ordering};

/// What a work, its completer and its registry entry share: the op, its
/// ids and its completion slot, in one allocation per op.
pub(super) struct Shared<T> {
    pub(super) ctx: OpContext,
    /// Registry id.
    pub(super) id: u64,
    /// Flight-recorder id, if the registry records.
    pub(super) rec: Option<u64>,
    pub(super) slot: Slot<T>,
    /// An early failure waits for the backend's buffers
    /// ([`OpFuture::new_holding`]).
    pub(super) hold: bool,
    /// The registry holds this state while the op is pending (its entry is
    /// removed when the completer completes or drops), so the cycle through
    /// `registry` ends with the op.
    pub(super) registry: Arc<Registry>,
    /// For an op of a [`WorkBatch`]: set by the first of the batch's
    /// completers to finish, which retires the batch's one entry (`id`)
    /// for all of them.
    pub(super) batch: Option<Arc<AtomicBool>>,
}

impl<T> Shared<T> {
    /// Takes the op out of the registry and records its end (`error`, if
    /// it failed): its own entry, or its batch's entry and records the
    /// first time one of the batch ends.
    fn retire(&self, error: impl FnOnce() -> Option<String>) {
        match &self.batch {
            None => {
                self.registry.remove(self.id);
                if let (Some(rec), Some(id)) = (self.registry.recorder(), self.rec) {
                    rec.finished(id, error());
                }
            }
            Some(retired) => {
                if !retired.swap(true, Ordering::AcqRel) {
                    self.registry.retire(self.id, error);
                }
            }
        }
    }
}

impl<T: Send + 'static> Fail for Shared<T> {
    fn fail(&self, err: WorkError) {
        // If the backend completed first, the work keeps that outcome.
        if self.hold {
            self.slot.fail_holding(err);
        } else {
            drop(self.slot.resolve(Err(Failed::without_buffers(err))));
        }
    }

    fn context(&self) -> &OpContext {
        &self.ctx
    }
}

/// The future of one submitted op. Resolves to the op's buffers, or the error
/// that stopped it with the buffers where they came back ([`Failed`]).
///
/// A work made by [`new_holding`](Self::new_holding) that fails early
/// (abort, timeout) stays pending until its backend hands the buffers back
/// (or drops its completer), and then fails with the first error and the
/// buffers; any other work fails at once, without them.
///
/// # Cancel safety
///
/// Dropping a `OpFuture` detaches it: the op still runs to completion, and its
/// buffers are released by the backend when it is done. To stop ops, abort
/// the group.
#[must_use = "a work does nothing when polled late, but its result (the buffers) is lost if dropped"]
pub struct OpFuture<T> {
    pub(super) shared: DynArc<Shared<T>>,
}

/// The backend's side of an [`OpFuture`]: completes it with the op's outcome.
///
/// Dropping a completer without calling [`complete`](Completer::complete)
/// fails the work (a backend bug must not become a hang).
pub struct Completer<T> {
    pub(super) shared: Option<DynArc<Shared<T>>>,
}

impl<T> fmt::Debug for OpFuture<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpFuture")
            .field("op", &self.shared.ctx)
            .field("status", &self.shared.slot.status())
            .finish()
    }
}

impl<T> fmt::Debug for Completer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Completer")
            .field("op", &self.shared.as_ref().map(|s| &s.ctx))
            .finish()
    }
}

impl<T: Send + 'static> OpFuture<T> {
    /// Registers a new op in `registry` and returns its work and completer.
    ///
    /// # Errors
    ///
    /// [`WorkError::GroupErrored`] if the group has already failed: the op
    /// must not be submitted.
    pub fn new(
        ctx: OpContext,
        registry: &Arc<Registry>,
        deadline: Option<Instant>,
    ) -> Result<(OpFuture<T>, Completer<T>), WorkError> {
        Self::new_recorded(ctx, registry, deadline, true, OpMeta::default())
    }

    /// Like [`new`](Self::new), and records the op in the registry's flight
    /// recorder with `meta` (`collective`: its sequence number is comparable
    /// across ranks).
    ///
    /// # Errors
    ///
    /// As for [`new`](Self::new).
    pub fn new_recorded(
        ctx: OpContext,
        registry: &Arc<Registry>,
        deadline: Option<Instant>,
        collective: bool,
        meta: OpMeta,
    ) -> Result<(OpFuture<T>, Completer<T>), WorkError> {
        Self::scheduled(ctx, registry, deadline, collective, meta, false)
    }

    /// Like [`new_recorded`](Self::new_recorded), for a backend that hands
    /// a failed op's buffers back ([`Completer::fail`]) as soon as it has
    /// stopped touching them: an early failure (abort, timeout, the
    /// watchdog) does not resolve the work at once but leaves it pending
    /// until the completer completes (or drops), so that the work's
    /// [`Failed`] carries the buffers. The backend must bound that time
    /// (the TCP backend's worker stops an op at the group's abort and at
    /// the op's own timeout).
    ///
    /// # Errors
    ///
    /// As for [`new`](Self::new).
    pub fn new_holding(
        ctx: OpContext,
        registry: &Arc<Registry>,
        deadline: Option<Instant>,
        collective: bool,
        meta: OpMeta,
    ) -> Result<(OpFuture<T>, Completer<T>), WorkError> {
        Self::scheduled(ctx, registry, deadline, collective, meta, true)
    }

    /// Registers an op submitted now and records it as scheduled (`hold`:
    /// an early failure waits for the buffers).
    fn scheduled(
        ctx: OpContext,
        registry: &Arc<Registry>,
        deadline: Option<Instant>,
        collective: bool,
        meta: OpMeta,
        hold: bool,
    ) -> Result<(OpFuture<T>, Completer<T>), WorkError> {
        Self::register(
            ctx,
            registry,
            Instant::now(),
            deadline,
            None,
            hold,
            |r, ctx| r.scheduled(ctx.seq, ctx.op, collective, meta),
        )
    }

    /// Like [`new_recorded`](Self::new_recorded), for a backend that starts
    /// the op as it submits it (an NCCL enqueue): the deadline (`now +
    /// timeout`), the registry entry and the flight record (scheduled and
    /// started at once) all take the one clock reading `now`, which the
    /// caller makes just before. With a `probe`, an op past its deadline
    /// that the probe finds finished is retired from the registry instead
    /// of timing out (see [`Registry::expired`]); for backends that
    /// complete works lazily.
    ///
    /// # Errors
    ///
    /// As for [`new`](Self::new).
    pub fn new_started(
        ctx: OpContext,
        registry: &Arc<Registry>,
        now: Instant,
        timeout: Option<std::time::Duration>,
        collective: bool,
        meta: OpMeta,
        probe: Option<std::sync::Arc<dyn FinishedProbe>>,
    ) -> Result<(OpFuture<T>, Completer<T>), WorkError> {
        let deadline = timeout.and_then(|t| now.checked_add(t));
        Self::register(ctx, registry, now, deadline, probe, false, |r, ctx| {
            r.started_at(ctx.seq, ctx.op, collective, meta, now)
        })
    }

    /// Registers the op, then records it with `record` in the registry's
    /// flight recorder, if any.
    fn register(
        ctx: OpContext,
        registry: &Arc<Registry>,
        now: Instant,
        deadline: Option<Instant>,
        probe: Option<std::sync::Arc<dyn FinishedProbe>>,
        hold: bool,
        record: impl FnOnce(&FlightRecorder, &OpContext) -> u64,
    ) -> Result<(OpFuture<T>, Completer<T>), WorkError> {
        let shared = registry.insert(ctx, now, deadline, probe, record, |ctx, id, rec| {
            DynArc::new(Shared {
                ctx,
                id,
                rec,
                slot: Slot::new(),
                hold,
                registry: registry.clone(),
                batch: None,
            })
        })?;
        if crate::profile::on() {
            crate::profile::stamp(crate::profile::Phase::Work);
        }
        Ok((
            OpFuture {
                shared: shared.clone(),
            },
            Completer {
                shared: Some(shared),
            },
        ))
    }

    /// A work that has already failed with `err` (for example a refused
    /// submission), not registered anywhere.
    pub fn failed(err: WorkError) -> OpFuture<T> {
        let shared = DynArc::new(Shared {
            ctx: err.context().clone(),
            id: 0,
            rec: None,
            slot: Slot::new(),
            hold: false,
            registry: Arc::new(Registry::new()),
            batch: None,
        });
        drop(shared.slot.resolve(Err(Failed::without_buffers(err))));
        OpFuture { shared }
    }
}

impl<T> OpFuture<T> {
    /// The op this work belongs to.
    pub fn context(&self) -> &OpContext {
        &self.shared.ctx
    }

    /// Sequence number of the op in its group.
    pub fn seq(&self) -> u64 {
        self.shared.ctx.seq
    }

    /// Where the op stands, without waiting. `Finished` is reported only once
    /// the backend has completed the op, never at enqueue.
    pub fn status(&self) -> WorkStatus {
        self.shared.slot.status()
    }

    /// True once the op has finished or failed (its outcome is available).
    pub fn is_done(&self) -> bool {
        matches!(self.status(), WorkStatus::Finished | WorkStatus::Failed)
    }

    /// Takes the outcome if the op is done, without waiting.
    pub fn try_take(&mut self) -> Option<Result<T, Failed<T>>> {
        self.shared.slot.try_take()
    }

    fn consumed_error(&self) -> Failed<T> {
        Failed::without_buffers(WorkError::InvalidArgument {
            ctx: self.shared.ctx.clone(),
            msg: "the work was polled again after it returned its result".into(),
        })
    }
}

impl<T> Future for OpFuture<T> {
    type Output = Result<T, Failed<T>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.shared.slot.poll(cx.waker()) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Some(r)) => Poll::Ready(r),
            Poll::Ready(None) => Poll::Ready(Err(self.consumed_error())),
        }
    }
}

/// How long [`OpFuture::wait_timeout`] waits, after its timeout aborted
/// the group, for the backend of a holding work to hand the buffers back.
/// Past it the work fails without them (the backend releases them once it
/// is done).
#[cfg(not(loom))]
pub const HOLD_GRACE: Duration = Duration::from_secs(2);

/// A waker that unparks the calling thread: for a thread that blocks on
/// a work itself (`std::thread::park_timeout` between polls).
#[cfg(not(loom))]
pub fn unpark_waker() -> std::task::Waker {
    use std::task::Wake;
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: std::sync::Arc<Self>) {
            self.0.unpark();
        }
        fn wake_by_ref(self: &std::sync::Arc<Self>) {
            self.0.unpark();
        }
    }
    std::task::Waker::from(std::sync::Arc::new(Unpark(std::thread::current())))
}

#[cfg(not(loom))]
impl<T> OpFuture<T> {
    /// Blocks the calling thread until the op is done, `deadline` passes,
    /// or the work is woken early ([`EarlyWake`]) — whichever comes first.
    /// The outcome if the op is done; `None` otherwise, with no other
    /// effect (unlike [`wait_timeout`](Self::wait_timeout), nothing is
    /// aborted).
    pub fn wait_until(&mut self, deadline: Instant) -> Option<Result<T, Failed<T>>> {
        let waker = unpark_waker();
        match self.shared.slot.poll(&waker) {
            Poll::Ready(Some(r)) => Some(r),
            Poll::Ready(None) => Some(Err(self.consumed_error())),
            Poll::Pending => {
                let now = Instant::now();
                if now < deadline {
                    std::thread::park_timeout(deadline - now);
                }
                self.try_take()
            }
        }
    }

    /// Blocks the calling thread until the op is done, for synchronous code.
    ///
    /// On timeout the group is aborted (its backend is torn down and every
    /// pending work fails), because a collective that one rank gave up on
    /// cannot be finished by the others. A work made by
    /// [`new_holding`](Self::new_holding) then waits up to
    /// [`HOLD_GRACE`] more for its backend to hand the buffers back.
    ///
    /// # Errors
    ///
    /// The op's own error, or [`WorkError::OpTimeout`] after `timeout`,
    /// with the buffers where they came back.
    pub fn wait_timeout(self, timeout: Duration) -> Result<T, Failed<T>> {
        let waker = unpark_waker();
        let deadline = Instant::now() + timeout;
        loop {
            match self.shared.slot.poll(&waker) {
                Poll::Ready(Some(r)) => return r,
                Poll::Ready(None) => return Err(self.consumed_error()),
                Poll::Pending => {}
            }
            let now = Instant::now();
            if now >= deadline {
                return self.time_out(timeout);
            }
            std::thread::park_timeout(deadline - now);
        }
    }

    /// A blocking wait of `after` ran out: unless the op completed
    /// meanwhile, aborts the group with [`WorkError::OpTimeout`] (saying
    /// `after`) and returns the work's outcome, as
    /// [`wait_timeout`](Self::wait_timeout) does at its deadline (for a
    /// caller that waited in its own way, e.g. on the GPU).
    ///
    /// # Errors
    ///
    /// The timeout, or the op's own failure if it came first.
    pub fn time_out(self, after: Duration) -> Result<T, Failed<T>> {
        let waker = unpark_waker();
        match self.shared.slot.poll(&waker) {
            Poll::Ready(Some(r)) => return r,
            Poll::Ready(None) => return Err(self.consumed_error()),
            Poll::Pending => {}
        }
        let err = WorkError::OpTimeout {
            ctx: self.shared.ctx.clone(),
            after,
        };
        tracing::error!(op = %self.shared.ctx, timeout = ?after, "blocking wait timed out; aborting the group");
        self.shared.registry.abort(&err);
        if self.shared.hold {
            // The abort stopped the backend: it hands the buffers back
            // within moments.
            let grace = Instant::now() + HOLD_GRACE;
            while Instant::now() < grace {
                match self.shared.slot.poll(&waker) {
                    Poll::Ready(Some(r)) => return r,
                    Poll::Ready(None) => return Err(self.consumed_error()),
                    Poll::Pending => {}
                }
                std::thread::park_timeout(grace.saturating_duration_since(Instant::now()));
            }
        }
        match self.shared.slot.try_take() {
            Some(r) => r,
            None => Err(Failed::without_buffers(err)),
        }
    }
}

impl<T: Send + 'static> Completer<T> {
    /// A handle that wakes the awaiting future early (see [`EarlyWake`]).
    pub fn early_wake(&self) -> Option<EarlyWake> {
        self.shared.as_ref().map(|s| {
            let d: DynArc<dyn WakesEarly> = s.clone();
            EarlyWake(d)
        })
    }
}

impl<T> Completer<T> {
    /// The op this completer belongs to.
    pub fn context(&self) -> Option<&OpContext> {
        self.shared.as_ref().map(|s| &s.ctx)
    }

    /// The backend started running the op (recorded in the flight
    /// recorder).
    pub fn started(&self) {
        if let Some(s) = &self.shared {
            if let (Some(rec), Some(id)) = (s.registry.recorder(), s.rec) {
                rec.started(id);
            }
        }
    }

    /// True if the work was failed early (abort, timeout) and the backend may
    /// skip the op's remaining steps.
    pub fn is_failed(&self) -> bool {
        self.shared.as_ref().is_some_and(|s| s.slot.has_failed())
    }

    /// Fails the op and hands its buffers back with the error, for a
    /// backend that has stopped touching them (contents unspecified).
    /// Otherwise as [`complete`](Self::complete) with an error.
    pub fn fail(self, err: WorkError, buffers: T) {
        self.finish(Err(Failed::new(err, buffers)));
    }

    /// Completes the op: hands `outcome` (the buffers, or the error) to the
    /// work and wakes it. An error here carries no buffers (they are
    /// dropped with the completer's caller); [`fail`](Self::fail) gives
    /// them back.
    ///
    /// If the work was already failed (abort, timeout), `outcome` is dropped
    /// here, which is when the buffers are released: after the backend is done
    /// with them. The same holds if the work itself was dropped.
    ///
    /// An error aborts the group (the default error policy): a collective
    /// that failed on one rank leaves the group in an unknown state, so every
    /// pending and later op fails with this first cause. Invalid-argument
    /// errors are the exception: nothing ran.
    pub fn complete(self, outcome: Result<T, WorkError>) {
        self.finish(outcome.map_err(Failed::without_buffers));
    }

    fn finish(mut self, outcome: Outcome<T>) {
        if let Some(shared) = self.shared.take() {
            shared.retire(|| outcome.as_ref().err().map(|e| e.error.to_string()));
            let abort = match &outcome {
                Err(Failed { error: e, .. }) if !matches!(e, WorkError::InvalidArgument { .. }) => {
                    Some(e.clone())
                }
                _ => None,
            };
            // Abort (fail the others, dump the flight recorder) before this
            // work is woken: its owner may exit as soon as it sees the error.
            if let Some(cause) = abort {
                shared.registry.abort(&cause);
            }
            // The registry let go above: a count of one means the work was
            // dropped (or taken back stream-ordered) and nobody can read
            // the slot; the outcome is dropped here either way.
            if DynArc::strong_count(&shared) > 1 {
                drop(shared.slot.resolve(outcome));
            }
        }
    }
}

impl<T> Drop for Completer<T> {
    fn drop(&mut self) {
        if let Some(shared) = self.shared.take() {
            shared.retire(|| Some("dropped by the backend".into()));
            let err = WorkError::Backend {
                ctx: shared.ctx.clone(),
                msg: "the backend dropped the op without completing it (it was shutting down)"
                    .into(),
            };
            drop(shared.slot.resolve(Err(Failed::without_buffers(err))));
        }
    }
}
