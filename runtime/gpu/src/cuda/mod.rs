//! The CUDA driver, through cudarc (loaded at run time): the only module of
//! chorus that calls it.
//!
//! * [`driver`]: finds and initializes the driver once; no driver library or
//!   no GPU is [`CudaError::Unavailable`], never a panic.
//! * [`Device`]: one primary context per GPU, shared by every caller.
//! * [`Stream`]: non-blocking streams with a priority
//!   (`cuStreamCreateWithPriority`), and copies between host and device
//!   memory in stream order.
//! * [`Event`]: events without timing (`CU_EVENT_DISABLE_TIMING`);
//!   [`Event::query`] tells "not finished" (`Ok(false)`) apart from a real
//!   CUDA error (`Err`), unlike a plain `is_complete() -> bool`;
//!   [`Stream::wait_event`] (`cuStreamWaitEvent`).
//! * `sleep`: a thread sleeps in the driver until an event completes
//!   (the completion reactor's driver waiters).
//! * With the `test-util` feature: `StreamHold`, which holds a stream at a
//!   point until released (tests observe "not finished yet" without timing
//!   assumptions); `kernels` (a spin kernel of exact length, an add-one
//!   kernel, GPU timestamps); `HostSlots` (host memory kernels write to),
//!   `GpuClock` (GPU timestamps on the host's time line) and
//!   `Stream::launch_host_fn`, for benchmarks of completion latency.
//!
//! Nothing here runs unless called, so the TCP backend works on machines
//! without a GPU.
//!
//! Files: `driver` (finding and starting the driver), `library_names` (the
//! CUDA libraries' file names), `error` ([`CudaError`]), `device`
//! ([`Device`], stream priorities), `stream` ([`Stream`]), `event`
//! ([`Event`]); with `test-util`: `hold` (`StreamHold`), `kernels`,
//! `host_mapped` (`HostSlots`), `gpu_clock` (`GpuClock`), `host_fn`
//! (`Stream::launch_host_fn`).

mod device;
mod driver;
mod error;
mod event;
#[cfg(feature = "test-util")]
mod gpu_clock;
#[cfg(feature = "test-util")]
mod hold;
#[cfg(feature = "test-util")]
mod host_fn;
#[cfg(feature = "test-util")]
mod host_mapped;
#[cfg(feature = "test-util")]
pub mod kernels;
mod library_names;
mod sleep;
mod stream;
#[cfg(test)]
mod tests;

pub use cudarc::driver::{CudaSlice, DeviceRepr, ValidAsZeroBits};
pub use device::{Device, PriorityRange, StreamPriority};
pub(crate) use driver::relax_capture_mode;
pub use driver::{device_count, driver, DriverInfo};
pub(crate) use error::driver_error;
pub use error::CudaError;
pub use event::Event;
#[cfg(feature = "test-util")]
pub use gpu_clock::GpuClock;
#[cfg(feature = "test-util")]
pub use hold::StreamHold;
#[cfg(feature = "test-util")]
pub use host_mapped::HostSlots;
pub use library_names::library_names;
pub(crate) use sleep::{release_side_streams, sleep_until};
pub use stream::Stream;
