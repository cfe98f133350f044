//! [`OwnWork`]: the work of an op that holds its own buffers and
//! completion (a lone op; a group's one work for all of its ops).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use chorus_core::{Completer, Failed, OpContext, OpFuture, WorkError, WorkStatus};
use chorus_gpu::cuda::{CudaError, Event, Stream};
use chorus_gpu::doze::Doze;
use chorus_gpu::nccl::{DeviceBuffers, EndEvent, Finished, InFlight, Watched};
use chorus_gpu::reactor::{self, ReactorConfig};

/// A lone op's work: the op, its buffers and its own completion (see
/// [`DeviceWork`](super::DeviceWork)).
pub(crate) struct OwnWork<R: DeviceBuffers> {
    inner: OpFuture<Option<R>>,
    end: Arc<EndEvent>,
    track: Option<Track<R>>,
    /// Polled before (the first poll may watch the op briefly).
    polled: bool,
    /// How long the first poll may watch the end event itself
    /// ([`NcclOptions::poll_spin`](crate::NcclOptions::poll_spin)), in ns
    /// (a few µs: kept small, as a work moves on every await).
    spin_ns: u32,
}

// Never pinned structurally: the buffers move in and out by value.
impl<R: DeviceBuffers> Unpin for OwnWork<R> {}

/// The backend's side of a device work.
pub(crate) type DeviceCompleter<C> = Completer<Option<C>>;

/// Where an enqueued op's buffers and completion are.
enum Track<C: DeviceBuffers> {
    /// With the work (nothing handed to the reactor yet).
    Held(Held<C>),
    /// With the completion reactor, which completes the work.
    Watched(Watched<C>),
}

/// An op its work still holds, with its completer. Dropped, it goes to its
/// communicator's retire queue (its buffers are released only after the
/// end event completed).
struct Held<C: DeviceBuffers>(Option<(InFlight<C>, DeviceCompleter<C>)>);

impl<C: DeviceBuffers> Held<C> {
    /// Hands the op to the reactor for someone who waits on it (who is
    /// woken ahead of the op's expected end, see `prewake_watch`).
    fn watch(mut self) -> Option<Watched<C>> {
        let (f, c) = self.0.take()?;
        let early = c.early_wake();
        Some(f.watch_awaited(finisher(c), early))
    }
}

/// One look at an op's end event by the thread that awaits it: for at most
/// `span`; with a `close` instant (the expected end less the close spin),
/// napping until then, in naps of at most `longest`, spinning from then
/// until `spin_until`, and past that napping in even steps
/// ([`doze::STEP`](chorus_gpu::doze::STEP)).
///
/// The spin lasts until half the configured lead and the close spin past
/// the expected end, which ops like this one end well within (the
/// expectation is early by twice their deviation). An op that runs later
/// still is seen within a step: an expectation early by much (a history
/// that mixes lengths) costs naps, not a spinning core.
#[derive(Clone, Copy, Debug)]
struct Watch {
    span: Duration,
    close: Option<Instant>,
    spin_until: Option<Instant>,
    longest: Duration,
}

impl Watch {
    /// A spin of `span` (the first poll's, for a short op or one without
    /// history).
    fn brief(span: Duration) -> Watch {
        Watch {
            span,
            close: None,
            spin_until: None,
            longest: Duration::ZERO,
        }
    }

    /// The pre-wake's watch of an op expected to end at `end`, for `span`
    /// (without an expected end: as if it were due now).
    fn prewake(span: Duration, end: Option<Instant>, config: &ReactorConfig) -> Watch {
        let end = end.unwrap_or_else(Instant::now);
        Watch {
            span,
            close: Some(end.checked_sub(config.watch_spin).unwrap_or(end)),
            spin_until: Some(end + config.prewake_lead / 2 + config.watch_spin),
            longest: config.watch_nap,
        }
    }

    /// The watch of a future woken ahead of its op's expected end
    /// ([`Watched::prewake_watch`]). Past it, the future waits for the
    /// reactor as before.
    fn woken<C: DeviceBuffers>(w: &Watched<C>) -> Watch {
        let config = reactor::global().config();
        let end = w.expected_end();
        Watch::prewake(w.prewake_watch(end, config.prewake_lead), end, &config)
    }

