//! [`Member`]: the work of one op of a batch, a view of the batch's one
//! work ([`BatchLead`]).
//!
//! A batch's ops are one launch with one end event, so they end together:
//! the batch has one registry entry, one completion and one brief watch or
//! reactor hand-off, all in its lead, and each op's work is no more than
//! its place in the launch (its ticket). The first work polled polls the
//! lead; every work polled while the batch runs is woken when the lead
//! resolves ([`Fanout`]); each then takes its own buffers from the launch.
//! What a work never takes (dropped, or its batch's launch dropped) stays
//! with the launch until the end event completes.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use chorus_core::{Failed, Fanout, OpContext, OpFuture, WorkError, WorkStatus};
use chorus_gpu::cuda::{Event, Stream};
use chorus_gpu::nccl::{DeviceBuffers, EndEvent, Launched, NoBuffers, Ticket};

use super::own::{DeviceCompleter, OwnWork};
use crate::batched;
use chorus_core::sync::lock;

/// The state a batch's works share: made when the batch's first op is
/// staged (with the end event its launch will record), launched with the
/// batch.
pub(crate) struct BatchLead {
    end: Arc<EndEvent>,
    /// Each op's context with its sequence number, from the launch on (the
    /// list the batch's registry entry keeps).
    ops: OnceLock<Arc<[OpContext]>>,
    state: Mutex<LeadState>,
    /// The works polled while the batch runs: the lead's work wakes them
    /// all (its end, an early wake before it, its failure).
    waiters: Fanout,
}

enum LeadState {
    /// Staged, not launched yet.
    Staged,
    /// Never ran (dropped before launch, or refused at registration); the
    /// error names the batch's first op.
    NotRun(WorkError),
    Launched(Box<Launch>),
}

struct Launch {
    /// Each op's buffers, by ticket.
    bufs: Launched,
    /// The batch's one work while it runs; `None` once its outcome is known.
    work: Option<OwnWork<NoBuffers>>,
    outcome: Option<Result<(), WorkError>>,
    /// Why the launch failed, if it did.
    launch_error: Option<WorkError>,
}

impl BatchLead {
    /// The lead of a batch whose launch will record `end`.
    pub(crate) fn new(end: Arc<EndEvent>) -> Arc<Self> {
        Arc::new(BatchLead {
            end,
            ops: OnceLock::new(),
            state: Mutex::new(LeadState::Staged),
            waiters: Fanout::new(),
        })
    }

    /// The end event the batch's launch records.
    pub(crate) fn end(&self) -> &Arc<EndEvent> {
        &self.end
    }

    /// The batch never runs: its works fail with `err` made theirs.
    pub(crate) fn not_run(&self, err: WorkError) {
        let mut st = lock(&self.state);
        if matches!(*st, LeadState::Staged) {
            *st = LeadState::NotRun(err);
        }
    }

    /// The batch was launched as `bufs`, its ops registered as `ops` with
    /// `work` standing for all of them. With `failed` (the launch's
    /// error) the work is failed with it at once.
    pub(crate) fn launched(
        &self,
        bufs: Launched,
        ops: Arc<[OpContext]>,
        work: (OpFuture<Option<NoBuffers>>, DeviceCompleter<NoBuffers>),
        failed: Option<&WorkError>,
        spin: Duration,
    ) {
        let _ = self.ops.set(ops);
        let (future, completer) = work;
        let launch = match (failed, bufs.group_end()) {
            (None, Some(end)) => Launch {
                bufs,
                work: Some(OwnWork::held(future, end, completer, spin)),
                outcome: None,
                launch_error: None,
            },
            (failed, _) => {
                let err = failed.cloned().unwrap_or_else(|| WorkError::Backend {
                    ctx: future.context().clone(),
                    msg: "a batch's launch has no end event (a chorus bug)".into(),
                });
                completer.complete(Err(err.clone()));
                Launch {
                    bufs,
                    work: None,
                    outcome: Some(Err(err.clone())),
                    launch_error: Some(err),
                }
            }
        };
        *lock(&self.state) = LeadState::Launched(Box::new(launch));
    }
}

/// The work of one op of a batch (see the module docs).
pub(crate) struct Member<R: DeviceBuffers> {
    lead: Arc<BatchLead>,
    index: usize,
    ticket: Ticket<R>,
    /// The op as staged (sequence number 0 until the launch numbers it).
    staged: OpContext,
    /// Its buffers were taken or its outcome given: nothing to let go of
    /// on drop.
    done: bool,
}

fn missing(ctx: &OpContext) -> WorkError {
    WorkError::Backend {
        ctx: ctx.clone(),
        msg: "a batched op's buffers were already taken (a chorus bug)".into(),
    }
}

