//! The GPU trainer's error type: every CUDA, cuBLAS and collective failure
//! names the call that failed and where.

use chorus::cuda::CudaError;

/// What stopped the GPU trainer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TrainError {
    /// A flag is out of range.
    #[error("bad configuration: {0}")]
    Config(String),
    /// The CUDA layer (device, stream, event, copy) failed.
    #[error("rank {rank}: CUDA: {source}")]
    Cuda {
        /// The rank that saw it.
        rank: usize,
        /// The CUDA layer's error (it names the driver call).
        #[source]
        source: CudaError,
    },
    /// A driver call made by the trainer itself failed.
    #[error("rank {rank}: {call} failed for {what}: {name} (CUDA error {code})")]
    Driver {
        /// The rank that saw it.
        rank: usize,
        /// The driver function, e.g. `cuLaunchKernel`.
        call: &'static str,
        /// What it was doing, e.g. the kernel's name.
        what: String,
        /// The `CUresult` code.
        code: i32,
        /// Its name.
        name: String,
    },
    /// cuBLAS could not be found or loaded.
    #[error(
        "cuBLAS not found: {reason}; searched: {searched}. Install the CUDA toolkit or the pip \
         package nvidia-cublas-cu12 / nvidia-cublas (CUDA 13), or set CHORUS_CUBLAS_LIBRARY to \
         the libcublas.so.N to use"
    )]
    BlasMissing {
        /// Why nothing was usable.
        reason: String,
        /// Every place looked at, in order.
        searched: String,
    },
    /// A cuBLAS call failed.
    #[error("rank {rank}: {call} failed for {what}: {status}")]
    Blas {
        /// The rank that saw it.
        rank: usize,
        /// The cuBLAS function, e.g. `cublasSgemm_v2`.
        call: &'static str,
        /// Which GEMM (layer, pass).
        what: String,
        /// The `cublasStatus_t` name.
        status: String,
    },
    /// A collective failed or was refused.
    #[error("rank {rank}: {op} at step {step}: {msg}")]
    Collective {
        /// The rank that saw it.
        rank: usize,
        /// The op, e.g. `all_reduce(bucket 2)`.
        op: String,
        /// The training step (0 before training).
        step: usize,
        /// The collective layer's error.
        msg: String,
    },
    /// Ranks hold different parameters.
    #[error(
        "parameters diverged across ranks after step {step}: hashes by rank [{hashes}] \
         (every rank must run the same binary, data shapes and flags)"
    )]
    Diverged {
        /// The first step whose hashes differ.
        step: usize,
        /// The hashes, by rank.
        hashes: String,
    },
    /// Writing the profile failed.
    #[error("cannot write the profile to {path}: {source}")]
    Profile {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

impl TrainError {
    /// A collective error of `rank` for `op` at `step`.
    pub fn collective(rank: usize, op: impl Into<String>, step: usize, e: impl ToString) -> Self {
        TrainError::Collective {
            rank,
            op: op.into(),
            step,
            msg: e.to_string(),
        }
    }

    /// A driver call's failure.
    pub fn driver(
        rank: usize,
        call: &'static str,
        what: impl Into<String>,
        e: cudarc::driver::DriverError,
    ) -> Self {
        TrainError::Driver {
            rank,
            call,
            what: what.into(),
            code: e.0 as i32,
            name: format!("{:?}", e.0),
        }
    }
}
