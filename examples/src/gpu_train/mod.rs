//! A data-parallel MLP trainer that computes on the GPU: forward and
//! backward on a compute stream (GEMMs through cuBLAS, element-wise PTX
//! kernels), DDP-style gradient buckets all_reduced by NCCL the moment
//! backward has produced them, and an optimizer that waits for each
//! bucket through the stream-ordered completion level, so the host never
//! waits per bucket or per step (only when it prints).
//!
//! The run checks itself: the first steps' losses against a CPU reference
//! of the same model, data and update ([`reference`](mod@reference)), and the
//! parameters' hash (computed on the GPU after every update) equal on
//! every rank. `fault_tolerant` trains in steps that survive lost ranks
//! (`--fault-tolerant`). `examples/gpu_trainer.rs` is the program;
//! docs/EXAMPLES.md describes what it prints.
//!
//! Its files:
//!
//! * [`train`](mod@train): the training loop (steps, bucket submission,
//!   stream-ordered waits, printing, the checks and the measurements);
//!   [`fault_tolerant`]: the same in steps that survive lost ranks.
//! * [`model`]: the MLP on the GPU, its buffers and the launches of
//!   forward, backward and the update; [`layout`]: where each parameter
//!   lives in the flat vector, and the gradient buckets over it.
//! * [`blas`]: a cuBLAS handle and the GEMMs of a linear layer;
//!   [`blas_search`]: finding cuBLAS before cudarc loads it.
//! * [`ptx`]: the element-wise kernels as PTX text; [`kernels`]: loading
//!   and launching them.
//! * [`data`]: the run's deterministic inputs; [`reference`](mod@reference):
//!   the CPU reference of the same model.
//! * [`timing`]: CUDA events with timing and the marks of a profiled step.
//! * [`error`]: [`TrainError`], naming the call that failed and where.
#![allow(unsafe_code)]

pub mod blas;
pub mod blas_search;
pub mod data;
pub mod error;
pub mod fault_tolerant;
pub mod kernels;
pub mod layout;
pub mod model;
pub mod ptx;
pub mod reference;
pub mod timing;
pub mod train;

pub use error::TrainError;
pub use fault_tolerant::{parse_kills, train_fault_tolerant, FaultConfig, FaultReport};
pub use train::{reference_losses, train, Config, Report};