    /// The same watch, for no longer than `limit`.
    fn within(self, limit: Duration) -> Watch {
        Watch {
            span: self.span.min(limit),
            ..self
        }
    }
}

impl<C: DeviceBuffers> Held<C> {
    /// Hands the op to the reactor for a blocking wait that wakes itself
    /// to watch it (no pre-wake, see [`InFlight::watch_self_timed`]).
    fn watch_self_timed(mut self) -> Option<Watched<C>> {
        let (f, c) = self.0.take()?;
        Some(f.watch_self_timed(finisher(c)))
    }
}

impl<C: DeviceBuffers> Drop for Held<C> {
    fn drop(&mut self) {
        if let Some((f, c)) = self.0.take() {
            f.detach(finisher(c));
        }
    }
}

/// Completes a device op's work with what the completion reactor found.
fn finisher<C: DeviceBuffers>(
    completer: DeviceCompleter<C>,
) -> impl FnOnce(Finished<C>) + Send + 'static {
    move |(res, bufs): Finished<C>| match res {
        Ok(()) => completer.complete(Ok(bufs)),
        Err(e) => {
            let msg = format!("CUDA error while the op ran: {e}");
            match completer.context().cloned() {
                // The reactor is done with the op (it would drop the
                // buffers here): they go back with the error.
                Some(ctx) => completer.fail(WorkError::Backend { ctx, msg }, bufs),
                None => drop(completer),
            }
        }
    }
}

impl<R: DeviceBuffers> std::fmt::Debug for OwnWork<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OwnWork")
            .field("op", self.inner.context())
            .field("status", &self.status())
            .finish()
    }
}

fn missing(ctx: &OpContext) -> WorkError {
    WorkError::Backend {
        ctx: ctx.clone(),
        msg: "the op's buffers were already taken (a chorus bug)".into(),
    }
}

/// The buffers of a finished work's outcome, or the failure.
fn flatten<R>(ctx: &OpContext, r: Result<Option<R>, Failed<Option<R>>>) -> Result<R, Failed<R>> {
    match r {
        Ok(Some(b)) => Ok(b),
        Ok(None) => Err(Failed::without_buffers(missing(ctx))),
        Err(f) => Err(f.map_buffers(|b| b)),
    }
}

impl<R: DeviceBuffers> OwnWork<R> {
    /// The work of an op it holds itself (see the type's docs).
    pub(crate) fn held(
        inner: OpFuture<Option<R>>,
        op: InFlight<R>,
        completer: DeviceCompleter<R>,
        spin: Duration,
    ) -> Self {
        let end = op.end_event_handle();
        OwnWork {
            inner,
            end,
            track: Some(Track::Held(Held(Some((op, completer))))),
            polled: false,
            spin_ns: u32::try_from(spin.as_nanos()).unwrap_or(u32::MAX),
        }
    }

    /// The op's rank, group, sequence number and name.
    pub(crate) fn context(&self) -> &OpContext {
        self.inner.context()
    }

    /// Where the op stands. `Finished` only once the GPU has finished it
    /// (the end event completed), never at enqueue; for an op the work
    /// still holds this queries the end event.
    pub(crate) fn status(&self) -> WorkStatus {
        let st = self.inner.status();
        match &self.track {
            Some(Track::Held(Held(Some((f, _))))) if st == WorkStatus::Pending => {
                match f.bind_device().and_then(|()| self.end.is_complete()) {
                    Ok(true) => WorkStatus::Finished,
                    Ok(false) => WorkStatus::Pending,
                    Err(_) => WorkStatus::Failed,
                }
            }
            _ => st,
        }
    }

    /// True once the op has failed (an abort, a timeout, a failed
    /// launch), without asking the GPU.
    pub(super) fn has_failed(&self) -> bool {
        self.inner.status() == WorkStatus::Failed
    }

    /// The op's end event (recorded on the communicator's stream after the
    /// op).
    pub(crate) fn end_event(&self) -> &Event {
        self.end.event()
    }

    /// A shared handle on the end event, usable from another thread (it
    /// stays valid after the work is consumed).
    pub(crate) fn end_event_handle(&self) -> Arc<EndEvent> {
        self.end.clone()
    }

