//! [`Event`]: events without timing, and the stream waits on them.

use cudarc::driver::{result, sys, CudaEvent, DriverError};

use super::device::Device;
use super::error::{driver_error, CudaError};
use super::stream::Stream;

/// A CUDA event without timing. Record it on a stream, then query it, wait
/// for it on the host, or make another stream wait for it.
pub struct Event {
    inner: CudaEvent,
    device: usize,
}

impl std::fmt::Debug for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Event")
            .field("device", &self.device)
            .field("handle", &self.inner.cu_event())
            .finish()
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
        if stream.device().ordinal() != self.device {
            return Err(CudaError::DeviceMismatch {
                what: "Event::record",
                event_device: self.device,
                stream_device: stream.device().ordinal(),
            });
        }
        self.inner
            .record(stream.cudarc())
            .map_err(|e| driver_error("cuEventRecord", e))
    }

    /// [`record`](Self::record) for a caller that has already made the
    /// stream's context current on this thread ([`Device::bind_to_thread`]).
    ///
    /// # Errors
    ///
    /// As [`record`](Self::record).
    pub fn record_bound(&self, stream: &Stream) -> Result<(), CudaError> {
        if stream.device().ordinal() != self.device {
            return Err(CudaError::DeviceMismatch {
                what: "Event::record",
                event_device: self.device,
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
        // SAFETY: the event handle is alive (owned by `self.inner`).
        let r = unsafe { result::event::query(self.inner.cu_event()) };
        query_outcome(r)
    }

    /// Blocks the calling thread until the event completes
    /// (`cuEventSynchronize`). For tests and sync code paths.
    ///
    /// # Errors
    ///
    /// [`CudaError::Driver`] with any error of the captured work.
    pub fn synchronize(&self) -> Result<(), CudaError> {
        self.inner
            .synchronize()
            .map_err(|e| driver_error("cuEventSynchronize", e))
    }

    /// The device the event belongs to.
    pub fn device(&self) -> usize {
        self.device
    }

    /// The raw `CUevent` handle. Valid while this event lives.
    pub fn as_raw(&self) -> sys::CUevent {
        self.inner.cu_event()
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
        let inner = self
            .context()
            .new_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))
            .map_err(|e| driver_error("cuEventCreate", e))?;
        Ok(Event {
            inner,
            device: self.ordinal(),
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
        self.cudarc()
            .wait(&event.inner)
            .map_err(|e| driver_error("cuStreamWaitEvent", e))
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
