//! Device ops of a group, staged: one NCCL batch on the group's collective
//! communicator, launched as one `ncclGroupStart` … `ncclGroupEnd` with one
//! end event for all of them.
//!
//! Point-to-point ops in a group run on the collective communicator (with
//! group ranks), not on the pair communicators that a lone `send`/`recv`
//! uses, as NCCL requires for a send and a recv to pair up inside one
//! group.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chorus_core::flight_recorder::OpMeta;
use chorus_core::work::FinishedProbe;
use chorus_core::{Op, OpContext, WorkBatch, WorkError};
use chorus_gpu::nccl::{Batch, DeviceBuffers, DeviceMem, Launched, Ticket};

use super::backend::{comm_error, device_check, lookup_error, DevicePair, NcclBackend};
use crate::device_work::DeviceWork;
use crate::error::Rejected;
use crate::grouped::{self, Cell, Grouped};
use crate::sequence::Sequencer;

/// The device ops of a group, staged until launch. Dropped unlaunched, it
/// fails their works (the ops never ran) and drops their buffers, which no
/// GPU work has seen.
#[derive(Default)]
pub(crate) struct NcclStaged {
    batch: Option<Batch>,
    ops: Vec<Box<dyn DeviceEntry>>,
}

impl fmt::Debug for NcclStaged {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NcclStaged")
            .field("ops", &self.ops.len())
            .finish()
    }
}

/// A staged device op, typed inside.
trait DeviceEntry {
    fn op(&self) -> Op;
    fn ctx0(&self) -> &OpContext;
    /// Registers the op's work under `ctx` in the group's batch.
    fn register(&mut self, batch: &mut WorkBatch<'_>, ctx: OpContext);
    /// Hands the launched op its buffers and end event, or fails it.
    fn deliver(
        self: Box<Self>,
        launched: &mut Launched,
        failed: Option<&WorkError>,
        spin: Duration,
    );
    /// Fails the op before launch.
    fn fail(self: Box<Self>, err: WorkError);
}

struct DeviceOp<C: DeviceBuffers> {
    op: Op,
    ctx: OpContext,
    meta: OpMeta,
    ticket: Ticket<C>,
    pair: Option<DevicePair<C>>,
    cell: Cell<DeviceWork<C>>,
}

fn not_registered(ctx: &OpContext) -> WorkError {
    WorkError::Backend {
        ctx: ctx.clone(),
        msg: "a grouped op was launched without a registered work (a chorus bug)".into(),
    }
}

impl<C: DeviceBuffers> DeviceEntry for DeviceOp<C> {
    fn op(&self) -> Op {
        self.op
    }

    fn ctx0(&self) -> &OpContext {
        &self.ctx
    }

    fn register(&mut self, batch: &mut WorkBatch<'_>, ctx: OpContext) {
        self.ctx = ctx.clone();
        let meta = std::mem::take(&mut self.meta);
        self.pair = Some(batch.add(ctx, self.op.is_collective(), meta));
    }

    fn deliver(
        self: Box<Self>,
        launched: &mut Launched,
        failed: Option<&WorkError>,
        spin: Duration,
    ) {
        let DeviceOp {
            ctx,
            ticket,
            pair,
            cell,
            ..
        } = *self;
        let Some((work, completer)) = pair else {
            grouped::put(&cell, Err(not_registered(&ctx)));
            return;
        };
        // Taken in every case: on failure the buffers then wait for the
        // stream (or go at once if nothing was enqueued).
        let inflight = launched.take(ticket);
        let err = match (failed, inflight) {
            (None, Some(inflight)) => {
                // Held by its work, as a lone op is: the first of the
                // group's works to see the shared end event complete
                // tells the others without the driver; the reactor sees
                // only the works awaited before the group ended.
                grouped::put(&cell, Ok(DeviceWork::held(work, inflight, completer, spin)));
                return;
            }
            (Some(e), _) => e.for_op(ctx),
            (None, None) => WorkError::Backend {
                msg: "the group's launch lost an op's buffers (a chorus bug)".into(),
                ctx,
            },
        };
        completer.complete(Err(err.clone()));
        drop(work);
        grouped::put(&cell, Err(err));
    }

    fn fail(self: Box<Self>, err: WorkError) {
        let ctx = self.ctx.clone();
        if let Some((_, completer)) = self.pair {
            completer.complete(Err(err.for_op(ctx.clone())));
        }
        grouped::put(&self.cell, Err(err.for_op(ctx)));
    }
}

impl NcclStaged {
    /// Number of ops staged.
    pub(crate) fn len(&self) -> usize {
        self.ops.len()
    }

