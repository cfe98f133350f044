//! The CUDA layer: the only place in chorus-runtime that calls the CUDA
//! driver (through cudarc, loaded at run time).
//!
//! * [`driver`]: finds and initializes the driver once; no driver library or
//!   no GPU is [`CudaError::Unavailable`], never a panic.
//! * [`Device`]: one primary context per GPU, shared by every caller.
//! * [`Stream`]: non-blocking streams with a priority
//!   (`cuStreamCreateWithPriority`), [`Stream::wait_event`]
//!   (`cuStreamWaitEvent`), and device-memory helpers for tests.
//! * [`Event`]: events without timing (`CU_EVENT_DISABLE_TIMING`);
//!   [`Event::query`] tells "not finished" (`Ok(false)`) apart from a real
//!   CUDA error (`Err`), unlike a plain `is_complete() -> bool`.
//! * [`StreamHold`]: holds a stream at a point until released, so tests can
//!   observe "not finished yet" without timing assumptions.
//! * [`nccl`]: NCCL communicators (non-blocking init, blocking twins for
//!   ops), device buffers, in-flight ops; [`nccl::batch`]: several ops in
//!   one NCCL group, and CUDA graph capture ([`nccl::batch::Capture`],
//!   [`nccl::batch::Graph`]).
//!
//! Nothing else in chorus-runtime depends on CUDA: this module only does
//! work when called, so the TCP backend runs on machines without a GPU.

mod hold;
pub mod kernels;
#[cfg(test)]
mod tests;

use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{result, sys, CudaContext, CudaEvent, CudaStream, DriverError};

pub use cudarc::driver::{CudaSlice, DeviceRepr, ValidAsZeroBits};
pub use hold::StreamHold;

/// What went wrong in the CUDA layer.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CudaError {
    /// There is no usable CUDA here: no driver library, no GPU, or a driver
    /// that cannot start. The TCP backend still works.
    #[error(
        "CUDA unavailable: {reason}; the NCCL backend needs an NVIDIA GPU and driver \
         (use the TCP backend on machines without one)"
    )]
    Unavailable {
        /// What was missing or failed.
        reason: String,
    },
    /// The device ordinal is out of range.
    #[error(
        "CUDA device {ordinal} does not exist: {count} device(s) visible \
         (check CUDA_VISIBLE_DEVICES and the rank-to-device mapping)"
    )]
    NoSuchDevice {
        /// The ordinal asked for.
        ordinal: usize,
        /// The number of visible devices.
        count: usize,
    },
    /// A driver call failed.
    #[error("{call} failed: {name} (CUDA error {code})")]
    Driver {
        /// The driver function.
        call: &'static str,
        /// The `CUresult` code.
        code: i32,
        /// Its name, e.g. `CUDA_ERROR_ILLEGAL_ADDRESS`.
        name: String,
    },
    /// A host and a device buffer of different lengths were paired.
    #[error("{what}: {found} elements where {expected} were expected")]
    LengthMismatch {
        /// The operation.
        what: &'static str,
        /// The length required.
        expected: usize,
        /// The length given.
        found: usize,
    },
    /// An event and a stream of different devices were paired where CUDA
    /// requires one device.
    #[error(
        "{what}: event is on device {event_device} but the stream is on device {stream_device}"
    )]
    DeviceMismatch {
        /// The operation.
        what: &'static str,
        /// The event's device.
        event_device: usize,
        /// The stream's device.
        stream_device: usize,
    },
}

/// A failed driver call as a [`CudaError::Driver`]. The name comes from the
/// `CUresult` enum itself, so building the error needs no driver call.
pub(crate) fn driver_error(call: &'static str, e: DriverError) -> CudaError {
    CudaError::Driver {
        call,
        code: e.0 as i32,
        name: format!("{:?}", e.0),
    }
}

