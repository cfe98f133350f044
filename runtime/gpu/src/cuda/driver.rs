//! Finding and starting the CUDA driver, once per process.

use std::sync::OnceLock;

use cudarc::driver::{result, sys, DriverError};

use super::error::{guarded, CudaError};
use super::library_names::driver_library_names;

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
    let library = probe_library(&driver_library_names())?;
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
