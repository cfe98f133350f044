//! [`Stream`]: non-blocking streams with a priority, and copies between
//! host and device memory in stream order.

use std::sync::Arc;

use cudarc::driver::{sys, CudaSlice, CudaStream, DeviceRepr, ValidAsZeroBits};

use super::device::{Device, StreamPriority};
use super::error::{driver_error, CudaError};

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

impl Device {
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
            .context()
            .new_stream_with_priority(priority)
            .map_err(|e| driver_error("cuStreamCreateWithPriority", e))?;
        Ok(Stream {
            inner,
            device: self.clone(),
        })
    }
}