    /// Queries the end event now (`cuEventQuery`): true once the GPU
    /// finished the op.
    ///
    /// # Errors
    ///
    /// A CUDA error of the op (never read as "not finished").
    pub(crate) fn gpu_finished(&self) -> Result<bool, CudaError> {
        self.end.is_complete()
    }

    /// StreamOrdered: makes each buffer's own (producer) stream wait on the
    /// op's end event and returns the buffers at once, with no host wait.
    /// Work issued on those streams afterwards sees the op's result.
    ///
    /// # Errors
    ///
    /// The op's error if it already failed, or the CUDA error of the stream
    /// wait.
    pub(crate) fn stream_ordered(self) -> Result<R, Failed<R>> {
        self.take_ordered(None)
    }

    /// StreamOrdered on `stream`: makes `stream` wait on the end event (and
    /// each buffer's producer stream too, so freeing the buffer there stays
    /// ordered after the op) and returns the buffers at once.
    ///
    /// # Errors
    ///
    /// As [`stream_ordered`](Self::stream_ordered).
    pub(crate) fn stream_ordered_on(self, stream: &Stream) -> Result<R, Failed<R>> {
        self.take_ordered(Some(stream))
    }

    fn take_ordered(mut self, stream: Option<&Stream>) -> Result<R, Failed<R>> {
        if self.inner.status() == WorkStatus::Failed {
            // A held op goes to the retire queue with the work's drop
            // unless it has finished.
            return match self.inner.try_take() {
                Some(Err(f)) => Err(self.reclaim(f)),
                _ => Err(Failed::without_buffers(missing(self.inner.context()))),
            };
        }
        let taken = match &mut self.track {
            Some(Track::Held(Held(Some((f, _))))) => f.take_stream_ordered(stream),
            Some(Track::Watched(w)) => w.take_stream_ordered(stream),
            _ => Ok(None),
        };
        match taken {
            // The rest of the op (its bookkeeping) goes to the
            // communicator's retire queue when `self` drops.
            Ok(Some(bufs)) => Ok(bufs),
            Ok(None) => {
                // The reactor completed the op meanwhile: the buffers are in
                // (or about to be in) the work's slot.
                let t0 = std::time::Instant::now();
                loop {
                    if let Some(r) = self.inner.try_take() {
                        return flatten(self.inner.context(), r);
                    }
                    if t0.elapsed() > Duration::from_secs(5) {
                        return Err(Failed::without_buffers(missing(self.inner.context())));
                    }
                    std::thread::yield_now();
                }
            }
            // The op is still held (or watched): its buffers go to the
            // retire queue with the work.
            Err(e) => Err(Failed::without_buffers(WorkError::Backend {
                ctx: self.inner.context().clone(),
                msg: format!("stream-ordered wait failed: {e}"),
            })),
        }
    }

    /// A failure with the op's buffers if they came with it, or if the
    /// op's end event has completed (nothing on the device touches them
    /// any more); else without them (they stay with the op until the end
    /// event completes, see the type's docs).
    fn reclaim(&mut self, f: Failed<Option<R>>) -> Failed<R> {
        let (error, bufs) = f.into_parts();
        let buffers = match bufs.flatten() {
            Some(b) => Some(b),
            None => self.take_if_finished(),
        };
        Failed { error, buffers }
    }

    /// The op's buffers if its end event has completed.
    fn take_if_finished(&mut self) -> Option<R> {
        match &mut self.track {
            Some(Track::Held(held)) => {
                let (f, _) = held.0.as_mut()?;
                if !f.known_ended() {
                    f.bind_device().ok()?;
                }
                let bufs = f.take_finished().ok().flatten()?;
                if let Some((_, c)) = held.0.take() {
                    c.complete(Ok(None));
                }
                Some(bufs)
            }
            Some(Track::Watched(w)) => {
                w.bind_device().ok()?;
                w.take_finished().ok().flatten()
            }
            None => None,
        }
    }

    fn resolved(&mut self, r: Result<Option<R>, Failed<Option<R>>>) -> Result<R, Failed<R>> {
        match r {
            Err(f) => Err(self.reclaim(f)),
            ok => flatten(self.inner.context(), ok),
        }
    }

    /// Hands a held op to the reactor for someone who waits on it.
    fn watch(&mut self) {
        self.hand_over(Held::watch);
    }