/// Puts the calling thread in relaxed stream-capture mode, once per thread:
/// its event queries stay legal while another thread captures a CUDA graph
/// in global mode (the completion reactor's threads call this).
pub(crate) fn relax_capture_mode() {
    thread_local!(static RELAXED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) });
    RELAXED.with(|r| {
        if !r.get() {
            r.set(true);
            let mut mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
            // SAFETY: `mode` is a valid in/out cell; the call only changes
            // this thread's capture mode.
            let _ = guarded("cuThreadExchangeStreamCaptureMode", || unsafe {
                sys::cuThreadExchangeStreamCaptureMode(&mut mode)
            });
        }
    });
}

/// Runs a cudarc call that may panic when the driver library or one of its
/// symbols is missing, turning the panic into [`CudaError::Unavailable`].
/// The probe in [`driver`] makes this a last resort.
pub(crate) fn guarded<T>(call: &'static str, f: impl FnOnce() -> T) -> Result<T, CudaError> {
    std::panic::catch_unwind(AssertUnwindSafe(f)).map_err(|payload| {
        let msg = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or("no message");
        CudaError::Unavailable {
            reason: format!(
                "the CUDA driver library is unusable ({call} failed inside cudarc: {msg})"
            ),
        }
    })
}

/// The driver chorus runs on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DriverInfo {
    /// The driver library name that loaded (e.g. `libcuda.so.1`).
    pub library: String,
    /// `cuDriverGetVersion`: 1000 × major + 10 × minor (13000 is CUDA 13.0).
    pub version: i32,
    /// Number of visible devices (at least 1).
    pub device_count: usize,
}

/// Finds the driver library and initializes CUDA, once per process; later
/// calls return the same answer.
///
/// # Errors
///
/// [`CudaError::Unavailable`] when no driver library loads, `cuInit` fails
/// (no GPU, driver/library mismatch, stub library) or no device is visible.
pub fn driver() -> Result<&'static DriverInfo, CudaError> {
    static DRIVER: OnceLock<Result<DriverInfo, CudaError>> = OnceLock::new();
    DRIVER
        .get_or_init(init_driver)
        .as_ref()
        .map_err(Clone::clone)
}

/// Number of visible CUDA devices.
///
/// # Errors
///
/// As [`driver`].
pub fn device_count() -> Result<usize, CudaError> {
    driver().map(|d| d.device_count)
}

fn init_driver() -> Result<DriverInfo, CudaError> {
    let mut names = cudarc::get_lib_name_candidates("cuda");
    let mut seen = std::collections::HashSet::new();
    names.retain(|n| seen.insert(n.clone()));
    let library = probe_library(&names)?;
    let unavailable = |call: &str, e: DriverError| CudaError::Unavailable {
        reason: format!("{call} failed: {:?} (CUDA error {})", e.0, e.0 as i32),
    };
    guarded("cuInit", result::init)?.map_err(|e| unavailable("cuInit", e))?;
    let mut version = 0;
    // SAFETY: `version` is a valid, writable int for the driver to fill.
    let rc = guarded("cuDriverGetVersion", || unsafe {
        sys::cuDriverGetVersion(&mut version)
    })?;
    rc.result()
        .map_err(|e| unavailable("cuDriverGetVersion", e))?;
    let count = guarded("cuDeviceGetCount", result::device::get_count)?
        .map_err(|e| unavailable("cuDeviceGetCount", e))?;
    if count <= 0 {
        return Err(CudaError::Unavailable {
            reason: "the driver sees no CUDA device (check CUDA_VISIBLE_DEVICES)".to_owned(),
        });
    }
    Ok(DriverInfo {
        library,
        version,
        device_count: count as usize,
    })
}

/// Returns the first of `candidates` that the dynamic linker can open, in
/// the order cudarc will try them, so cudarc's own loader (which panics when
/// it finds nothing) is only reached when it will succeed.
pub(crate) fn probe_library(candidates: &[String]) -> Result<String, CudaError> {
    let mut first_failure = None;
    for name in candidates {
        // SAFETY: loading the CUDA driver library runs its initialisers,
        // which is what cudarc does next anyway; the handle is closed again
        // at once (cudarc keeps its own).
        match unsafe { libloading::Library::new(name.as_str()) } {
            Ok(_lib) => return Ok(name.clone()),
            Err(e) => {
                if first_failure.is_none() {
                    let mut text = e.to_string();
                    if let Some(src) = std::error::Error::source(&e) {
                        text = format!("{text}: {src}");
                    }
                    first_failure = Some(text);
                }
            }
        }
    }
    Err(CudaError::Unavailable {
        reason: format!(
            "no CUDA driver library could be loaded (tried {}{})",
            candidates.join(", "),
            first_failure
                .map(|f| format!("; first failure: {f}"))
                .unwrap_or_default()
        ),
    })
}

