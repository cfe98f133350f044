//! The floor chorus's NCCL path is measured against: raw NCCL calls on a
//! communicator of one rank, without any of chorus's bookkeeping (feature
//! `test-util`, for benchmarks).
//!
//! [`RawComm`] owns its buffers, so the raw calls it makes are sound
//! without asking anything of the caller: the buffers live until the
//! communicator's stream has passed every op (its drop waits for that).

use std::fmt;

use chorus_core::{DType, ReduceOp};
use nccl_sys::sys::{cudaStream_t, ncclComm_t, ncclUniqueId};
use nccl_sys::Nccl;

use crate::cuda::{CudaSlice, Device, Event, Stream, StreamPriority};
use crate::nccl::error::{lib, nccl_err, NcclCommError};
use crate::nccl::types::{raw_dtype, raw_op};

/// A raw NCCL communicator of one rank with its own stream and `f32`
/// buffers.
pub struct RawComm {
    nccl: &'static Nccl,
    comm: ncclComm_t,
    device: Device,
    stream: Stream,
    bufs: Vec<CudaSlice<f32>>,
    ptrs: Vec<u64>,
}

// SAFETY: the handle is used only through `&self` methods that NCCL allows
// from any thread for a communicator whose calls are not concurrent; the
// benchmarks call them from one thread at a time.
unsafe impl Send for RawComm {}

impl fmt::Debug for RawComm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RawComm")
            .field("device", &self.device.ordinal())
            .field("buffers", &self.bufs.len())
            .finish_non_exhaustive()
    }
}

impl RawComm {
    /// A communicator of one rank on `device` (`ncclGetUniqueId`,
    /// `ncclCommInitRank`), with its own stream and `width` zeroed buffers
    /// of `count` elements.
    ///
    /// # Errors
    ///
    /// No NCCL or CUDA, or the NCCL or CUDA error.
    pub fn one_rank(device: &Device, width: usize, count: usize) -> Result<RawComm, NcclCommError> {
        let nccl = lib()?;
        device.bind_to_thread()?;
        let stream = device.new_stream(StreamPriority::Normal)?;
        let mut id = ncclUniqueId::zeroed();
        // SAFETY: `id` is valid for writes.
        let rc = unsafe { (nccl.ncclGetUniqueId)(&mut id) };
        if !rc.is_success() {
            return Err(nccl_err(nccl, "ncclGetUniqueId", rc));
        }
        let mut comm: ncclComm_t = std::ptr::null_mut();
        // SAFETY: `comm` is valid for writes; a communicator of one rank
        // initializes without waiting for anyone.
        let rc = unsafe { (nccl.ncclCommInitRank)(&mut comm, 1, id, 0) };
        if !rc.is_success() {
            return Err(nccl_err(nccl, "ncclCommInitRank", rc));
        }
        let mut raw = RawComm {
            nccl,
            comm,
            device: device.clone(),
            stream,
            bufs: Vec::new(),
            ptrs: Vec::new(),
        };
        for _ in 0..width {
            let b = raw.stream.alloc_zeros::<f32>(count)?;
            let p = {
                use cudarc::driver::DevicePtr;
                let (p, _g) = b.device_ptr(raw.stream.cudarc());
                p
            };
            raw.ptrs.push(p);
            raw.bufs.push(b);
        }
        raw.stream.synchronize()?;
        Ok(raw)
    }

    /// The communicator's stream.
    pub fn stream(&self) -> &Stream {
        &self.stream
    }

    /// Number of buffers.
    pub fn width(&self) -> usize {
        self.bufs.len()
    }

    /// `ncclAllReduce` (sum, in place) of buffer `i` on the stream; a
    /// buffer index out of range does nothing.
    ///
    /// # Errors
    ///
    /// The NCCL error of the call.
    pub fn all_reduce(&self, i: usize) -> Result<(), NcclCommError> {
        let (Some(&p), Some(b)) = (self.ptrs.get(i), self.bufs.get(i)) else {
            return Ok(());
        };
        let p = p as *mut std::ffi::c_void;
        // SAFETY: `p` is the live allocation of `b.len()` f32 that this
        // value owns until the stream has passed the op (see `Drop`); the
        // communicator and stream are live.
        let rc = unsafe {
            (self.nccl.ncclAllReduce)(
                p,
                p,
                b.len(),
                raw_dtype(DType::F32),
                raw_op(ReduceOp::Sum),
                self.comm,
                self.stream.as_raw() as cudaStream_t,
            )
        };
        if rc.is_success() {
            Ok(())
        } else {
            Err(nccl_err(self.nccl, "ncclAllReduce", rc))
        }
    }

    /// Runs `f` (which issues ops on this communicator) inside one
    /// `ncclGroupStart` … `ncclGroupEnd` on this thread.
    ///
    /// # Errors
    ///
    /// The NCCL error of opening or closing the group.
    pub fn group<R>(&self, f: impl FnOnce(&Self) -> R) -> Result<R, NcclCommError> {
        // SAFETY: no arguments; paired with the ncclGroupEnd below on this
        // thread whatever `f` does.
        let rc = unsafe { (self.nccl.ncclGroupStart)() };
        if !rc.is_success() {
            return Err(nccl_err(self.nccl, "ncclGroupStart", rc));
        }
        let out = f(self);
        // SAFETY: closes the group opened above, on the same thread.
        let rc = unsafe { (self.nccl.ncclGroupEnd)() };
        if rc.is_success() {
            Ok(out)
        } else {
            Err(nccl_err(self.nccl, "ncclGroupEnd", rc))
        }
    }

    /// The two events of a launch around the ops `f` issues: an input-ready
    /// event recorded on `producer` that the communicator's stream waits on
    /// before, and `end` recorded on the stream after. The raw driver calls
    /// (no context checks): the context must be current
    /// ([`Device::bind_to_thread`]).
    ///
    /// # Errors
    ///
    /// The CUDA error of a record or wait.
    pub fn with_events<R>(
        &self,
        producer: &Stream,
        ready: &Event,
        end: &Event,
        f: impl FnOnce(&Self) -> R,
    ) -> Result<R, NcclCommError> {
        ready.record_bound(producer)?;
        self.stream.wait_event_bound(ready)?;
        let out = f(self);
        end.record_bound(&self.stream)?;
        Ok(out)
    }
}

impl Drop for RawComm {
    fn drop(&mut self) {
        // The buffers go only once the stream has passed every op.
        if self.device.bind_to_thread().is_ok() {
            let _ = self.stream.synchronize();
        }
        // SAFETY: the communicator is ours and idle (its stream drained).
        unsafe { (self.nccl.ncclCommDestroy)(self.comm) };
    }
}