impl<R: DeviceBuffers> Member<R> {
    /// Op `index` of `lead`'s batch, whose buffers `ticket` names.
    pub(crate) fn new(
        lead: Arc<BatchLead>,
        index: usize,
        ticket: Ticket<R>,
        staged: OpContext,
    ) -> Self {
        Member {
            lead,
            index,
            ticket,
            staged,
            done: false,
        }
    }

    pub(super) fn context(&self) -> &OpContext {
        self.lead
            .ops
            .get()
            .and_then(|ops| ops.get(self.index))
            .unwrap_or(&self.staged)
    }

    /// Ok once the batch was launched; else why the op has not run (not
    /// launched yet, dropped unlaunched, refused, a failed launch).
    pub(super) fn launched(&self) -> Result<(), WorkError> {
        match &*lock(&self.lead.state) {
            LeadState::Staged => Err(batched::not_launched(self.context())),
            LeadState::NotRun(e) => Err(e.for_op(self.context().clone())),
            LeadState::Launched(l) => match &l.launch_error {
                Some(e) => Err(e.for_op(self.context().clone())),
                None => Ok(()),
            },
        }
    }

    pub(super) fn status(&self) -> WorkStatus {
        match &*lock(&self.lead.state) {
            LeadState::Staged => WorkStatus::Pending,
            LeadState::NotRun(_) => WorkStatus::Failed,
            LeadState::Launched(l) => match (&l.outcome, &l.work) {
                (Some(Ok(())), _) => WorkStatus::Finished,
                (Some(Err(_)), _) => WorkStatus::Failed,
                (None, Some(w)) => w.status(),
                (None, None) => WorkStatus::Failed,
            },
        }
    }

    pub(super) fn end_event(&self) -> &Event {
        self.lead.end.event()
    }

    pub(super) fn end_event_handle(&self) -> Arc<EndEvent> {
        self.lead.end.clone()
    }

    pub(super) fn gpu_finished(&self) -> Result<bool, chorus_gpu::cuda::CudaError> {
        self.lead.end.is_complete()
    }

    /// The op's outcome once the batch's is known (`launch`'s), with its
    /// buffers where the GPU is done with them.
    fn resolve(&self, launch: &mut Launch) -> Result<R, Failed<R>> {
        let ctx = self.context();
        match &launch.outcome {
            Some(Ok(())) => match self.take_if_finished(launch) {
                Some(bufs) => Ok(bufs),
                None => Err(Failed::without_buffers(missing(ctx))),
            },
            Some(Err(e)) => Err(Failed {
                error: e.for_op(ctx.clone()),
                buffers: self.take_if_finished(launch),
            }),
            None => Err(Failed::without_buffers(WorkError::Backend {
                ctx: ctx.clone(),
                msg: "a batched op resolved before its batch (a chorus bug)".into(),
            })),
        }
    }

    /// The op's buffers if the end event has completed (else they stay
    /// with the launch, or go to the retire queue, until it does).
    fn take_if_finished(&self, launch: &mut Launch) -> Option<R> {
        if let Some(bufs) = launch.bufs.take_if_complete(&self.ticket) {
            return Some(bufs);
        }
        let mut f = launch.bufs.take_ref(&self.ticket)?;
        f.bind_device().ok()?;
        f.take_finished().ok().flatten()
    }

    /// Records the lead's outcome `r`; the caller wakes the other
    /// waiters once it let go of the state.
    fn settle(launch: &mut Launch, r: Result<NoBuffers, Failed<NoBuffers>>) {
        launch.outcome = Some(r.map(drop).map_err(|f| f.error));
        launch.work = None;
    }

    pub(super) fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Result<R, Failed<R>>> {
        let r = match self.poll_lead(cx) {
            Poll::Ready(r) => r,
            Poll::Pending => return Poll::Pending,
        };
        self.done = true;
        Poll::Ready(r)
    }

    fn poll_lead(&self, cx: &mut Context<'_>) -> Poll<Result<R, Failed<R>>> {
        let mut settled = false;
        let r = self.poll_lead_locked(cx, &mut settled);
        if settled {
            self.lead.waiters.wake_all_but(Some(cx.waker()));
        }
        r
    }

