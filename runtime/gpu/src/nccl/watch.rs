//! Ops handed to the completion reactor: [`Watched`] (the caller's side,
//! which can still take the buffers back stream-ordered), its entry (which
//! a driver waiter completes when the op ends, see `reactor`) and, for an
//! op whose end is expected, its pre-wake (an entry of the reactor
//! thread's that wakes the awaiting future shortly before that end).

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chorus_core::EarlyWake;

use super::buffer::{order_after, DeviceBuffers, DeviceMem};
use super::event_pool::EndEvent;
use super::forecast::Forecast;
use super::retire::Finished;
use crate::cuda::{CudaError, Device, Event, Stream};
use crate::reactor::{self, Pending, Sleeper};
use chorus_core::sync::lock;

/// Hands `entry` to the completion reactor; without a reactor thread, waits
/// for it here.
pub(super) fn register_or_wait(entry: Box<dyn Pending>) {
    if let Err((e, mut entry)) = reactor::global().register(entry) {
        // No reactor thread: complete synchronously (the GPU wait happens
        // here instead of in the background).
        tracing::error!(error = %e, "no completion reactor; waiting on the GPU inline");
        while !entry.poll_complete() {
            std::thread::yield_now();
        }
    }
}

pub(super) struct Cell<C> {
    pub(super) end: Arc<EndEvent>,
    pub(super) bufs: Mutex<Option<C>>,
    pub(super) forecast: Option<Forecast>,
    /// Set once the op's end was told to the forecast table (by whoever saw
    /// it first).
    pub(super) observed: AtomicBool,
    /// Set by the reactor's pre-wake, taken by the woken future.
    pub(super) prewoken: AtomicBool,
    /// Set once the woken future took the pre-wake (for the counters).
    pub(super) prewoken_seen: AtomicBool,
    /// A [`Watched::take_finished`] found the op running: a later one that
    /// finds it done sees the end closely.
    pub(super) watch_pending: AtomicBool,
    /// When the pre-wake was due (set with `prewoken`): how late the woken
    /// future ran is measured from it (`crate::lead`).
    pub(super) prewake_due: Mutex<Option<Instant>>,
    /// Set once the op's end was seen and its buffers taken (by the
    /// entry, or by the awaiting future): its pre-wake is not needed.
    pub(super) finished: AtomicBool,
    /// When a driver waiter that slept on the op's end event saw it end
    /// (it was running when the waiter went to sleep): the end, late by
    /// the waiter's wake-up only.
    pub(super) slept_until: Mutex<Option<Instant>>,
}

static PREWAKES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
static PREWAKE_HITS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Pre-wakes the reactor gave (process-wide), and how many of the woken
/// futures then saw their op end while watching.
#[cfg(feature = "test-util")]
pub fn prewake_counts() -> (u64, u64) {
    (
        PREWAKES.load(Ordering::Relaxed),
        PREWAKE_HITS.load(Ordering::Relaxed),
    )
}

impl<C> Cell<C> {
    /// A new cell for an op ending with `end`, holding `bufs`.
    pub(super) fn new(end: Arc<EndEvent>, bufs: Option<C>, forecast: Option<Forecast>) -> Cell<C> {
        Cell {
            end,
            bufs: Mutex::new(bufs),
            forecast,
            observed: AtomicBool::new(false),
            prewoken: AtomicBool::new(false),
            prewoken_seen: AtomicBool::new(false),
            watch_pending: AtomicBool::new(false),
            prewake_due: Mutex::new(None),
            finished: AtomicBool::new(false),
            slept_until: Mutex::new(None),
        }
    }

    /// Tells the forecast table the op ended at `end` (once).
    fn observe(&self, end: Instant) {
        if let Some(f) = &self.forecast {
            if !self.observed.swap(true, Ordering::Relaxed) {
                f.observe(end);
            }
        }
    }

    /// Tells the forecast table the op ended no later than `end` (once;
    /// see `Forecast::observe_by`).
    fn observe_by(&self, end: Instant) {
        if let Some(f) = &self.forecast {
            if !self.observed.swap(true, Ordering::Relaxed) {
                f.observe_by(end);
            }
        }
    }
}

/// A reactor poll that found the op pending less than this long before the
/// one that found it done saw the end closely enough to learn from it as
/// is.
const CLOSE: Duration = Duration::from_micros(30);

pub(super) struct Entry<C: DeviceBuffers, F> {
    pub(super) order: (u64, u64),
    pub(super) device: Device,
    pub(super) cell: Arc<Cell<C>>,
    pub(super) done: Option<F>,
    /// When a poll last found the op running.
    pub(super) last_pending: Option<Instant>,
}