/// A CUDA device and its primary context. Cheap to clone; every
/// [`Device::get`] of one ordinal returns the same context.
#[derive(Clone)]
pub struct Device {
    ctx: Arc<CudaContext>,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("ordinal", &self.ctx.ordinal())
            .finish_non_exhaustive()
    }
}

impl Device {
    /// The device with this ordinal, retaining its primary context on first
    /// use (the context the CUDA runtime, PyTorch and NCCL use too).
    ///
    /// # Errors
    ///
    /// [`CudaError::Unavailable`] without CUDA, [`CudaError::NoSuchDevice`]
    /// for an ordinal out of range, [`CudaError::Driver`] when retaining the
    /// context fails.
    pub fn get(ordinal: usize) -> Result<Device, CudaError> {
        static CONTEXTS: OnceLock<Mutex<Vec<Option<Arc<CudaContext>>>>> = OnceLock::new();
        let count = driver()?.device_count;
        if ordinal >= count {
            return Err(CudaError::NoSuchDevice { ordinal, count });
        }
        let contexts = CONTEXTS.get_or_init(|| Mutex::new(vec![None; count]));
        // A panic while holding this lock cannot leave the vector half
        // written, so a poisoned lock is still usable.
        let mut contexts = contexts.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(Some(ctx)) = contexts.get(ordinal) {
            return Ok(Device { ctx: ctx.clone() });
        }
        let ctx = guarded("cuDevicePrimaryCtxRetain", || CudaContext::new(ordinal))?
            .map_err(|e| driver_error("cuDevicePrimaryCtxRetain", e))?;
        if let Some(slot) = contexts.get_mut(ordinal) {
            *slot = Some(ctx.clone());
        }
        Ok(Device { ctx })
    }

    /// The device ordinal.
    pub fn ordinal(&self) -> usize {
        self.ctx.ordinal()
    }

    /// The device name, e.g. `NVIDIA H200`.
    ///
    /// # Errors
    ///
    /// [`CudaError::Driver`] if the driver cannot tell.
    pub fn name(&self) -> Result<String, CudaError> {
        self.ctx
            .name()
            .map_err(|e| driver_error("cuDeviceGetName", e))
    }

