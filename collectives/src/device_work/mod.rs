//! [`DeviceWork`], the future of an op on device buffers (the NCCL
//! backend), with its explicit completion levels.
//!
//! | level | how | host cost |
//! |---|---|---|
//! | Enqueued | the op method returned `Ok(work)` | none |
//! | StreamOrdered | [`DeviceWork::stream_ordered`] / [`stream_ordered_on`](DeviceWork::stream_ordered_on): the stream waits on the end event, the buffers come back at once | one `cuStreamWaitEvent` |
//! | GpuFinished | `.await` (the completion reactor wakes the future when the end event completes), or [`DeviceWork::wait_timeout`] | waits for the GPU |
//!
//! [`DeviceWork`] itself is in `work`. A work is a lone op's own ([`own`]:
//! its registry entry, completion and buffers) or an op of a batch
//! ([`member`]: a view of the batch's one work, which is an [`own`] work
//! without buffers).

mod member;
mod own;
mod work;

pub(crate) use member::{BatchLead, Member};
pub use work::DeviceWork;
