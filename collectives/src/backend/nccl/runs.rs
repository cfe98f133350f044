//! The backend interface of [`NcclBackend`]: single ops, coalesced ops,
//! batches.

use std::time::Duration;

use chorus_core::{Op, WorkError};
use chorus_gpu::nccl::{DeviceBuffers, DeviceMem};

use super::backend::NcclBackend;
use super::staged::NcclStaged;
use crate::backend::{Backend, Coalesces, Runs};
use crate::batched::Batched;
use crate::device_work::DeviceWork;
use crate::error::Rejected;
use crate::sequence::Sequencer;

impl Backend for NcclBackend {
    type Staged = NcclStaged;

    fn name(&self) -> &'static str {
        "nccl"
    }

    fn launch(
        &self,
        seq: &Sequencer,
        timeout: Duration,
        staged: NcclStaged,
    ) -> Result<(), WorkError> {
        staged.launch(seq, timeout, self.opts.poll_spin, self.checker.as_ref())
    }

    fn abort(&self, cause: &WorkError) {
        self.abort_all(&cause.to_string());
    }

    fn async_error(&self) -> Option<String> {
        self.first_async_error()
    }
}

impl<C: DeviceBuffers> Runs<C> for NcclBackend {
    type Work = DeviceWork<C>;

    fn submit(
        &self,
        seq: &Sequencer,
        timeout: Duration,
        op: Op,
        bufs: C,
    ) -> Result<DeviceWork<C>, Rejected<C>> {
        let first = |b: &C| b.get(0).map_or(0, DeviceMem::count);
        self.submit_as(
            seq,
            timeout,
            op,
            op.name(),
            bufs,
            first,
            |comm, op, bufs, end, at| comm.submit_at(op, bufs, Some(end), at),
        )
    }

    fn stage(
        &self,
        seq: &Sequencer,
        staged: &mut NcclStaged,
        op: Op,
        bufs: C,
    ) -> Result<Batched<DeviceWork<C>>, Rejected<C>> {
        staged.stage(self, seq, op, bufs)
    }
}

impl<B: DeviceMem> Coalesces<B> for NcclBackend {
    type Work = DeviceWork<Vec<B>>;

    /// One `ncclGroupStart` … `ncclGroupEnd` with the op once per buffer
    /// (NCCL fuses them into one launch), one input-ready wait per producer
    /// stream and one end event.
    fn submit_coalesced(
        &self,
        seq: &Sequencer,
        timeout: Duration,
        op: Op,
        bufs: Vec<B>,
    ) -> Result<DeviceWork<Vec<B>>, Rejected<Vec<B>>> {
        let name = op.coalesced_name();
        let total = |b: &Vec<B>| b.iter().map(DeviceMem::count).sum();
        self.submit_as(
            seq,
            timeout,
            op,
            name,
            bufs,
            total,
            |comm, op, bufs, end, _| comm.submit_coalesced_with_end(op, bufs, Some(end)),
        )
    }
}