    /// The cudarc context, for what this module does not wrap.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// Makes this device's primary context current on the calling thread
    /// (NCCL's communicator init and the CUDA runtime API use it).
    ///
    /// # Errors
    ///
    /// [`CudaError::Driver`] when `cuCtxSetCurrent` fails.
    pub fn bind_to_thread(&self) -> Result<(), CudaError> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| driver_error("cuCtxSetCurrent", e))
    }

    /// The stream priorities this device supports.
    ///
    /// # Errors
    ///
    /// [`CudaError::Driver`] when the query fails.
    pub fn stream_priority_range(&self) -> Result<PriorityRange, CudaError> {
        self.bind_to_thread()?;
        let (least, greatest) = result::stream::get_priority_range()
            .map_err(|e| driver_error("cuCtxGetStreamPriorityRange", e))?;
        Ok(PriorityRange { least, greatest })
    }

    /// A new non-blocking stream (it does not synchronize with the legacy
    /// default stream) with the given priority
    /// (`cuStreamCreateWithPriority(CU_STREAM_NON_BLOCKING)`).
    ///
    /// # Errors
    ///
    /// [`CudaError::Driver`] when the stream cannot be created.
    pub fn new_stream(&self, priority: StreamPriority) -> Result<Stream, CudaError> {
        let priority = self.stream_priority_range()?.resolve(priority);
        let inner = self
            .ctx
            .new_stream_with_priority(priority)
            .map_err(|e| driver_error("cuStreamCreateWithPriority", e))?;
        Ok(Stream {
            inner,
            device: self.clone(),
        })
    }

    /// A new event without timing (`CU_EVENT_DISABLE_TIMING`), the cheapest
    /// kind to record and query.
    ///
    /// # Errors
    ///
    /// [`CudaError::Driver`] when the event cannot be created.
    pub fn new_event(&self) -> Result<Event, CudaError> {
        let inner = self
            .ctx
            .new_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))
            .map_err(|e| driver_error("cuEventCreate", e))?;
        Ok(Event {
            inner,
            device: self.ordinal(),
        })
    }

    /// Free and total device memory in bytes (`cuMemGetInfo`).
    ///
    /// # Errors
    ///
    /// [`CudaError::Driver`] when the query fails.
    pub fn memory_info(&self) -> Result<(usize, usize), CudaError> {
        self.ctx
            .mem_get_info()
            .map_err(|e| driver_error("cuMemGetInfo", e))
    }

    /// Blocks until all work on the device is done (`cuCtxSynchronize`).
    /// For tests and shutdown, not for the op path.
    ///
    /// # Errors
    ///
    /// [`CudaError::Driver`] with any error of that work.
    pub fn synchronize(&self) -> Result<(), CudaError> {
        self.ctx
            .synchronize()
            .map_err(|e| driver_error("cuCtxSynchronize", e))
    }
}

/// A device's stream priorities. CUDA counts backwards: `greatest` is the
/// numerically smallest value and the highest priority.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PriorityRange {
    /// Lowest priority (usually 0, the default).
    pub least: i32,
    /// Highest priority (e.g. -5 on recent GPUs).
    pub greatest: i32,
}

impl PriorityRange {
    /// The CUDA priority value for `p`, clamped into the range.
    pub fn resolve(&self, p: StreamPriority) -> i32 {
        match p {
            StreamPriority::Normal => self.least,
            StreamPriority::Highest => self.greatest,
            StreamPriority::Value(v) => v.clamp(self.greatest, self.least),
        }
    }
}

/// The priority of a new stream.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StreamPriority {
    /// The default (lowest) priority.
    #[default]
    Normal,
    /// The highest priority the device has: what communication streams use
    /// so collectives are not starved by compute kernels.
    Highest,
    /// A raw CUDA priority value (smaller is higher), clamped into the
    /// device's range.
    Value(i32),
}

/// A CUDA stream. Cheap to clone (shared handle); destroyed when the last
/// clone and every buffer allocated on it are gone.
#[derive(Clone)]
pub struct Stream {
    inner: Arc<CudaStream>,
    device: Device,
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stream")
            .field("device", &self.device.ordinal())
            .field("handle", &self.inner.cu_stream())
            .finish()
    }
}

impl Stream {
    /// Wraps a cudarc stream (e.g. one a user made) so chorus can use it.
    ///
    /// # Errors
    ///
    /// As [`Device::get`] for the stream's device.
    pub fn from_cudarc(stream: Arc<CudaStream>) -> Result<Stream, CudaError> {
        let device = Device::get(stream.context().ordinal())?;
        Ok(Stream {
            inner: stream,
            device,
        })
    }

    /// The device the stream belongs to.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The cudarc stream.
    pub fn cudarc(&self) -> &Arc<CudaStream> {
        &self.inner
    }

    /// The raw `CUstream` handle, e.g. for NCCL's `cudaStream_t`. Valid while
    /// this stream (or a clone) lives.
    pub fn as_raw(&self) -> sys::CUstream {
        self.inner.cu_stream()
    }

    /// The stream's priority as the driver reports it (`cuStreamGetPriority`).
    ///
    /// # Errors
    ///
    /// [`CudaError::Driver`] when the query fails.
    pub fn priority(&self) -> Result<i32, CudaError> {
        let mut p = 0;
        // SAFETY: the stream handle is alive (we hold it) and `p` is a valid
        // int to write to.
        let rc = unsafe { sys::cuStreamGetPriority(self.as_raw(), &mut p) };
        rc.result()
            .map_err(|e| driver_error("cuStreamGetPriority", e))?;
        Ok(p)
    }