    /// Hands a held op to the reactor by `how`; an op handed over already
    /// stays where it is.
    fn hand_over(&mut self, how: impl FnOnce(Held<R>) -> Option<Watched<R>>) {
        if matches!(self.track, Some(Track::Held(_))) {
            if let Some(Track::Held(h)) = self.track.take() {
                self.track = how(h).map(Track::Watched);
            }
        }
    }

    /// GpuFinished, blocking: waits until the GPU finished the op. On
    /// timeout aborts the group (its NCCL communicators are aborted and
    /// every pending op fails) and returns [`WorkError::OpTimeout`].
    ///
    /// # Errors
    ///
    /// The op's error, or the timeout; with the buffers only where the GPU
    /// is known to be done with them (see the type's docs).
    pub(crate) fn wait_timeout(mut self, timeout: Duration) -> Result<R, Failed<R>> {
        let ctx = self.inner.context().clone();
        // A blocking wait watches the end event itself before it sleeps:
        // short ops then return without the reactor and the wake-up
        // latency of a parked thread, for 100 µs; ops due within the
        // reactor's lead for the pre-wake's window, napping until close
        // to their end (see `first_watch`).
        let t0 = std::time::Instant::now();
        let deadline = t0 + timeout;
        let brief = timeout.min(Duration::from_micros(100));
        let short = Duration::from_nanos(u64::from(self.spin_ns));
        if let Some(watch) = self.first_watch(short, brief) {
            if let Some(bufs) = self.watch_briefly(watch.within(timeout)) {
                return Ok(bufs);
            }
        }
        // Sleep until the op is done (its driver waiter completes it), the
        // deadline, or a little before the op's expected end (then watch
        // the end event closely): a parked thread takes long to run again,
        // a watching one sees the end at once. This thread wakes itself for
        // that, so the reactor gives the op no pre-wake (one cold wake-up
        // of its thread less). (An op whose pre-wake instant has passed
        // already is pre-woken by the reactor at once, as for a future.)
        let lead = reactor::global().prewake_lead();
        let mut wake_at = match &self.track {
            Some(Track::Held(Held(Some((f, _))))) if !lead.is_zero() => f
                .expected_end()
                .and_then(|e| e.checked_sub(lead))
                .filter(|&at| at < deadline && at > std::time::Instant::now()),
            _ => None,
        };
        match wake_at {
            Some(_) => self.hand_over(Held::watch_self_timed),
            None => self.watch(),
        }
        loop {
            if let Some(r) = self.inner.wait_until(wake_at.unwrap_or(deadline)) {
                return self.resolved(r);
            }
            let now = std::time::Instant::now();
            if now >= deadline {
                break;
            }
            let due = wake_at.filter(|&at| now >= at);
            let watch = match &self.track {
                Some(Track::Watched(w)) if due.is_some() || w.take_prewake() => {
                    if let Some(at) = due {
                        w.note_own_wake(at);
                    }
                    Some(Watch::woken(w))
                }
                _ => None,
            };
            if let Some(watch) = watch {
                wake_at = None;
                if let Some(bufs) = self.watch_briefly(watch.within(deadline - now)) {
                    return Ok(bufs);
                }
                // Not seen: its driver waiter completes it when it ends.
            }
        }
        self.time_out_after(&ctx, timeout)
    }

    /// A blocking wait of `after` ran out: the op times out, aborting the
    /// group (unless it completed meanwhile).
    pub(super) fn time_out(mut self, after: Duration) -> Result<R, Failed<R>> {
        let ctx = self.inner.context().clone();
        self.time_out_after(&ctx, after)
    }

    fn time_out_after(&mut self, ctx: &OpContext, after: Duration) -> Result<R, Failed<R>> {
        // `inner` is not holding, so this returns at once.
        let inner = std::mem::replace(&mut self.inner, OpFuture::failed(missing(ctx)));
        let r = inner.time_out(after);
        self.resolved(r)
    }