    /// Checks `op` on `bufs` and stages it in the group's batch (made on
    /// the collective communicator of the first op's device).
    pub(super) fn stage<C: DeviceBuffers>(
        &mut self,
        backend: &NcclBackend,
        seq: &Sequencer,
        op: Op,
        bufs: C,
    ) -> Result<Grouped<DeviceWork<C>>, Rejected<C>> {
        let name = op.name();
        if matches!(op, Op::SendRecv { .. }) {
            let e = seq.invalid(
                name,
                "send_recv cannot be grouped; stage a send and a recv".into(),
            );
            return Err(Rejected::new(e, bufs));
        }
        let first = |b: &C| b.get(0).map_or(0, DeviceMem::count);
        let (dev, meta) = match device_check(seq, op, name, &bufs, first) {
            Ok(v) => v,
            Err(e) => return Err(Rejected::new(e, bufs)),
        };
        let batch = match &mut self.batch {
            Some(b) => b,
            None => match backend.collective(dev) {
                Ok(c) => self.batch.insert(c.batch()),
                Err(e) => return Err(Rejected::new(lookup_error(seq.ctx(0, name), &e), bufs)),
            },
        };
        let ctx = seq.ctx(0, name);
        let ticket = match batch.push(op, bufs) {
            Ok(t) => t,
            Err((e, bufs)) => return Err(Rejected::new(comm_error(&ctx, e), bufs)),
        };
        let cell = grouped::cell();
        self.ops.push(Box::new(DeviceOp::<C> {
            op,
            ctx: ctx.clone(),
            meta,
            ticket,
            pair: None,
            cell: cell.clone(),
        }));
        Ok(Grouped::new(cell, ctx))
    }

    /// Registers every staged op in order as one batch of works (their
    /// sequence numbers are taken under one hold of the submission lock;
    /// one registry entry, one deadline and one end for all of them), then
    /// launches the batch. Each op's work holds its part of the launch; the
    /// ops share one end event.
    pub(super) fn launch(
        mut self,
        seq: &Sequencer,
        timeout: Duration,
        spin: Duration,
    ) -> Result<(), WorkError> {
        let mut ops = std::mem::take(&mut self.ops);
        let Some(batch) = self.batch.take() else {
            return Ok(());
        };
        // The group's end event first: each op's registry entry asks it
        // before the watchdog times the op out (a work completes when it
        // is polled, and may not be for a while).
        let end = match batch.communicator().reserve_end_event() {
            Ok(e) => e,
            Err(e) => {
                let first = ops.first().map(|o| o.ctx0().clone());
                let err = comm_error(&first.unwrap_or_else(|| seq.ctx(0, "group")), e.into());
                for e in ops {
                    e.fail(err.clone());
                }
                return Err(err);
            }
        };
        let mut counters = seq.lock();
        let mut next = counters.clone();
        // One launch, one clock reading.
        let now = Instant::now();
        let first = match ops.first() {
            Some(e) => seq.ctx(next.next(e.op()), e.ctx0().op),
            None => seq.ctx(0, "group"),
        };
        // The group's end event tells the watchdog the ops finished.
        let probe: Arc<dyn FinishedProbe> = end.clone();
        let registered = WorkBatch::register(
            seq.registry(),
            &first,
            ops.len(),
            now,
            Some(timeout),
            Some(probe),
            |batch| {
                for e in ops.iter_mut() {
                    let op = e.op();
                    let n = next.next(op);
                    next.bump(op, n);
                    let ctx = seq.ctx(n, e.ctx0().op);
                    e.register(batch, ctx);
                }
            },
        );
        if let Err(err) = registered {
            drop(counters);
            for e in ops {
                e.fail(err.clone());
            }
            return Err(err);
        }
        let mut launched = batch.launch_with_end(Some(end));
        let failed = launched.error().cloned().map(|e| {
            let first = ops.first().map(|o| o.ctx0().clone());
            comm_error(&first.unwrap_or_else(|| seq.ctx(0, "group")), e)
        });
        if failed.is_none() {
            *counters = next;
        }
        drop(counters);
        for e in ops {
            e.deliver(&mut launched, failed.as_ref(), spin);
        }
        match failed {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

impl Drop for NcclStaged {
    fn drop(&mut self) {
        for e in self.ops.drain(..) {
            let err = grouped::cancelled(e.ctx0());
            e.fail(err);
        }
    }
}
