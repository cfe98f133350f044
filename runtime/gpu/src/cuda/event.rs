//! [`Event`]: events without timing, and the stream waits on them.

use cudarc::driver::{result, sys, DriverError};

use super::device::Device;
use super::error::{driver_error, CudaError};
use super::stream::Stream;

/// A CUDA event without timing. Record it on a stream, then query it, wait
/// for it on the host, or make another stream wait for it.
///
/// Events are created with [`Device::new_event`] or, for host waits that
/// sleep until the GPU signals, [`Device::new_blocking_event`].
pub struct Event {
    raw: sys::CUevent,
    /// Keeps the context alive for the event and binds it to destroy it.
    device: Device,
    blocking: bool,
}

// SAFETY: a CUevent is a driver handle usable from any thread (the driver
// synchronizes its own use of it); `Event` hands it out only by value or
// through `&self` methods that make single driver calls.
unsafe impl Send for Event {}
// SAFETY: as above: every `&self` method is one thread-safe driver call.
unsafe impl Sync for Event {}

impl std::fmt::Debug for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Event")
            .field("device", &self.device.ordinal())
            .field("handle", &self.raw)
            .field("blocking", &self.blocking)
            .finish()
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        if self.device.bind_to_thread().is_ok() {
            // SAFETY: `raw` was created by `cuEventCreate` and is destroyed
            // once, here; the driver defers the release of an event still
            // pending on a stream until it completes.
            let _ = unsafe { result::event::destroy(self.raw) };
        }
    }
}

impl Event {
    /// Captures the work issued to `stream` so far (`cuEventRecord`); the
    /// event completes when that work does. Re-recording moves the event.
    ///
    /// # Errors
    ///
    /// [`CudaError::DeviceMismatch`] when the stream is on another device,
    /// [`CudaError::Driver`] when the driver refuses.
    pub fn record(&self, stream: &Stream) -> Result<(), CudaError> {
        stream.device().bind_to_thread()?;
        self.record_bound(stream)
    }

    /// [`record`](Self::record) for a caller that has already made the
    /// stream's context current on this thread ([`Device::bind_to_thread`]).
    ///
    /// # Errors
    ///
    /// As [`record`](Self::record).
    pub fn record_bound(&self, stream: &Stream) -> Result<(), CudaError> {
        if stream.device().ordinal() != self.device.ordinal() {
            return Err(CudaError::DeviceMismatch {
                what: "Event::record",
                event_device: self.device.ordinal(),
                stream_device: stream.device().ordinal(),
            });
        }
        // SAFETY: both handles are alive (owned by `self` and `stream`); a
        // wrong current context is reported by the driver as an error.
        let rc = unsafe { sys::cuEventRecord(self.as_raw(), stream.as_raw()) };
        rc.result().map_err(|e| driver_error("cuEventRecord", e))
    }

    /// Whether the captured work has completed, without waiting
    /// (`cuEventQuery`). An event never recorded is complete.
    ///
    /// # Errors
    ///
    /// Any CUDA error other than "not ready" — including errors of earlier
    /// asynchronous work such as a kernel fault — as [`CudaError::Driver`],
    /// never as "not finished".
    pub fn query(&self) -> Result<bool, CudaError> {
        // SAFETY: the event handle is alive (owned by `self`).
        let r = unsafe { result::event::query(self.raw) };
        query_outcome(r)
    }

    /// Blocks the calling thread until the event completes
    /// (`cuEventSynchronize`): asleep until the GPU signals it for a
    /// [blocking](Device::new_blocking_event) event, spinning otherwise.
    /// There is no timeout: an event whose work never ends blocks forever.
    ///
    /// # Errors
    ///
    /// [`CudaError::Driver`] with any error of the captured work.
    pub fn synchronize(&self) -> Result<(), CudaError> {
        self.device.bind_to_thread()?;
        // SAFETY: the event handle is alive (owned by `self`).
        unsafe { result::event::synchronize(self.raw) }
            .map_err(|e| driver_error("cuEventSynchronize", e))
    }

    /// The device the event belongs to.
    pub fn device(&self) -> usize {
        self.device.ordinal()
    }

    /// True for an event made by [`Device::new_blocking_event`].
    pub fn is_blocking(&self) -> bool {
        self.blocking
    }

    /// The raw `CUevent` handle. Valid while this event lives.
    pub fn as_raw(&self) -> sys::CUevent {
        self.raw
    }
}

/// Maps `cuEventQuery`'s result: success is complete, `NOT_READY` is
/// pending, anything else is an error (never "pending").
pub(crate) fn query_outcome(r: Result<(), DriverError>) -> Result<bool, CudaError> {
    match r {
        Ok(()) => Ok(true),
        Err(DriverError(sys::CUresult::CUDA_ERROR_NOT_READY)) => Ok(false),
        Err(e) => Err(driver_error("cuEventQuery", e)),
    }
}

impl Device {
    /// A new event without timing (`CU_EVENT_DISABLE_TIMING`), the cheapest
    /// kind to record and query.
    ///
    /// # Errors
    ///
    /// [`CudaError::Driver`] when the event cannot be created.
    pub fn new_event(&self) -> Result<Event, CudaError> {
        self.event_with(false)
    }

    /// A new event without timing whose host waits sleep
    /// (`CU_EVENT_BLOCKING_SYNC`): [`Event::synchronize`] blocks the thread
    /// until the GPU signals the event's completion, instead of spinning.
    ///
    /// # Errors
    ///
    /// [`CudaError::Driver`] when the event cannot be created.
    pub fn new_blocking_event(&self) -> Result<Event, CudaError> {
        self.event_with(true)
    }

    fn event_with(&self, blocking: bool) -> Result<Event, CudaError> {
        let mut flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
        if blocking {
            flags |= sys::CUevent_flags::CU_EVENT_BLOCKING_SYNC as u32;
        }
        self.bind_to_thread()?;
        let mut raw: sys::CUevent = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer for the new handle; the
        // device's context is current on this thread.
        let rc = unsafe { sys::cuEventCreate(&mut raw, flags) };
        rc.result().map_err(|e| driver_error("cuEventCreate", e))?;
        Ok(Event {
            raw,
            device: self.clone(),
            blocking,
        })
    }
}

impl Stream {
    /// Makes all work issued to this stream after this call wait until
    /// `event` completes (`cuStreamWaitEvent`). No host wait. The event may
    /// belong to another device.
    ///
    /// # Errors
    ///
    /// [`CudaError::Driver`] when the driver refuses.
    pub fn wait_event(&self, event: &Event) -> Result<(), CudaError> {
        self.device().bind_to_thread()?;
        self.wait_event_bound(event)
    }

    /// [`wait_event`](Self::wait_event) for a caller that has already made
    /// the stream's context current on this thread
    /// ([`Device::bind_to_thread`]): one driver call, no context check
    /// (the op path binds once per op, not once per call).
    ///
    /// # Errors
    ///
    /// [`CudaError::Driver`] when the driver refuses (for example when
    /// another context is current).
    pub fn wait_event_bound(&self, event: &Event) -> Result<(), CudaError> {
        // SAFETY: both handles are alive (owned by `self` and `event`); a
        // wrong current context is reported by the driver as an error.
        let rc = unsafe {
            sys::cuStreamWaitEvent(
                self.as_raw(),
                event.as_raw(),
                sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT as u32,
            )
        };
        rc.result()
            .map_err(|e| driver_error("cuStreamWaitEvent", e))
    }
}
