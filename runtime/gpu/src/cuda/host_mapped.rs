//! [`HostSlots`]: pinned host memory the GPU writes to directly, for
//! timestamps a kernel takes (GPU tests and benchmarks).

use std::ffi::c_void;

use cudarc::driver::{result, sys};

use super::device::Device;
use super::error::{driver_error, CudaError};

/// `n` u64 slots of pinned host memory mapped into the device's address
/// space (`cuMemHostAlloc` with `DEVICEMAP`): a kernel stores to
/// [`device_ptr`](Self::device_ptr), the host reads with
/// [`get`](Self::get), without a copy.
pub struct HostSlots {
    host: *mut u64,
    dev: u64,
    len: usize,
    device: Device,
}

// SAFETY: the memory is plain pinned host memory owned by the value; every
// access goes through volatile reads and writes of whole u64 slots.
unsafe impl Send for HostSlots {}
// SAFETY: as above; concurrent volatile accesses of aligned u64 slots do
// not tear on the platforms CUDA supports.
unsafe impl Sync for HostSlots {}

impl std::fmt::Debug for HostSlots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostSlots").field("len", &self.len).finish()
    }
}

impl HostSlots {
    /// `len` zeroed slots on `device`.
    ///
    /// # Errors
    ///
    /// [`CudaError::Driver`] if the driver cannot allocate or map them.
    pub fn new(device: &Device, len: usize) -> Result<HostSlots, CudaError> {
        device.bind_to_thread()?;
        let bytes = len.max(1) * std::mem::size_of::<u64>();
        let flags = sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE;
        // SAFETY: a plain allocation of `bytes` bytes; the context is current.
        let host = unsafe { result::malloc_host(bytes, flags) }
            .map_err(|e| driver_error("cuMemHostAlloc", e))? as *mut u64;
        let mut dev: sys::CUdeviceptr = 0;
        // SAFETY: `host` was just allocated with DEVICEMAP; `dev` is a valid
        // out-pointer.
        let rc = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dev, host as *mut c_void, 0) };
        let slots = HostSlots {
            host,
            dev,
            len: len.max(1),
            device: device.clone(),
        };
        rc.result()
            .map_err(|e| driver_error("cuMemHostGetDevicePointer", e))?;
        for i in 0..slots.len {
            slots.set(i, 0);
        }
        Ok(slots)
    }

    /// Number of slots.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True if there are no slots (never: at least one is allocated).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device address of slot `i` (clamped to the last slot).
    pub fn device_ptr(&self, i: usize) -> u64 {
        self.dev + (i.min(self.len - 1) * std::mem::size_of::<u64>()) as u64
    }

    /// Reads slot `i` (clamped to the last slot).
    pub fn get(&self, i: usize) -> u64 {
        // SAFETY: the index is in bounds; the memory lives as long as self.
        unsafe { std::ptr::read_volatile(self.host.add(i.min(self.len - 1))) }
    }

    /// Writes slot `i` (clamped to the last slot).
    pub fn set(&self, i: usize, v: u64) {
        // SAFETY: as in `get`.
        unsafe { std::ptr::write_volatile(self.host.add(i.min(self.len - 1)), v) }
    }
}

impl Drop for HostSlots {
    fn drop(&mut self) {
        // Release any kernel waiting on a flag here, then let every kernel
        // of the device finish before the memory goes: none can write to
        // it afterwards.
        for i in 0..self.len {
            self.set(i, u64::MAX);
        }
        if self.device.synchronize().is_err() {
            // The context is broken: leak the memory rather than free what
            // a kernel might still write.
            return;
        }
        // SAFETY: allocated by `cuMemHostAlloc` in `new`, freed once, after
        // the device synchronized.
        let _ = unsafe { result::free_host(self.host as *mut c_void) };
    }
}
