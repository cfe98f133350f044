//! NCCL communicators and device buffers: the safe layer between
//! `nccl-sys` and chorus's NCCL backend. See docs/ARCHITECTURE.md ("The
//! path of one all_reduce") for how an op goes through it.
//!
//! * [`DeviceMem`], the open trait of device memory an op may use;
//!   [`DeviceBuffer`] owns a cudarc slice and names its producer stream;
//!   [`RawDeviceBuffer`] describes memory by a raw pointer.
//! * [`PendingComm`]: a communicator being created, non-blocking (polled
//!   through `ncclCommGetAsyncError`), from a [`unique_id`] or a split.
//! * [`Communicator`]: one NCCL communicator with its own CUDA stream;
//!   [`Communicator::submit`] enqueues an op (an input-ready event on each
//!   producer stream that the comm stream waits on, the NCCL call, the end
//!   event on the comm stream), serialized by a lock.
//! * [`InFlight`]: the op's buffers and end event. Its buffers are never
//!   released before the end event completes: dropping an unfinished
//!   `InFlight` leaves them with the communicator's retire queue (see
//!   `retire`), which drops them afterwards. [`Watched`]: an op
//!   handed to the completion [`reactor`](crate::reactor).
//! * `forecast`: when an op is expected to end, learned from the ops like it
//!   that ended before, so that the reactor wakes an awaited op's future
//!   shortly before (docs/ARCHITECTURE.md, "Waking on time").
//! * [`Batch`]: several ops in one NCCL group, each op's buffers kept in
//!   `items` until its work takes them; [`GraphCapture`] / [`Graph`]: CUDA
//!   graph capture of NCCL ops.
//! * Faults: an aborted communicator's work stops through `ncclCommAbort`,
//!   or it is kept (revoked with `ncclCommRevoke` where NCCL has it) for
//!   [`Communicator::shrink`] (`ncclCommShrink`): the survivors' next
//!   communicator without a new unique id (`revoke`, `shrink`).
//!
//! Files, lowest first (each uses only those before it): `error`, `types`,
//! `buffer`, `event_pool`, `progress`, `forecast`, `retire`, `watch`,
//! `inflight`, `revoke`, `communicator`, `init`, `shrink`, `enqueue`,
//! `items`, `batch`, `graph`.

mod batch;
mod buffer;
mod communicator;
mod enqueue;
pub(crate) mod error;
mod event_pool;
mod forecast;
mod graph;
mod inflight;
mod init;
mod items;
mod progress;
mod retire;
mod revoke;
mod shrink;
pub(crate) mod types;
mod watch;

pub use batch::{Batch, Launched, Ticket};
pub use buffer::{
    DeviceBuffer, DeviceBuffers, DeviceElement, DeviceMem, NoBuffers, RawDeviceBuffer,
};
pub use communicator::{CommOptions, Communicator};
#[cfg(feature = "test-util")]
pub use enqueue::in_progress_returns;
pub use enqueue::Refused;
pub use error::{library, use_library, NcclCommError};
#[cfg(feature = "test-util")]
pub use event_pool::end_events_created;
pub use event_pool::EndEvent;
pub use graph::{Graph, GraphCapture};
pub use inflight::InFlight;
pub use init::{unique_id, PendingComm};
#[cfg(feature = "test-util")]
pub use progress::ended_without_query;
pub use retire::Finished;
#[cfg(feature = "test-util")]
pub use watch::prewake_counts;
pub use watch::Watched;