    /// How long the first look at the op, still held, watches it:
    ///
    /// * `brief` (none when zero) for an op not expected to end later than
    ///   `short` from now: short ops, and ops without history;
    /// * the pre-wake's window for an op due to end within the reactor's
    ///   lead: it is watched here, napping until close to its expected
    ///   end, as a pre-woken future would, without being handed to the
    ///   reactor only for it to wake this future (two cold wake-ups);
    /// * none for an op due later: the reactor wakes the future ahead of
    ///   its end.
    fn first_watch(&self, short: Duration, brief: Duration) -> Option<Watch> {
        let Some(Track::Held(Held(Some((f, _))))) = &self.track else {
            return None;
        };
        // The clock only for an op with history.
        let due = f.expected_end().map(|end| (end, std::time::Instant::now()));
        match due {
            Some((end, now)) if end > now + short => {
                let reactor = reactor::global();
                let (config, lead) = (reactor.config(), reactor.prewake_lead());
                (!lead.is_zero() && end <= now + lead).then(|| {
                    let span = f.prewake_watch(end, config.prewake_lead);
                    Watch::prewake(span, Some(end), &config)
                })
            }
            _ => (!brief.is_zero()).then(|| Watch::brief(brief)),
        }
    }

    /// A look at the end event (the first poll's, see `first_watch`, or a
    /// pre-woken future's, see [`Watch`]): the buffers if the op finished
    /// meanwhile.
    fn watch_briefly(&mut self, watch: Watch) -> Option<R> {
        let spin = watch.span;
        // Read on the first miss: an op already seen complete (another of
        // its group's works saw the shared end event) needs no clock.
        let mut t0 = None;
        let mut started = || *t0.get_or_insert_with(std::time::Instant::now);
        match &mut self.track {
            Some(Track::Held(held)) => {
                let (f, _) = held.0.as_mut()?;
                // The awaiting thread may never have used the device (not
                // needed once the op is known to have ended: its group's
                // end event seen by another of its ops, or a later op of
                // its stream seen to end).
                if !f.known_ended() {
                    f.bind_device().ok()?;
                }
                let mut doze: Option<Doze> = None;
                loop {
                    match f.take_finished() {
                        Ok(Some(bufs)) => {
                            // Finished here: complete the work on this
                            // thread; the reactor never sees the op.
                            if let Some((_, c)) = held.0.take() {
                                c.complete(Ok(None));
                            }
                            return Some(bufs);
                        }
                        Ok(None) => {}
                        // The reactor reports it (after the hand-off).
                        Err(_) => return None,
                    }
                    let t0 = started();
                    if self.inner.is_done() || t0.elapsed() >= spin {
                        return None;
                    }
                    pause(&watch, t0 + spin, &mut doze);
                }
            }
            Some(Track::Watched(w)) => {
                // Its driver waiter sleeps meanwhile: whichever sees the
                // end first takes it.
                w.bind_device().ok()?;
                // Far from the expected end, nap (halving the way, then
                // short steps: the thread is awake already, so each ends
                // on time); spin around it; steps again past it (see
                // `Watch`). At least one look, however late the future
                // runs.
                let mut doze: Option<Doze> = None;
                let t0 = started();
                loop {
                    match w.take_finished() {
                        Ok(Some(bufs)) => return Some(bufs),
                        // Running, or its driver waiter is completing it.
                        Ok(None) => {}
                        // Its driver waiter fails the work with it.
                        Err(_) => return None,
                    }
                    if self.inner.is_done() || t0.elapsed() >= spin {
                        return None;
                    }
                    pause(&watch, t0 + spin, &mut doze);
                }
            }
            None => None,
        }
    }
}

/// Between two looks at an op's end event (see [`Watch`]), never past
/// `until`.
fn pause(watch: &Watch, until: Instant, doze: &mut Option<Doze>) {
    match watch.pause_at(Instant::now(), until) {
        Pause::Nap { to, longest } => {
            doze.get_or_insert_with(Doze::new).nap_until(to, longest);
        }
        // A moment's spin, which leaves the driver to the enqueueing
        // threads.
        Pause::Spin => {
            for _ in 0..32 {
                std::hint::spin_loop();
            }
        }
    }
}

/// What a watcher does between two looks at the end event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pause {
    /// Nap towards `to`, for at most `longest` at once.
    Nap {
        to: Instant,
        longest: Duration,
    },
    Spin,
}

