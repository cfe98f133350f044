//! [`InFlight`]: an enqueued op's end event and buffers, which are never
//! released before the end event completed.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::buffer::{order_after, DeviceBuffers};
use super::event_pool::EndEvent;
use super::forecast::Forecast;
use super::progress::StreamProgress;
use super::retire::{Detached, Finished, RetireQueue};
use super::watch::{register_or_wait, Cell, Entry, Prewake, Watched};
use crate::cuda::{CudaError, Device, Event, Stream};
use crate::reactor;

/// An enqueued op: its end event and buffers.
///
/// The buffers are released only after the end event completes: through
/// [`watch`](Self::watch), [`wait`](Self::wait), [`detach`](Self::detach),
/// or — when dropped unfinished — as `detach` does.
pub struct InFlight<C: DeviceBuffers> {
    pub(super) device: Device,
    /// (comm stream, op number on it): end events complete in this order.
    pub(super) order: (u64, u64),
    pub(super) end: Arc<EndEvent>,
    pub(super) bufs: Option<C>,
    /// Where [`detach`](Self::detach) leaves the op: its communicator's
    /// retire queue, else the reactor.
    pub(super) retire: Option<Arc<RetireQueue>>,
    /// The op's key and submission, to learn and expect when ops like it
    /// end (a lone op, a coalesced op or a whole group as one; `None` for
    /// an op of a group, which ends with it).
    pub(super) forecast: Option<Forecast>,
}

impl<C: DeviceBuffers> fmt::Debug for InFlight<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InFlight").field("end", &self.end).finish()
    }
}

impl<C: DeviceBuffers> InFlight<C> {
    /// The end event.
    pub fn end_event(&self) -> &Event {
        self.end.event()
    }

    /// Blocks until the end event completes and returns the buffers
    /// (`None` if they were taken before). For tests and sync code.
    ///
    /// # Errors
    ///
    /// The CUDA error of the op; the buffers are then leaked only if the
    /// device is unusable (never freed while the GPU may use them).
    pub fn wait(mut self) -> Result<Option<C>, CudaError> {
        self.end.event().synchronize()?;
        Ok(self.bufs.take())
    }

    /// A shared handle on the end event.
    pub fn end_event_handle(&self) -> Arc<EndEvent> {
        self.end.clone()
    }

    /// Makes the op's device current on the calling thread.
    ///
    /// # Errors
    ///
    /// The CUDA error of binding the device's context.
    pub fn bind_device(&self) -> Result<(), CudaError> {
        self.device.bind_to_thread()
    }

    /// True if the op is known to have ended without asking the driver:
    /// its end event was found complete, or a later op of its stream was
    /// (see `progress`).
    pub fn known_ended(&self) -> bool {
        self.end.known_complete() || self.progress().is_some_and(|p| p.ended(self.order.1))
    }

    fn progress(&self) -> Option<&StreamProgress> {
        self.retire.as_deref().map(|q| &q.progress)
    }

    /// GpuFinished without the reactor: if the end event has completed,
    /// takes the buffers. `Ok(None)` while the op runs, or when they were
    /// taken before. Unless the op is [known to have
    /// ended](Self::known_ended), the op's device must be current (see
    /// [`bind_device`](Self::bind_device)).
    ///
    /// An op found ended at its first look tells its stream's progress,
    /// which then asks the newest op of the stream once whether it ended
    /// too: ops awaited after it then need no query (see `progress`).
    ///
    /// # Errors
    ///
    /// The CUDA error of the event query (an error of the op).
    pub fn take_finished(&mut self) -> Result<Option<C>, CudaError> {
        if self.bufs.is_none() {
            return Ok(None);
        }
        let pos = self.order.1;
        let known = self.progress().is_some_and(|p| p.known(pos));
        if !known {
            if !self.end.is_complete()? {
                if let Some(f) = self.forecast.as_mut() {
                    f.seen_running = true;
                }
                return Ok(None);
            }
            if let Some(p) = self.progress() {
                p.saw_ended(pos);
                if !self.forecast.is_some_and(|f| f.seen_running) {
                    p.catch_up(pos);
                }
            }
        }
        if let Some(f) = &self.forecast {
            match (f.seen_running, known) {
                (true, _) => f.observe(std::time::Instant::now()),
                // Found done at its own first query: it ended no later
                // than now. (Known ended from a later op of its stream,
                // it ended long before: the bound would teach nothing,
                // and ops awaited in a row would each pay for it.)
                (false, false) => f.observe_by(std::time::Instant::now()),
                (false, true) => {}
            }
        }
        Ok(self.bufs.take())
    }

    /// When the op is expected to end, if ops like it ended before (as
    /// [`Watched::expected_end`]).
    pub fn expected_end(&self) -> Option<std::time::Instant> {
        self.forecast.and_then(|f| f.expected_end())
    }

    /// How long from now a future that awaits this op, due to end within
    /// the reactor's lead at `end` (what [`expected_end`](Self::expected_end)
    /// said), should watch it itself instead of handing it over, `tail`
    /// being the configured lead: as [`Watched::prewake_watch`], without a
    /// second look at what ops like it did.
    pub fn prewake_watch(&self, end: std::time::Instant, tail: Duration) -> Duration {
        let expected = self.forecast.map(|f| (f.submitted, end));
        super::forecast::window(expected, std::time::Instant::now(), tail)
    }

