//! CUDA graph capture of NCCL ops.
//!
//! [`ProcessGroup::capture`] begins capturing a stream; the ops staged in
//! each [`Capture::batch`] call are captured as one NCCL group (on the
//! process group's collective communicator, which joins the capture and is
//! joined back after every batch); other work enqueued on
//! [`Capture::stream`] is captured in between, in issue order. [`Capture::finish`] instantiates the
//! [`Graph`], which replays everything with
//! [`Graph::launch`](chorus_gpu::nccl::Graph::launch).
//!
//! # What a captured op is
//!
//! Nothing runs at capture time, so a captured op has no work and no
//! future: there is nothing to poll (and polling its events would be illegal
//! while the capture runs). Each op returns a [`Ticket`] instead, which
//! names its buffers inside the graph. "Done" for a replay is
//! stream-ordered on the replay stream, or GPU-finished once
//! [`Graph::done_event`](chorus_gpu::nccl::Graph::done_event)
//! completed.
//!
//! # Lifetimes
//!
//! The buffers move into the capture and then into the graph, and the graph
//! holds the communicators: neither can be freed while the graph can still
//! be replayed, and dropping the graph waits for its last replay. Read and
//! write the buffers between replays with
//! [`Graph::buffers`](chorus_gpu::nccl::Graph::buffers) /
//! [`buffers_mut`](chorus_gpu::nccl::Graph::buffers_mut).
//!
//! # Rules
//!
//! * Captured ops take no sequence numbers and are not in the flight
//!   recorder: they run at replay. Every rank must replay in the same order
//!   relative to its other ops on the group, as for any NCCL op.
//! * While a capture holds the communicator, the group's other device ops
//!   are refused (the communicator's stream would capture them); they work
//!   again once the capture is finished or dropped.
//! * The communicator is created (if needed) before the capture begins: NCCL
//!   must not initialize inside a capture.

use chorus_core::{Op, ReduceOp, WorkError};
use chorus_gpu::cuda::Stream;
use chorus_gpu::nccl::{Batch, DeviceBuffers, DeviceMem, Graph, GraphCapture, Ticket};

use super::process_group::ProcessGroup;
use crate::backend::nccl::{comm_error, device_check, lookup_error};
use crate::error::Rejected;

/// A CUDA graph capture of NCCL ops on one stream (see the
/// [module docs](self)). `!Send`: a capture belongs to the thread that began
/// it. Dropping it unfinished ends the capture and discards it.
#[must_use = "a capture records nothing until ops are staged, and yields a graph only through finish"]
#[derive(Debug)]
pub struct Capture<'pg> {
    pg: &'pg ProcessGroup,
    dev: u32,
    raw: GraphCapture,
}

impl ProcessGroup {
    /// Begins capturing `stream` into a CUDA graph (thread-local capture
    /// mode). The group's collective communicator on the stream's device is
    /// created first if it does not exist yet (every rank must then call
    /// this).
    ///
    /// # Errors
    ///
    /// The communicator cannot be had, or the CUDA error of
    /// `cuStreamBeginCapture` (e.g. the stream is already capturing).
    pub fn capture(&self, stream: &Stream) -> Result<Capture<'_>, WorkError> {
        let dev = stream.device().ordinal() as u32;
        let ctx = self.ctx(0, "capture");
        let comm = self
            .inner
            .nccl
            .collective(dev)
            .map_err(|e| lookup_error(ctx.clone(), &e))?;
        let mut raw = GraphCapture::begin(stream).map_err(|e| WorkError::Backend {
            ctx: ctx.clone(),
            msg: e.to_string(),
        })?;
        raw.hold(&comm).map_err(|e| comm_error(&ctx, e))?;
        Ok(Capture { pg: self, dev, raw })
    }
}

impl<'pg> Capture<'pg> {
    /// The capturing stream: kernels and copies enqueued here are captured,
    /// in order with the captured batches.
    pub fn stream(&self) -> &Stream {
        self.raw.stream()
    }

