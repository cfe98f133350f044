//! chorus collectives on [candle](https://github.com/huggingface/candle)
//! tensors.
//!
//! [`TensorGroup`] runs all_reduce, broadcast, all_gather, reduce_scatter,
//! send and recv on candle `Tensor`s that live on a CUDA device, through a
//! chorus [`ProcessGroup`](chorus::ProcessGroup) (NCCL). Each op returns a
//! [`TensorWork`] with chorus's completion levels: it is enqueued when the
//! call returns; [`TensorWork::stream_ordered`] hands the tensor back
//! ordered on the tensor's own candle stream (what candle runs next on it
//! sees the result, and the host does not wait); awaiting it, or
//! [`TensorWork::wait_timeout`], returns once the GPU has finished the op.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use candle_core::{DType, Device, Tensor};
//! use chorus::{ProcessGroup, ReduceOp};
//! use chorus_candle::TensorGroup;
//!
//! let pg = ProcessGroup::builder().device(0).init_from_env().await?;
//! let tp = TensorGroup::new(pg);
//! let dev = Device::new_cuda(0)?;
//! let grad = Tensor::ones((1024, 1024), DType::F32, &dev)?;
//! // In place, on the tensor's storage; candle's next op on this stream
//! // sees the sum.
//! let grad = tp.all_reduce(&grad, ReduceOp::Sum)?.stream_ordered()?;
//! let scaled = (grad * 0.5)?;
//! // Out of place, into a fresh tensor: [world * 1024, 1024].
//! let all = tp.all_gather(&scaled)?.await?;
//! # let _ = all; Ok(()) }
//! ```
//!
//! * [`TensorBuffer`]: a tensor as chorus device memory (the
//!   [`DeviceMem`](chorus::DeviceMem) contract: pointer, length, dtype,
//!   producer stream; the tensor kept alive until the op's end event).
//! * [`TensorError`]: what a tensor cannot be used for, and why, naming
//!   its dtype, shape and device; nothing is lost (ops borrow tensors).
//!
//! # In place and out of place
//!
//! `all_reduce`, `broadcast` and `recv_into` write into the tensor's
//! storage, as PyTorch's collectives do: every tensor that shares that
//! storage (clones, reshapes) sees the result. `all_gather`,
//! `reduce_scatter` and `recv` write into a fresh tensor allocated on the
//! same device. The tensor must be contiguous (a contiguous view with an
//! offset into a larger storage is fine); anything else, a CPU tensor, or
//! a dtype NCCL has no type for (i16, the 8-, 6- and 4-bit floats) is a
//! [`TensorError`] before anything runs.
//!
//! # Streams
//!
//! The op is ordered after the work candle issued to the tensor's stream
//! ([`candle_core::CudaDevice::cuda_stream`]). candle's default
//! `Device::new_cuda` uses the per-thread default stream: call the ops,
//! and [`TensorWork::stream_ordered`], from the thread that runs the
//! model's candle ops, or give candle a stream of its own with
//! `Device::new_cuda_with_stream`.
//!
//! Files: `group` ([`TensorGroup`]), `work` ([`TensorWork`]), `buffer`
//! ([`TensorBuffer`]), `dtype` (candle's dtypes as chorus's), `error`
//! ([`TensorError`]).
#![deny(unsafe_code)]

mod buffer;
mod dtype;
mod error;
mod group;
mod work;

pub use buffer::TensorBuffer;
pub use error::TensorError;
pub use group::TensorGroup;
pub use work::TensorWork;
