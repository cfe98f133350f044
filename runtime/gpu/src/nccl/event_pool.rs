//! The end events of a communicator's ops, pooled: an op's end event costs
//! no allocation, and is free again once nobody holds a handle on it.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use chorus_core::work::FinishedProbe;

use crate::cuda::{relax_capture_mode, CudaError, Device, Event};

/// A communicator's end events, each shared (`Arc`) with the ops that
/// use it. An event is free again once the pool holds its only handle (the
/// op's work, registry entry and retire-queue or reactor entry are gone):
/// reuse then needs neither an allocation nor a hand-back from the thread
/// that finished the op, and a stream wait captured before stays valid
/// when it is recorded anew. Scanned round-robin from where the last one was taken (ops finish
/// in stream order, so the next free one is usually the next one).
pub(super) struct EventPool {
    events: Vec<Arc<EndEvent>>,
    next: usize,
}

/// Free events looked for before the pool grows.
const POOL_SCAN: usize = 8;
/// Beyond this many events in flight, an op's end event is its own.
const POOL_MAX: usize = 4096;

impl EventPool {
    /// A free event, or a new one (`create`) added to the pool.
    pub(super) fn take(
        &mut self,
        create: impl FnOnce() -> Result<Event, CudaError>,
    ) -> Result<Arc<EndEvent>, CudaError> {
        let n = self.events.len();
        for k in 0..POOL_SCAN.min(n) {
            let i = (self.next + k) % n;
            // `get_mut` succeeds only on the sole handle, with acquire
            // ordering on the releases of the others.
            if let Some(free) = Arc::get_mut(&mut self.events[i]) {
                // Recorded anew for the next op: its completion is unknown.
                *free.complete.get_mut() = false;
                self.next = (i + 1) % n;
                return Ok(self.events[i].clone());
            }
        }
        let ev = Arc::new(EndEvent {
            event: create()?,
            complete: AtomicBool::new(false),
        });
        END_EVENTS_CREATED.fetch_add(1, Ordering::Relaxed);
        if n < POOL_MAX {
            // Insert at the scan position: it is taken now, and the events
            // after it are the ones most likely free next.
            let at = if n == 0 { 0 } else { self.next };
            self.events.insert(at, ev.clone());
            self.next = (at + 1) % (n + 1);
        }
        Ok(ev)
    }
}

impl EventPool {
    /// An empty pool.
    pub(super) fn new() -> EventPool {
        EventPool {
            events: Vec::new(),
            next: 0,
        }
    }
}

/// An op's end event. It belongs to its communicator's pool, which records
/// it again for a later op once no handle on it is left.
pub struct EndEvent {
    event: Event,
    /// Set once a query found the event complete: the ops of a group share
    /// one end event, and only the first of them to look needs the driver.
    complete: AtomicBool,
}

impl fmt::Debug for EndEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("EndEvent").field(&self.event).finish()
    }
}

impl EndEvent {
    /// The event.
    pub fn event(&self) -> &Event {
        &self.event
    }

    /// True if a query already found the event complete (no driver call).
    pub fn known_complete(&self) -> bool {
        self.complete.load(Ordering::Acquire)
    }

    /// True once the event completed: `cuEventQuery` until one query found
    /// it complete, then without the driver. The op's device must be
    /// current on the calling thread. Only for holders of the op after its
    /// end was recorded (what it remembers must be this op's end).
    ///
    /// # Errors
    ///
    /// The CUDA error of the query (an error of the op; never cached).
    pub fn is_complete(&self) -> Result<bool, CudaError> {
        if self.complete.load(Ordering::Acquire) {
            return Ok(true);
        }
        let done = self.event.query()?;
        if done {
            self.complete.store(true, Ordering::Release);
        }
        Ok(done)
    }
}

impl EndEvent {
    /// Queries the event (`on_reactor`: from the reactor thread): `None`
    /// while the op runs, else how it ended.
    pub(crate) fn outcome(
        &self,
        device: &Device,
        on_reactor: bool,
    ) -> Option<Result<(), CudaError>> {
        if self.complete.load(Ordering::Acquire) {
            return Some(Ok(()));
        }
        // The querying thread may hold another device's context: make the
        // event's current (cheap when it already is).
        let _ = device.bind_to_thread();
        // The reactor's own thread may relax its capture mode; a caller's
        // thread keeps the mode its owner chose.
        if on_reactor {
            relax_capture_mode();
        }
        match self.is_complete() {
            Ok(false) => None,
            Ok(true) => Some(Ok(())),
            Err(e) => Some(Err(e)),
        }
    }
}

/// The watchdog asks an expired op's end event before it times the op out:
/// an op whose work nobody has polled yet may be finished already.
impl FinishedProbe for EndEvent {
    fn finished(&self) -> bool {
        if self.complete.load(Ordering::Acquire) {
            return true;
        }
        // The watchdog thread may never have used the device.
        let bound = Device::get(self.event.device()).and_then(|d| d.bind_to_thread());
        relax_capture_mode();
        // A plain query, never remembered: the watchdog may ask between
        // the event's reservation and its recording, when an event not yet
        // recorded reads as complete.
        bound.is_ok() && matches!(self.event.query(), Ok(true))
    }
}

/// How many end events the communicators' pools have created
/// (process-wide): a pool grows to the most ops it has had in flight at
/// once.
#[cfg(feature = "test-util")]
pub fn end_events_created() -> u64 {
    END_EVENTS_CREATED.load(Ordering::Relaxed)
}

static END_EVENTS_CREATED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
