//! chorus-gpu: everything of chorus that touches a GPU.
//!
//! A map of the crate:
//!
//! * [`cuda`]: the CUDA driver (through cudarc, loaded at run time):
//!   devices, streams, events; typed errors where there is no GPU.
//! * [`nccl`]: NCCL communicators (non-blocking init, blocking twins for
//!   ops), device buffers, in-flight ops and their retire queue;
//!   [`nccl::batch`]: several ops in one NCCL group, and CUDA graph capture.
//! * [`reactor`]: the completion reactor thread that completes GPU ops
//!   when their end event completes.
//!
//! Nothing here runs unless called: the TCP backend works on machines
//! without a GPU. All of chorus's GPU `unsafe` lives in this crate (and in
//! `nccl-sys`), each block with a `// SAFETY:` line.
#![warn(missing_docs)]

pub mod cuda;
pub mod nccl;
pub mod reactor;
