//! [`TensorError`]: a tensor an op cannot use, and why.

use candle_core::Tensor;
use chorus::WorkError;

/// Why an op refused a tensor, or could not start.
///
/// The tensor-shaped variants name the op, the rank, and the tensor's
/// dtype, shape and device. Ops borrow their tensors, so a refusal loses
/// nothing.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TensorError {
    /// The tensor is not on a CUDA device.
    #[error("{op} on rank {rank}: the tensor ({desc}) is not on a CUDA device; move it with tensor.to_device(&Device::new_cuda(ordinal)?)")]
    NotCuda {
        /// The op.
        op: &'static str,
        /// This rank.
        rank: usize,
        /// The tensor's dtype, shape and device.
        desc: String,
    },
    /// The tensor's elements are not one contiguous run of memory.
    #[error("{op} on rank {rank}: the tensor ({desc}) is not contiguous (strides {strides:?}); call tensor.contiguous()? first")]
    NotContiguous {
        /// The op.
        op: &'static str,
        /// This rank.
        rank: usize,
        /// The tensor's dtype, shape and device.
        desc: String,
        /// Its strides, in elements.
        strides: Vec<usize>,
    },
    /// NCCL has no type for the tensor's dtype.
    #[error("{op} on rank {rank}: the tensor ({desc}) has a dtype NCCL cannot move; use u8, u32, i32, i64, f16, bf16, f32 or f64 (to_dtype)")]
    UnsupportedDType {
        /// The op.
        op: &'static str,
        /// This rank.
        rank: usize,
        /// The tensor's dtype, shape and device.
        desc: String,
    },
    /// The tensor's shape does not fit the op (e.g. a first dimension that
    /// the world size does not divide, for reduce_scatter).
    #[error("{op} on rank {rank}: the tensor ({desc}) {why}")]
    Shape {
        /// The op.
        op: &'static str,
        /// This rank.
        rank: usize,
        /// The tensor's dtype, shape and device.
        desc: String,
        /// What is wrong.
        why: String,
    },
    /// chorus refused the op (a rank out of range, a closed group, ...).
    #[error(transparent)]
    Refused(#[from] WorkError),
    /// candle could not allocate the output tensor.
    #[error("{op} on rank {rank}: allocating the output tensor failed: {source}")]
    Alloc {
        /// The op.
        op: &'static str,
        /// This rank.
        rank: usize,
        /// candle's error.
        source: candle_core::Error,
    },
    /// chorus could not use the tensor's stream.
    #[error("{op} on rank {rank}: the tensor's CUDA stream: {source}")]
    Stream {
        /// The op.
        op: &'static str,
        /// This rank.
        rank: usize,
        /// The CUDA error.
        source: chorus::cuda::CudaError,
    },
}

/// `f32 [4, 3] on cuda:0`.
pub(crate) fn describe(t: &Tensor) -> String {
    format!("{:?} {:?} on {}", t.dtype(), t.dims(), location(t))
}

fn location(t: &Tensor) -> String {
    match t.device().location() {
        candle_core::DeviceLocation::Cpu => "cpu".into(),
        candle_core::DeviceLocation::Cuda { gpu_id } => format!("cuda:{gpu_id}"),
        other => format!("{other:?}").to_lowercase(),
    }
}
