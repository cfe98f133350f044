//! chorus: async collectives for Rust.
//!
//! A [`ProcessGroup`] runs collectives (all_reduce, broadcast, reduce,
//! all_gather, reduce_scatter, all_to_all, send/recv, barrier) across the
//! ranks of a job. Each call is submitted at once, in program order, and
//! returns a [`Work`] future that owns the op's buffers until the op is done
//! and then yields them back.
//!
//! A map of the crate:
//!
//! * [`process_group`]: [`ProcessGroup`], its builder and subgroups;
//!   [`process_group::group`]: grouped ops ([`Group`], [`Grouped`]);
//!   [`process_group::capture`]: CUDA graph capture of NCCL ops.
//! * [`work`]: the typed [`Work`] future.
//! * [`dtype`]: element types ([`Element`], [`DType`]), [`ReduceOp`] and
//!   type-erased [`HostBuffer`]s.
//! * [`reduce`]: reduction arithmetic and the serial reference.
//! * [`error`]: [`Error`] and [`Rejected`] (a refused op, with its buffers).
//! * [`device`]: device buffers, the [`OpBuffer`] trait that routes a
//!   buffer to its backend, and [`DeviceWork`] with its completion levels.
//! * `backend`: what runs the ops; `backend::tcp` is the TCP backend,
//!   `backend::nccl` the NCCL backend.
#![warn(missing_docs)]
// A refused op gives its buffers back inside the error (`Rejected<B>`), so
// error variants are as large as the buffers' handles by design.
#![allow(clippy::result_large_err, clippy::type_complexity)]

pub(crate) mod backend;
pub mod device;
pub mod dtype;
pub mod error;
pub mod process_group;
pub mod propagation;
pub mod reduce;
pub mod watchdog;
pub mod work;

pub use backend::nccl::{NcclInitError, NcclOptions};
pub use backend::tcp::TcpOptions;
pub use chorus_core::{OpContext, WorkError, WorkStatus};
pub use chorus_gpu::nccl::batch::Ticket;
pub use device::{DeviceBuffer, DeviceResult, DeviceWork, NcclType, OpBuffer, RawDeviceBuffer};
pub use dtype::{DType, Element, HostBuffer, ReduceOp};
pub use error::{Error, Rejected};
pub use process_group::capture::{Capture, CaptureGroup, Graph};
pub use process_group::group::{Group, Grouped};
pub use process_group::{GroupBuilder, ProcessGroup, DEFAULT_TIMEOUT};
pub use work::{CoalescedWork, OpResult, Work};