impl<C: DeviceBuffers, F: FnOnce(Finished<C>) + Send + 'static> Pending for Entry<C, F> {
    fn order(&self) -> Option<(u64, u64)> {
        Some(self.order)
    }

    fn sleeper(&self) -> Option<Arc<dyn Sleeper>> {
        let s: Arc<dyn Sleeper> = Arc::new(EndSleeper {
            device: self.device.clone(),
            cell: self.cell.clone(),
        });
        Some(s)
    }

    fn poll_complete(&mut self) -> bool {
        let now = Instant::now();
        let Some(outcome) = self.cell.end.outcome(&self.device, true) else {
            self.last_pending = Some(now);
            return false;
        };
        // Seen by a driver waiter that slept on it: the end is when it
        // woke. Else seen closely by a poll: the end is now. Otherwise it
        // lies between the last poll that found the op running and this
        // one: take the middle. Never seen running: it ended no later than
        // now.
        let slept = lock(&self.cell.slept_until).take();
        match (slept, self.last_pending) {
            (Some(woke), _) => self.cell.observe(woke),
            (None, Some(t)) if now.duration_since(t) > CLOSE => {
                self.cell.observe(t + now.duration_since(t) / 2)
            }
            (None, Some(_)) => self.cell.observe(now),
            (None, None) => self.cell.observe_by(now),
        }
        let bufs = lock(&self.cell.bufs).take();
        self.cell.finished.store(true, Ordering::Release);
        if let Some(done) = self.done.take() {
            done((outcome, bufs));
        }
        true
    }
}

/// How a driver waiter sleeps until an op's end (see `reactor`).
struct EndSleeper<C> {
    device: Device,
    cell: Arc<Cell<C>>,
}

impl<C: DeviceBuffers> Sleeper for EndSleeper<C> {
    fn sleep_until_end(&self) -> bool {
        crate::cuda::relax_capture_mode();
        // Ended already (or failed): nothing to sleep for, and the end is
        // only bounded from above.
        if self.cell.end.outcome(&self.device, true).is_some() {
            return false;
        }
        let slept = crate::cuda::sleep_until(self.cell.end.event(), &self.device).is_ok();
        if slept {
            *lock(&self.cell.slept_until) = Some(Instant::now());
        }
        slept
    }
}

/// An awaited op's pre-wake, on the reactor thread: wakes the awaiting
/// future the lead in force before the op's expected end, unless the op
/// was seen to end before then (its driver waiter completes it either
/// way).
pub(super) struct Prewake<C> {
    pub(super) cell: Arc<Cell<C>>,
    /// When the op is expected to end, until the pre-wake is done.
    pub(super) expected_end: Option<Instant>,
    /// When the op was handed over: its pre-wake is due no earlier.
    pub(super) handed: Instant,
    /// Wakes the awaiting future.
    pub(super) early: EarlyWake,
}

impl<C: DeviceBuffers> Pending for Prewake<C> {
    fn poll_complete(&mut self) -> bool {
        self.expected_end.is_none() || self.cell.finished.load(Ordering::Acquire)
    }

    fn expected_end(&self) -> Option<Instant> {
        self.expected_end
    }

    fn timer_only(&self) -> bool {
        true
    }

    fn prewake(&mut self, lead: Duration) {
        let Some(end) = self.expected_end.take() else {
            return;
        };
        if self.cell.finished.load(Ordering::Acquire) {
            return;
        }
        PREWAKES.fetch_add(1, Ordering::Relaxed);
        let due = end.checked_sub(lead).unwrap_or(end).max(self.handed);
        *lock(&self.cell.prewake_due) = Some(due);
        self.cell.prewoken.store(true, Ordering::Release);
        self.early.wake();
    }
}

/// A watched op (see [`InFlight::watch`](super::InFlight::watch)).
pub struct Watched<C: DeviceBuffers> {
    pub(super) cell: Arc<Cell<C>>,
}

impl<C: DeviceBuffers> fmt::Debug for Watched<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Watched")
            .field("end", &self.cell.end)
            .finish()
    }
}

impl<C: DeviceBuffers> Watched<C> {
    /// The end event.
    pub fn end_event(&self) -> &Event {
        self.cell.end.event()
    }