    fn poll_lead_locked(
        &self,
        cx: &mut Context<'_>,
        settled: &mut bool,
    ) -> Poll<Result<R, Failed<R>>> {
        let mut st = lock(&self.lead.state);
        let launch = match &mut *st {
            LeadState::Staged => {
                let e = batched::not_launched(self.context());
                return Poll::Ready(Err(Failed::without_buffers(e)));
            }
            LeadState::NotRun(e) => {
                let e = e.for_op(self.context().clone());
                return Poll::Ready(Err(Failed::without_buffers(e)));
            }
            LeadState::Launched(l) => l,
        };
        if launch.outcome.is_none() {
            let Some(work) = launch.work.as_mut() else {
                return Poll::Ready(self.resolve(launch));
            };
            // The protocol of `Fanout`: polled under the state's lock, the
            // others woken once it is let go of (`poll_lead`).
            match self.lead.waiters.poll(work, cx) {
                Poll::Ready(r) => {
                    Self::settle(launch, r);
                    *settled = true;
                }
                Poll::Pending => return Poll::Pending,
            }
        }
        Poll::Ready(self.resolve(launch))
    }

    pub(super) fn stream_ordered(mut self, stream: Option<&Stream>) -> Result<R, Failed<R>> {
        let mut settled = false;
        let r = self.take_ordered(stream, &mut settled);
        if settled {
            self.lead.waiters.wake_all_but(None);
        }
        self.done = true;
        r
    }

    fn take_ordered(&self, stream: Option<&Stream>, settled: &mut bool) -> Result<R, Failed<R>> {
        let mut st = lock(&self.lead.state);
        let launch = match &mut *st {
            LeadState::Staged => {
                return Err(Failed::without_buffers(batched::not_launched(
                    self.context(),
                )));
            }
            LeadState::NotRun(e) => {
                return Err(Failed::without_buffers(e.for_op(self.context().clone())));
            }
            LeadState::Launched(l) => l,
        };
        // A batch failed meanwhile (abort, timeout) gives its buffers no
        // stream order: the failure, as a poll would find it.
        if launch.outcome.is_none() {
            if let Some(work) = launch.work.as_mut().filter(|w| w.has_failed()) {
                let mut noop = Context::from_waker(Waker::noop());
                if let Poll::Ready(r) = Pin::new(work).poll(&mut noop) {
                    Self::settle(launch, r);
                    *settled = true;
                }
            }
        }
        if let Some(Err(_)) = &launch.outcome {
            return self.resolve(launch);
        }
        let ctx = self.context();
        let Some(mut f) = launch.bufs.take_ref(&self.ticket) else {
            return Err(Failed::without_buffers(missing(ctx)));
        };
        match f.take_stream_ordered(stream) {
            Ok(Some(bufs)) => Ok(bufs),
            Ok(None) => Err(Failed::without_buffers(missing(ctx))),
            // The buffers stay with the op (`f` goes to the retire queue).
            Err(e) => Err(Failed::without_buffers(WorkError::Backend {
                ctx: ctx.clone(),
                msg: format!("stream-ordered wait failed: {e}"),
            })),
        }
    }

    pub(super) fn wait_timeout(mut self, timeout: Duration) -> Result<R, Failed<R>> {
        let t0 = Instant::now();
        let deadline = t0.checked_add(timeout);
        let waker = chorus_core::work::unpark_waker();
        let mut cx = Context::from_waker(&waker);
        loop {
            if let Poll::Ready(r) = self.poll(&mut cx) {
                return r;
            }
            match deadline {
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        break;
                    }
                    std::thread::park_timeout(d - now);
                }
                None => std::thread::park(),
            }
        }
        let mut settled = false;
        let r = self.time_out(timeout, &mut settled);
        if settled {
            self.lead.waiters.wake_all_but(None);
        }
        self.done = true;
        r
    }

    /// The deadline of a blocking wait passed: the batch's work times out
    /// (which aborts the group, as a lone op's wait does), unless it
    /// finished meanwhile.
    fn time_out(&self, after: Duration, settled: &mut bool) -> Result<R, Failed<R>> {
        let mut st = lock(&self.lead.state);
        let LeadState::Launched(launch) = &mut *st else {
            drop(st);
            let mut noop = Context::from_waker(Waker::noop());
            return match self.poll_lead(&mut noop) {
                Poll::Ready(r) => r,
                Poll::Pending => Err(Failed::without_buffers(missing(self.context()))),
            };
        };
        if launch.outcome.is_none() {
            if let Some(work) = launch.work.take() {
                let r = work.time_out(after);
                Self::settle(launch, r);
                *settled = true;
            }
        }
        self.resolve(launch)
    }
}

impl<R: DeviceBuffers> Drop for Member<R> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        // Let go of the buffers now (they are released once the end event
        // completed), not only with the whole launch.
        let f = match &mut *lock(&self.lead.state) {
            LeadState::Launched(l) => l.bufs.take_ref(&self.ticket),
            _ => None,
        };
        drop(f);
    }
}