    /// Makes all work issued to this stream after this call wait until
    /// `event` completes (`cuStreamWaitEvent`). No host wait. The event may
    /// belong to another device.
    ///
    /// # Errors
    ///
    /// [`CudaError::Driver`] when the driver refuses.
    pub fn wait_event(&self, event: &Event) -> Result<(), CudaError> {
        self.inner
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
    pub(crate) fn wait_event_bound(&self, event: &Event) -> Result<(), CudaError> {
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

    /// Blocks the calling thread until all work on the stream is done.
    /// For tests and shutdown, not for the op path.
    ///
    /// # Errors
    ///
    /// [`CudaError::Driver`] with any error of that work.
    pub fn synchronize(&self) -> Result<(), CudaError> {
        self.inner
            .synchronize()
            .map_err(|e| driver_error("cuStreamSynchronize", e))
    }

    /// Copies `host` into a new device buffer, in stream order.
    ///
    /// # Errors
    ///
    /// [`CudaError::Driver`] when allocation or copy fails.
    pub fn clone_htod<T: DeviceRepr>(&self, host: &[T]) -> Result<CudaSlice<T>, CudaError> {
        self.inner
            .clone_htod(host)
            .map_err(|e| driver_error("cuMemcpyHtoDAsync", e))
    }

    /// Copies `host` into the existing device buffer `dst`, in stream order.
    ///
    /// # Errors
    ///
    /// [`CudaError::LengthMismatch`] when the lengths differ,
    /// [`CudaError::Driver`] when the copy fails.
    pub fn copy_htod<T: DeviceRepr>(
        &self,
        host: &[T],
        dst: &mut CudaSlice<T>,
    ) -> Result<(), CudaError> {
        if host.len() != dst.len() {
            return Err(CudaError::LengthMismatch {
                what: "copy_htod",
                expected: dst.len(),
                found: host.len(),
            });
        }
        self.inner
            .memcpy_htod(host, dst)
            .map_err(|e| driver_error("cuMemcpyHtoDAsync", e))
    }

    /// A new device buffer of `len` zeroed elements, in stream order.
    ///
    /// # Errors
    ///
    /// [`CudaError::Driver`] when allocation fails.
    pub fn alloc_zeros<T: DeviceRepr + ValidAsZeroBits>(
        &self,
        len: usize,
    ) -> Result<CudaSlice<T>, CudaError> {
        self.inner
            .alloc_zeros(len)
            .map_err(|e| driver_error("cuMemAllocAsync", e))
    }

    /// Copies a device buffer to a new `Vec`, waiting for the copy (and all
    /// work before it on this stream) to finish.
    ///
    /// # Errors
    ///
    /// [`CudaError::Driver`] when the copy, or earlier work, fails.
    pub fn clone_dtoh<T: DeviceRepr>(&self, src: &CudaSlice<T>) -> Result<Vec<T>, CudaError> {
        self.inner
            .clone_dtoh(src)
            .map_err(|e| driver_error("cuMemcpyDtoHAsync", e))
    }
}

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
        if stream.device.ordinal() != self.device {
            return Err(CudaError::DeviceMismatch {
                what: "Event::record",
                event_device: self.device,
                stream_device: stream.device.ordinal(),
            });
        }
        self.inner
            .record(&stream.inner)
            .map_err(|e| driver_error("cuEventRecord", e))
    }

    /// [`record`](Self::record) for a caller that has already made the
    /// stream's context current on this thread ([`Device::bind_to_thread`]).
    ///
    /// # Errors
    ///
    /// As [`record`](Self::record).
    pub(crate) fn record_bound(&self, stream: &Stream) -> Result<(), CudaError> {
        if stream.device.ordinal() != self.device {
            return Err(CudaError::DeviceMismatch {
                what: "Event::record",
                event_device: self.device,
                stream_device: stream.device.ordinal(),
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