    /// GpuFinished without the reactor: if the end event has completed,
    /// takes the buffers. `Ok(None)` while the op runs, or when the buffers
    /// are gone already (taken before, or handed to the completion
    /// callback, which then completes the work). On a thread that may never
    /// have used the op's device, call [`bind_device`](Self::bind_device)
    /// once first.
    ///
    /// # Errors
    ///
    /// The CUDA error of the event query (the reactor reports it too).
    pub fn take_finished(&self) -> Result<Option<C>, CudaError> {
        let mut g = lock(&self.cell.bufs);
        if g.is_none() {
            return Ok(None);
        }
        if !self.cell.end.is_complete()? {
            self.cell.watch_pending.store(true, Ordering::Relaxed);
            return Ok(None);
        }
        if self.cell.watch_pending.load(Ordering::Relaxed) {
            self.cell.observe(Instant::now());
        } else {
            // Found done at once: the end is only bounded from above (and
            // the reactor's bound would be later still).
            self.cell.observe_by(Instant::now());
        }
        if self.cell.prewoken_seen.load(Ordering::Relaxed) {
            PREWAKE_HITS.fetch_add(1, Ordering::Relaxed);
        }
        self.cell.finished.store(true, Ordering::Release);
        Ok(g.take())
    }

    /// True once after the reactor woke the awaiting future ahead of the
    /// op's expected end (see [`InFlight::watch_awaited`](super::InFlight::watch_awaited)):
    /// the future should then watch the end event itself for a while.
    pub fn take_prewake(&self) -> bool {
        let taken = self.cell.prewoken.load(Ordering::Relaxed)
            && self.cell.prewoken.swap(false, Ordering::Acquire);
        if taken {
            self.cell.prewoken_seen.store(true, Ordering::Relaxed);
            // How late after its due instant this future runs: the next
            // ops' lead covers it, where the lead may grow (`crate::lead`).
            // Not if it watched the op before (a blocking wait awake by its
            // own timer): it was running, and takes the pre-wake only after
            // its watch.
            let due = lock(&self.cell.prewake_due).take();
            if let (Some(due), false) = (due, self.cell.watch_pending.load(Ordering::Relaxed)) {
                self.note_own_wake(due);
            }
        }
        taken
    }

    /// The waiter ran now, its wake-up having been due at `due` (a
    /// pre-woken future, or a waiter that wakes itself for the op, see
    /// [`InFlight::watch_self_timed`](super::InFlight::watch_self_timed)):
    /// the delay counts towards the lead in force where the lead may grow
    /// (`crate::lead`).
    pub fn note_own_wake(&self, due: Instant) {
        let config = reactor::global().config();
        if config.prewake_max > config.prewake_lead {
            crate::lead::note(due.elapsed());
        }
    }

    /// When the op is expected to end, if ops like it ended before.
    pub fn expected_end(&self) -> Option<Instant> {
        self.cell.forecast.and_then(|f| f.expected_end())
    }

    /// How long a future woken ahead of the op's expected end should watch
    /// the end event from now, at most: `tail` (the configured lead: the
    /// wake-up's own latency and the expectation's error) twice over and
    /// an eighth of the op's expected length (an op that runs a little
    /// longer than ops like it did is still seen to end closely, and
    /// teaches the table its new length), or until `tail` and that eighth
    /// past the expected end if that is later (a lead grown for late
    /// wake-ups starts the watch earlier, not its end later). Past it, the
    /// reactor's back-off finds the end. `end` is what
    /// [`expected_end`](Self::expected_end) said (read once by the caller;
    /// `None`: no expected length, `tail` twice over).
    pub fn prewake_watch(&self, end: Option<Instant>, tail: Duration) -> Duration {
        let expected = self.cell.forecast.zip(end).map(|(f, e)| (f.submitted, e));
        super::forecast::window(expected, Instant::now(), tail)
    }

    /// Makes the op's device current on the calling thread (a no-op when
    /// the buffers are gone already).
    ///
    /// # Errors
    ///
    /// The CUDA error of binding the device's context.
    pub fn bind_device(&self) -> Result<(), CudaError> {
        let g = lock(&self.cell.bufs);
        match g.as_ref().and_then(|b| b.get(0)) {
            Some(first) => first.stream().device().bind_to_thread(),
            None => Ok(()),
        }
    }

    /// A shared handle on the end event (e.g. for another thread to watch).
    pub fn end_event_handle(&self) -> Arc<EndEvent> {
        self.cell.end.clone()
    }

    /// Stream-ordered completion: makes `stream` (default: each buffer's own
    /// producer stream) wait on the end event and takes the buffers at once,
    /// without a host wait. When `stream` is another stream, each buffer's
    /// producer stream waits too, so freeing a buffer on its own stream is
    /// ordered after the op. `Ok(None)` if the buffers are gone already
    /// (taken before, or handed to the completion callback).
    ///
    /// # Errors
    ///
    /// The CUDA error of a stream wait; the buffers stay with the op.
    pub fn take_stream_ordered(&self, stream: Option<&Stream>) -> Result<Option<C>, CudaError> {
        let mut g = lock(&self.cell.bufs);
        let Some(bufs) = g.as_ref() else {
            return Ok(None);
        };
        order_after(self.cell.end.event(), stream, bufs)?;
        Ok(g.take())
    }
}