    /// Stream-ordered completion, as [`Watched::take_stream_ordered`].
    ///
    /// # Errors
    ///
    /// The CUDA error of a stream wait; the buffers stay with the op.
    pub fn take_stream_ordered(&mut self, stream: Option<&Stream>) -> Result<Option<C>, CudaError> {
        let Some(bufs) = self.bufs.as_ref() else {
            return Ok(None);
        };
        order_after(self.end.event(), stream, bufs)?;
        Ok(self.bufs.take())
    }

    /// Hands the op to the completion reactor: `done` runs once the end
    /// event completed (or failed), on the thread that saw it (a driver
    /// waiter that sleeps until the op's end, see `reactor`). The returned
    /// handle can take the buffers early with a stream-ordered wait.
    pub fn watch<F>(self, done: F) -> Watched<C>
    where
        F: FnOnce(Finished<C>) + Send + 'static,
    {
        self.watch_awaited(done, None)
    }

    /// [`watch`](Self::watch) for an op someone awaits: when ops like it
    /// ended alike before, the reactor thread also wakes the awaiting
    /// future through `early` shortly before this one is expected to end
    /// (the lead in force,
    /// [`ReactorConfig::prewake_lead`](crate::reactor::ReactorConfig::prewake_lead)),
    /// so that it is awake to see the end ([`Watched::take_prewake`]).
    pub fn watch_awaited<F>(self, done: F, early: Option<chorus_core::EarlyWake>) -> Watched<C>
    where
        F: FnOnce(Finished<C>) + Send + 'static,
    {
        let (watched, entry, expected_end) = self.into_entry(done);
        register_or_wait(Box::new(entry));
        if let (Some(early), Some(end)) = (early, expected_end) {
            let prewake = Prewake {
                cell: watched.cell.clone(),
                expected_end: Some(end),
                handed: std::time::Instant::now(),
                early,
            };
            if let Err((e, _)) = reactor::global().register(Box::new(prewake)) {
                tracing::warn!(error = %e, "no pre-wake for an awaited op");
            }
        }
        watched
    }

    /// [`watch`](Self::watch) for an op whose waiter wakes itself (a
    /// blocking wait, parked until a lead before the op's expected end) and
    /// then watches the end event itself, for the window a pre-woken
    /// future would (see [`Watched::prewake_watch`]): the reactor thread
    /// gives it no pre-wake. Its driver waiter completes it when it ends,
    /// however that compares with what was expected.
    pub fn watch_self_timed<F>(self, done: F) -> Watched<C>
    where
        F: FnOnce(Finished<C>) + Send + 'static,
    {
        let (watched, entry, _) = self.into_entry(done);
        register_or_wait(Box::new(entry));
        watched
    }

    /// Lets go of an op nobody waits for: `done` runs once the end event
    /// completed (or failed), with the buffers still held, if any. An op of
    /// a communicator goes to its retire queue: a later op let go of on
    /// the communicator runs `done` on its own thread, or the queue's
    /// sweeper on the reactor thread does once nobody lets go of more (see
    /// the `retire` module). Otherwise the reactor watches it as a
    /// detached entry (checked every
    /// [`detached_poll`](crate::reactor::ReactorConfig::detached_poll), no
    /// wake-up).
    pub fn detach<F>(mut self, done: F)
    where
        F: FnOnce(Finished<C>) + Send + 'static,
    {
        let entry = Detached {
            order: self.order,
            device: self.device.clone(),
            end: self.end.clone(),
            bufs: self.bufs.take(),
            done: Some(done),
        };
        if let Some(q) = self.retire.take() {
            q.push(Box::new(entry));
            return;
        }
        if let Err((e, mut entry)) = reactor::global().register_detached(Box::new(entry)) {
            tracing::error!(error = %e, "no completion reactor; waiting on the GPU inline");
            while !entry.poll_complete() {
                std::thread::yield_now();
            }
        }
    }

    /// The op's entry, its caller's handle and when it is expected to end.
    #[allow(clippy::type_complexity)]
    fn into_entry<F>(mut self, done: F) -> (Watched<C>, Entry<C, F>, Option<std::time::Instant>)
    where
        F: FnOnce(Finished<C>) + Send + 'static,
    {
        let forecast = self.forecast.take();
        let cell = Arc::new(Cell::new(self.end.clone(), self.bufs.take(), forecast));
        let expected_end = forecast.and_then(|f| f.expected_end());
        let seen_running = forecast.is_some_and(|f| f.seen_running);
        let entry = Entry {
            order: self.order,
            device: self.device.clone(),
            cell: cell.clone(),
            done: Some(done),
            // A look before the hand-off found it running (a first poll's
            // watch that ran out): it ends after now, so a poll that finds
            // it done bounds its end from both sides.
            last_pending: seen_running.then(std::time::Instant::now),
        };
        (Watched { cell }, entry, expected_end)
    }
}

impl<C: DeviceBuffers> Drop for InFlight<C> {
    fn drop(&mut self) {
        if let Some(bufs) = self.bufs.take() {
            if self.known_ended() || matches!(self.end.is_complete(), Ok(true)) {
                return;
            }
            // Unfinished: the communicator's retire queue (or the reactor)
            // keeps the buffers until the GPU is done.
            let f = InFlight {
                device: self.device.clone(),
                order: self.order,
                end: self.end.clone(),
                bufs: Some(bufs),
                retire: self.retire.take(),
                forecast: None,
            };
            f.detach(|_| {});
        }
    }
}
