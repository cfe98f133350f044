//! chorus-gpu: everything of chorus that touches a GPU.
//!
//! A map of the crate:
//!
//! * [`cuda`]: the CUDA driver (through cudarc, loaded at run time):
//!   devices, streams, events; typed errors where there is no GPU.
//! * [`nccl`]: NCCL communicators (non-blocking init, blocking twins for
//!   ops), device buffers, in-flight ops and their retire queue;
//!   [`nccl::Batch`]: several ops in one NCCL group; [`nccl::GraphCapture`]:
//!   CUDA graph capture of NCCL ops.
//! * [`reactor`]: completes GPU ops when their end event completes: driver
//!   waiters that sleep in the driver until an awaited op's end, and the
//!   reactor thread (pre-wakes, ops nobody awaits); `bell`: the reactor
//!   thread's sleep, which other threads end or shorten.
//! * [`placement`]: which side of the machine a buffer type lives on, the
//!   compile-time switch by which chorus picks a backend.
//! * `config`: the settings this layer reads from the environment.
//! * [`doze`]: short, precise naps for a thread that must be awake at a
//!   known instant (a future watching its op's expected end).
//! * `lead`: the pre-wake's lead in force, longer while woken threads run
//!   late.
//! * `exit_gate`: keeps the background threads off the driver once the
//!   process exits (the driver tears its contexts down then).
//! * `floor` (feature `test-util`): raw NCCL calls on a one-rank
//!   communicator, the floor benchmarks compare chorus with.
//!
//! Nothing here runs unless called: the TCP backend works on machines
//! without a GPU. All of chorus's GPU `unsafe` lives in this crate (and in
//! `nccl-sys`), each block with a `// SAFETY:` line.
#![warn(missing_docs)]

mod bell;
mod config;
pub mod cuda;
pub mod doze;
mod exit_gate;
#[cfg(feature = "test-util")]
pub mod floor;
mod lead;
pub mod nccl;
pub mod placement;
pub mod reactor;
