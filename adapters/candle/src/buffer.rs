//! [`TensorBuffer`]: a candle CUDA tensor as chorus device memory.

use candle_core::cuda::CudaStorageSlice;
use candle_core::{Storage, Tensor};
use chorus::{DType, DeviceMem, Stream};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};

use crate::dtype::chorus_dtype;
use crate::error::{describe, TensorError};

/// A contiguous candle tensor on a CUDA device, as memory a chorus op may
/// read and write.
///
/// It holds a clone of the tensor (a reference to its storage), so the
/// memory stays allocated for as long as chorus holds the buffer: until the
/// op's end event has completed, also when the work is dropped. The
/// producer stream is the tensor's candle stream. Get one from
/// [`TensorGroup::buffer`](crate::TensorGroup::buffer), to run chorus's own
/// ops (batched, coalesced) on tensors.
#[derive(Debug)]
pub struct TensorBuffer {
    tensor: Tensor,
    ptr: u64,
    count: usize,
    dtype: DType,
    stream: Stream,
}

/// The device address of a candle slice, as seen from `stream` (cudarc
/// makes `stream` wait for the slice's last write if it tracks them).
fn slice_ptr<T>(s: &CudaSlice<T>, stream: &CudaStream) -> u64 {
    let (ptr, _recorded_on_drop) = s.device_ptr(stream);
    ptr
}

impl TensorBuffer {
    /// Checks `t` for `op` (on `rank`, for the messages) and describes its
    /// memory.
    pub(crate) fn new(op: &'static str, rank: usize, t: &Tensor) -> Result<Self, TensorError> {
        let desc = || describe(t);
        let candle_core::Device::Cuda(dev) = t.device() else {
            return Err(TensorError::NotCuda {
                op,
                rank,
                desc: desc(),
            });
        };
        let Some(dtype) = chorus_dtype(t.dtype()) else {
            return Err(TensorError::UnsupportedDType {
                op,
                rank,
                desc: desc(),
            });
        };
        let cudarc_stream = dev.cuda_stream();
        let (storage, layout) = t.storage_and_layout();
        if !layout.is_contiguous() {
            return Err(TensorError::NotContiguous {
                op,
                rank,
                desc: desc(),
                strides: layout.stride().to_vec(),
            });
        }
        let Storage::Cuda(cs) = &*storage else {
            return Err(TensorError::NotCuda {
                op,
                rank,
                desc: desc(),
            });
        };
        let s = &cudarc_stream;
        let base = match &cs.slice {
            CudaStorageSlice::U8(x) => slice_ptr(x, s),
            CudaStorageSlice::U32(x) => slice_ptr(x, s),
            CudaStorageSlice::I32(x) => slice_ptr(x, s),
            CudaStorageSlice::I64(x) => slice_ptr(x, s),
            CudaStorageSlice::BF16(x) => slice_ptr(x, s),
            CudaStorageSlice::F16(x) => slice_ptr(x, s),
            CudaStorageSlice::F32(x) => slice_ptr(x, s),
            CudaStorageSlice::F64(x) => slice_ptr(x, s),
            _ => {
                return Err(TensorError::UnsupportedDType {
                    op,
                    rank,
                    desc: desc(),
                })
            }
        };
        drop(storage);
        let offset = (layout.start_offset() * dtype.size()) as u64;
        let stream = Stream::from_cudarc(cudarc_stream).map_err(|source| TensorError::Stream {
            op,
            rank,
            source,
        })?;
        Ok(TensorBuffer {
            tensor: t.clone(),
            ptr: base + offset,
            count: t.elem_count(),
            dtype,
            stream,
        })
    }

    /// The tensor.
    pub fn tensor(&self) -> &Tensor {
        &self.tensor
    }

    /// The tensor, giving up the buffer.
    pub fn into_tensor(self) -> Tensor {
        self.tensor
    }
}

// SAFETY: `ptr` is the address of the tensor's first element in its CUDA
// storage (the slice's base plus the layout's start offset), and the
// layout is contiguous, so `count` elements of `dtype` (the tensor's, whose
// size is the slice's element size) lie inside that one allocation, on the
// device of the tensor's stream; none of the three changes (the fields are
// private and set once). The buffer owns a clone of the tensor, which keeps
// the storage allocated until the buffer is dropped. `stream` wraps the
// candle device's stream, on which candle orders every kernel and copy that
// touches the tensor.
#[allow(unsafe_code)]
unsafe impl DeviceMem for TensorBuffer {
    fn device_ptr(&self) -> u64 {
        self.ptr
    }
    fn count(&self) -> usize {
        self.count
    }
    fn dtype(&self) -> DType {
        self.dtype
    }
    fn stream(&self) -> &Stream {
        &self.stream
    }
}
