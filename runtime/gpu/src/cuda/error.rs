//! The CUDA layer's error type, and the two ways a driver call becomes one.

use std::panic::AssertUnwindSafe;

use cudarc::driver::DriverError;

/// What went wrong in the CUDA layer.
///
/// `Debug` shows the message (so `?` in `main` prints it); `{:#?}` the
/// structure.
#[derive(Clone, PartialEq, Eq, thiserror::Error)]
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

chorus_core::debug_shows_message!(CudaError {
    Unavailable { reason },
    NoSuchDevice { ordinal, count },
    Driver { call, code, name },
    LengthMismatch { what, expected, found },
    DeviceMismatch { what, event_device, stream_device },
});

/// A failed driver call as a [`CudaError::Driver`]. The name comes from the
/// `CUresult` enum itself, so building the error needs no driver call.
pub(crate) fn driver_error(call: &'static str, e: DriverError) -> CudaError {
    CudaError::Driver {
        call,
        code: e.0 as i32,
        name: format!("{:?}", e.0),
    }
}

/// Runs a cudarc call that may panic when the driver library or one of its
/// symbols is missing, turning the panic into [`CudaError::Unavailable`].
/// The probe in [`driver`](super::driver::driver) makes this a last resort.
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
