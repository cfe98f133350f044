//! [`Device`]: one primary context per GPU, shared by every caller; stream
//! priorities.

use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{result, CudaContext};

use super::driver::driver;
use super::error::{driver_error, guarded, CudaError};
use chorus_core::sync::lock;

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
        let mut contexts = lock(contexts);
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