    /// Stages ops with `stage` and captures them as one batch (one NCCL group). If
    /// `stage` fails nothing is captured (the staged buffers are dropped).
    ///
    /// # Errors
    ///
    /// The error of `stage`, or of capturing the batch (an aborted
    /// communicator, one captured elsewhere, a CUDA or NCCL error — the
    /// capture is then usually invalidated and `finish` fails too).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn demo(pg: &chorus::ProcessGroup, s: &chorus::Stream,
    /// #         bufs: Vec<chorus::DeviceBuffer<f32>>) -> Result<(), Box<dyn std::error::Error>> {
    /// use chorus::ReduceOp;
    /// let mut cap = pg.capture(s)?;
    /// let tickets = cap.batch(|g| {
    ///     let mut t = Vec::new();
    ///     for b in bufs {
    ///         t.push(g.all_reduce(b, ReduceOp::Sum)?);
    ///     }
    ///     Ok(t)
    /// })?;
    /// let mut graph = cap.finish()?;
    /// for _ in 0..5 {
    ///     graph.launch(s)?;
    /// }
    /// graph.done_event().synchronize()?;
    /// let first: Option<&chorus::DeviceBuffer<f32>> = graph.buffers(tickets[0]);
    /// # let _ = first;
    /// # Ok(())
    /// # }
    /// ```
    pub fn batch<T>(
        &mut self,
        stage: impl FnOnce(&mut CaptureBatch<'_>) -> Result<T, WorkError>,
    ) -> Result<T, WorkError> {
        let ctx = self.pg.ctx(0, "capture");
        let comm = self
            .pg
            .inner
            .nccl
            .collective(self.dev)
            .map_err(|e| lookup_error(ctx.clone(), &e))?;
        let mut g = CaptureBatch {
            pg: self.pg,
            dev: self.dev,
            batch: comm.batch(),
        };
        let out = stage(&mut g)?;
        self.raw.launch(g.batch).map_err(|e| comm_error(&ctx, e))?;
        Ok(out)
    }

    /// Ends the capture and instantiates the graph.
    ///
    /// # Errors
    ///
    /// The CUDA error of ending or instantiating (what was captured is then
    /// discarded with its buffers).
    pub fn finish(self) -> Result<Graph, WorkError> {
        let ctx = self.pg.ctx(0, "capture");
        self.raw.finish().map_err(|e| WorkError::Backend {
            ctx,
            msg: e.to_string(),
        })
    }
}

/// The ops of one captured batch (see [`Capture::batch`]). Each checks its
/// arguments at once and returns the [`Ticket`] of its buffers in the graph
/// (a two-buffer op's ticket names `(input, output)`).
///
/// # Errors
///
/// [`Rejected`] with the buffers for invalid arguments or buffers on
/// another device than the capture's stream.
#[derive(Debug)]
pub struct CaptureBatch<'a> {
    pg: &'a ProcessGroup,
    dev: u32,
    batch: Batch,
}

impl CaptureBatch<'_> {
    fn stage<C: DeviceBuffers>(&mut self, op: Op, bufs: C) -> Result<Ticket<C>, Rejected<C>> {
        let name = op.name();
        let first = |b: &C| b.get(0).map_or(0, DeviceMem::count);
        // A captured op takes no sequence number (the graph replays it).
        let ctx = self.pg.ctx(0, name);
        let (dev, _) = match device_check(&self.pg.inner.seq, op, name, &bufs, first) {
            Ok(v) => v,
            Err(e) => return Err(Rejected::new(e.for_op(ctx), bufs)),
        };
        if dev != self.dev {
            let msg = format!(
                "the buffers are on device {dev} but the capture's stream on device {}",
                self.dev
            );
            return Err(Rejected::new(WorkError::InvalidArgument { ctx, msg }, bufs));
        }
        self.batch
            .push(op, bufs)
            .map_err(|(e, bufs)| Rejected::new(comm_error(&ctx, e), bufs))
    }

    /// Captures an all_reduce, in place.
    pub fn all_reduce<B: DeviceMem>(
        &mut self,
        buf: B,
        op: ReduceOp,
    ) -> Result<Ticket<B>, Rejected<B>> {
        self.stage(Op::AllReduce(op), buf)
    }

    /// Captures a broadcast from `root`, in place.
    pub fn broadcast<B: DeviceMem>(
        &mut self,
        buf: B,
        root: usize,
    ) -> Result<Ticket<B>, Rejected<B>> {
        self.stage(Op::Broadcast { root }, buf)
    }

    /// Captures a reduce onto `root`, in place.
    pub fn reduce<B: DeviceMem>(
        &mut self,
        buf: B,
        root: usize,
        op: ReduceOp,
    ) -> Result<Ticket<B>, Rejected<B>> {
        self.stage(Op::Reduce { root, op }, buf)
    }

    /// Captures a send to `dst` (on the collective communicator).
    pub fn send<B: DeviceMem>(&mut self, buf: B, dst: usize) -> Result<Ticket<B>, Rejected<B>> {
        self.stage(Op::Send { peer: dst }, buf)
    }

    /// Captures a recv from `src` (on the collective communicator).
    pub fn recv<B: DeviceMem>(&mut self, buf: B, src: usize) -> Result<Ticket<B>, Rejected<B>> {
        self.stage(Op::Recv { peer: src }, buf)
    }

    /// Captures an all_gather of `input` into `output`.
    pub fn all_gather<B: DeviceMem>(
        &mut self,
        input: B,
        output: B,
    ) -> Result<Ticket<(B, B)>, Rejected<(B, B)>> {
        self.stage(Op::AllGather, (input, output))
    }

    /// Captures a reduce_scatter of `input` into `output`.
    pub fn reduce_scatter<B: DeviceMem>(
        &mut self,
        input: B,
        output: B,
        op: ReduceOp,
    ) -> Result<Ticket<(B, B)>, Rejected<(B, B)>> {
        self.stage(Op::ReduceScatter(op), (input, output))
    }

    /// Captures an all_to_all of `input` into `output`.
    pub fn all_to_all<B: DeviceMem>(
        &mut self,
        input: B,
        output: B,
    ) -> Result<Ticket<(B, B)>, Rejected<(B, B)>> {
        self.stage(Op::AllToAll, (input, output))
    }
}
