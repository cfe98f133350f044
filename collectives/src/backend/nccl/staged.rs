//! Device ops of a batch, staged: one NCCL batch on the process group's
//! collective communicator, launched as one `ncclGroupStart` …
//! `ncclGroupEnd` with one end event for all of them, registered as one
//! work that each op's work reads (see `device_work::member`).
//!
//! Point-to-point ops in a batch run on the collective communicator (with
//! group ranks), not on the pair communicators that a lone `send`/`recv`
//! uses, as NCCL requires for a send and a recv to pair up inside one NCCL
//! group.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chorus_core::flight_recorder::OpMeta;
use chorus_core::work::FinishedProbe;
use chorus_core::{Op, OpContext, WorkBatch, WorkError};
use chorus_gpu::nccl::{Batch, DeviceBuffers, DeviceMem, NoBuffers};

use super::backend::{comm_error, device_check, lookup_error, NcclBackend};
use crate::backend::checked::{signature_of, Checker};
use crate::batched::{self, Batched};
use crate::device_work::{BatchLead, DeviceWork, Member};
use crate::error::Rejected;
use crate::sequence::{Sequencer, Taken};

/// The device ops of a batch, staged until launch. Dropped unlaunched, it
/// fails their works (the ops never ran) and drops their buffers, which no
/// GPU work has seen.
#[derive(Default)]
pub(crate) struct NcclStaged {
    batch: Option<Batch>,
    lead: Option<Arc<BatchLead>>,
    /// The first op as staged, named if the batch is dropped unlaunched.
    first: Option<OpContext>,
    ops: Vec<StagedOp>,
}

impl fmt::Debug for NcclStaged {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NcclStaged")
            .field("ops", &self.ops.len())
            .finish()
    }
}

/// What the launch registers of a staged op.
struct StagedOp {
    op: Op,
    name: &'static str,
    meta: OpMeta,
}

impl NcclStaged {
    /// Number of ops staged.
    pub(crate) fn len(&self) -> usize {
        self.ops.len()
    }

    /// Checks `op` on `bufs` and stages it in the NCCL batch (made on
    /// the collective communicator of the first op's device).
    pub(super) fn stage<C: DeviceBuffers>(
        &mut self,
        backend: &NcclBackend,
        seq: &Sequencer,
        op: Op,
        bufs: C,
    ) -> Result<Batched<DeviceWork<C>>, Rejected<C>> {
        let name = op.name();
        if matches!(op, Op::SendRecv { .. }) {
            let e = seq.invalid(
                op,
                name,
                "send_recv cannot be batched; stage a send and a recv".into(),
            );
            return Err(Rejected::new(e, bufs));
        }
        let first = |b: &C| b.get(0).map_or(0, DeviceMem::count);
        let (dev, meta) = match device_check(seq, op, name, &bufs, first) {
            Ok(v) => v,
            Err(e) => return Err(Rejected::new(e, bufs)),
        };
        let ctx = seq.ctx(0, name);
        let (batch, lead) = match (&mut self.batch, &self.lead) {
            (Some(b), Some(l)) => (b, l.clone()),
            _ => {
                let comm = match backend.collective(dev) {
                    Ok(c) => c,
                    Err(e) => return Err(Rejected::new(lookup_error(ctx, &e), bufs)),
                };
                // The batch's end event from the start: each op's work
                // names it, and the batch's registry entry asks it before
                // the watchdog times the batch out (a work completes when
                // it is polled, and may not be for a while).
                let end = match comm.reserve_end_event() {
                    Ok(e) => e,
                    Err(e) => return Err(Rejected::new(comm_error(&ctx, e.into()), bufs)),
                };
                let lead = self.lead.insert(BatchLead::new(end)).clone();
                self.first = Some(ctx.clone());
                let batch = self.batch.insert(comm.batch());
                self.ops.reserve(batch.capacity());
                (batch, lead)
            }
        };
        let ticket = match batch.push(op, bufs) {
            Ok(t) => t,
            Err((e, bufs)) => return Err(Rejected::new(comm_error(&ctx, e), bufs)),
        };
        let index = self.ops.len();
        self.ops.push(StagedOp { op, name, meta });
        let work = DeviceWork::member(Member::new(lead, index, ticket, ctx));
        Ok(Batched::held(work, DeviceWork::launched))
    }

    /// Registers the staged ops in order as one batch standing for all of
    /// them (their sequence numbers taken under one hold of the submission
    /// lock; one registry entry, one deadline, one work for all), then
    /// launches the batch. Each op's work reads the batch's work; the ops
    /// share one end event.
    pub(super) fn launch(
        mut self,
        seq: &Sequencer,
        timeout: Duration,
        spin: Duration,
        checker: Option<&Checker>,
    ) -> Result<(), WorkError> {
        let mut ops = std::mem::take(&mut self.ops);
        let (Some(batch), Some(lead)) = (self.batch.take(), self.lead.take()) else {
            return Ok(());
        };
        let mut counters = seq.lock();
        let Some(head) = ops.first() else {
            return Ok(());
        };
        let first = seq.ctx(counters.next(head.op), head.name);
        if let Some(checker) = checker {
            let sigs: Vec<_> = ops.iter().map(|o| signature_of(o.op, &o.meta)).collect();
            if let Err(err) = checker.verify(seq, &mut counters, &first, &sigs) {
                drop(counters);
                lead.not_run(err.clone());
                return Err(err);
            }
        }
        // Given back if the launch fails: the ops never ran.
        let mut taken = Taken::default();
        // One launch, one clock reading.
        let now = Instant::now();
        // The batch's end event tells the watchdog the ops finished.
        let probe: Arc<dyn FinishedProbe> = lead.end().clone();
        // Each op takes its sequence number here; the registry keeps the
        // list of them, which the batch's works name themselves by.
        let registered = WorkBatch::register(
            seq.registry(),
            &first,
            ops.len(),
            now,
            Some(timeout),
            Some(probe),
            |b| {
                let mut work = None;
                for o in &mut ops {
                    let n = counters.take(o.op, &mut taken);
                    let ctx = seq.ctx(n, o.name);
                    let meta = std::mem::take(&mut o.meta);
                    let collective = o.op.is_collective();
                    if work.is_none() {
                        work = Some(b.add::<Option<NoBuffers>>(ctx, collective, meta));
                    } else {
                        b.record(ctx, collective, meta);
                    }
                }
                work
            },
        );
        let (work, ctxs) = match registered {
            Ok((Some(w), ctxs)) => (w, ctxs),
            Ok((None, _)) => return Ok(()),
            Err(err) => {
                counters.give_back(taken);
                drop(counters);
                // Nothing ran: the buffers go with the batch.
                lead.not_run(err.clone());
                return Err(err);
            }
        };
        let launched = batch.launch_with_end(Some(lead.end().clone()));
        let failed = launched.error().cloned().map(|e| comm_error(&first, e));
        if failed.is_some() {
            counters.give_back(taken);
        }
        drop(counters);
        lead.launched(launched, ctxs, work, failed.as_ref(), spin);
        match failed {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

impl Drop for NcclStaged {
    fn drop(&mut self) {
        if let (Some(lead), Some(first)) = (&self.lead, &self.first) {
            lead.not_run(batched::cancelled(first));
        }
    }
}