impl Watch {
    /// The pause at `now` of a watch that lasts until `until`: naps towards
    /// the close instant while it is ahead, a spin from then until
    /// `spin_until`, even steps after that.
    fn pause_at(&self, now: Instant, until: Instant) -> Pause {
        match (self.close, self.spin_until) {
            (Some(close), _) if now < close && now < until => Pause::Nap {
                to: close.min(until),
                longest: self.longest,
            },
            (_, Some(spun)) if now >= spun && now < until => Pause::Nap {
                to: until,
                longest: chorus_gpu::doze::STEP,
            },
            _ => Pause::Spin,
        }
    }
}

impl<R: DeviceBuffers> Future for OwnWork<R> {
    type Output = Result<R, Failed<R>>;

    /// GpuFinished, as `DeviceWork`'s poll describes: the first poll's
    /// watch (`first_watch`: brief, or until the end of an op due within the
    /// reactor's lead, or none for an op due later), then
    /// the reactor, and a watch of its own once the reactor woke it ahead
    /// of the op's expected end.
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if !self.polled {
            self.polled = true;
            let spin = Duration::from_nanos(u64::from(self.spin_ns));
            if !self.inner.is_done() {
                if let Some(watch) = self.first_watch(spin, spin) {
                    if let Some(bufs) = self.watch_briefly(watch) {
                        return Poll::Ready(Ok(bufs));
                    }
                }
            }
        }
        self.watch();
        // Woken ahead of the op's expected end: watch it end.
        let watch = match &self.track {
            Some(Track::Watched(w)) if w.take_prewake() => Some(Watch::woken(w)),
            _ => None,
        };
        if let Some(watch) = watch {
            if let Some(bufs) = self.watch_briefly(watch) {
                return Poll::Ready(Ok(bufs));
            }
        }
        match Pin::new(&mut self.inner).poll(cx) {
            Poll::Ready(r) => Poll::Ready(self.resolved(r)),
            Poll::Pending => Poll::Pending,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_watch_naps_to_its_close_spin_spins_past_the_expected_end_then_steps() {
        let us = Duration::from_micros;
        let config = ReactorConfig::default();
        let step = chorus_gpu::doze::STEP;
        let t = Instant::now();
        let end = t + us(500);
        let until = t + us(2000);
        let w = Watch::prewake(us(2000), Some(end), &config);
        // Far from the end: naps towards the close spin, at most watch_nap,
        // up to its very start.
        assert_eq!(
            w.pause_at(t + us(499) - config.watch_spin, until),
            Pause::Nap {
                to: end - config.watch_spin,
                longest: config.watch_nap
            }
        );
        assert_eq!(
            w.pause_at(t, until),
            Pause::Nap {
                to: end - config.watch_spin,
                longest: config.watch_nap
            }
        );
        // The spin, from the close spin before the expected end to half
        // the lead and the close spin past it.
        let spun = config.prewake_lead / 2 + config.watch_spin;
        let close = us(500) - config.watch_spin;
        for at in [close, us(500), us(600), us(500) + spun - us(1)] {
            assert_eq!(w.pause_at(t + at, until), Pause::Spin, "{at:?}");
        }
        // Past it, an op still running (an expectation early by much) is
        // looked at in even steps, not spun for.
        for at in [us(500) + spun, us(1200), us(1999)] {
            assert_eq!(
                w.pause_at(t + at, until),
                Pause::Nap {
                    to: until,
                    longest: step
                },
                "{at:?}"
            );
        }
        assert_eq!(w.pause_at(until, until), Pause::Spin);
        // A watch cut short (a deadline before the end) never naps past it.
        let soon = t + us(300);
        assert_eq!(
            w.pause_at(t, soon),
            Pause::Nap {
                to: soon,
                longest: config.watch_nap
            }
        );
        // The first poll's brief watch only spins.
        let b = Watch::brief(us(10));
        assert_eq!(b.pause_at(t, t + us(10)), Pause::Spin);
        // Without an expected end: as if due now.
        let n = Watch::prewake(us(1000), None, &config);
        let now = Instant::now();
        assert_eq!(n.pause_at(now, now + us(1000)), Pause::Spin);
        assert!(matches!(
            n.pause_at(now + spun + us(10), now + us(1000)),
            Pause::Nap { longest, .. } if longest == step
        ));
    }
}
