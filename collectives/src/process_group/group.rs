//! Grouped ops: several collectives and point-to-point ops issued as one.
//!
//! [`ProcessGroup::group`] opens a [`Group`]; its op methods check and
//! stage ops without running them; [`Group::launch`] issues them together:
//!
//! * **NCCL** (device buffers): one `ncclGroupStart` … `ncclGroupEnd` on the
//!   group's collective communicator, so NCCL fuses the ops into one plan
//!   and launch; one input-ready wait per producer stream, one end event for
//!   the whole group. Point-to-point ops in a group run on the collective
//!   communicator (with group ranks), not on the pair communicators that a
//!   lone `send`/`recv` uses, as NCCL requires for a send and a recv to
//!   pair up inside one group.
//! * **TCP** (host buffers): the ops reach the worker as one batch; runs of
//!   all_reduces with the same dtype and reduction are fused into one
//!   all_reduce of their concatenation (one message exchange), the other ops
//!   run in order.
//!
//! Every op of a group returns its own [`Grouped`] work, and every one of
//! them resolves when the whole group has completed (on NCCL they share the
//! end event). Ops take their sequence numbers at launch, in staging order,
//! so a group is atomic with respect to ops submitted by other threads.
//!
//! The NCCL group is opened and closed inside [`Group::launch`], on the
//! calling thread: it can never be left open, whatever the caller does in
//! between, and [`Group`] is `!Send` (a group belongs to the thread that
//! staged it). A group dropped before launch (an error with `?`, a panic)
//! runs nothing; its works fail with [`WorkError::InvalidArgument`] saying
//! so, and its buffers are dropped (no GPU work ever saw them).

use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use chorus_core::flight_recorder::OpMeta;
use chorus_core::{OpContext, WorkError};
use chorus_gpu::nccl::batch::{Batch, Launched, Ticket};
use chorus_gpu::nccl::{CommOp, DeviceMem, WatchSet};

use super::{comm_error, lookup_error, watch_device, DevicePair, ProcessGroup};
use crate::backend::{OpKind, OpOutput};
use crate::device::{DeviceResult, DeviceWork, Op1, Op2, OpBuffer};
use crate::error::Rejected;
use crate::work::{OpResult, Work};

/// Ops staged to run as one (see the [module docs](self)).
///
/// # Examples
///
/// ```
/// # async fn demo(pg: &chorus::ProcessGroup) -> Result<(), chorus::Error> {
/// use chorus::ReduceOp;
/// let mut g = pg.group();
/// let a = g.all_reduce(vec![1.0f32; 4], ReduceOp::Sum)?;
/// let b = g.all_reduce(vec![2i64; 3], ReduceOp::Max)?;
/// g.launch()?;
/// let (a, b) = futures::try_join!(a, b)?;
/// # let _ = (a, b);
/// # Ok(())
/// # }
/// ```
#[must_use = "a group runs nothing until it is launched"]
pub struct Group<'pg> {
    pg: &'pg ProcessGroup,
    staged: Staged,
    /// A group belongs to the thread that stages it.
    _not_send: PhantomData<*const ()>,
}

impl std::fmt::Debug for Group<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (backend, ops) = match &self.staged {
            Staged::Empty => ("none", 0),
            Staged::Host(v) => ("tcp", v.len()),
            Staged::Device { ops, .. } => ("nccl", ops.len()),
        };
        f.debug_struct("Group")
            .field("group", &self.pg.name())
            .field("backend", &backend)
            .field("ops", &ops)
            .finish()
    }
}

enum Staged {
    Empty,
    Host(Vec<HostEntry>),
    Device {
        batch: Batch,
        ops: Vec<Box<dyn DeviceEntry>>,
    },
}

/// A staged host op and where its work goes.
struct HostEntry {
    kind: OpKind,
    ctx: OpContext,
    deliver: Box<dyn FnOnce(Result<chorus_core::OpFuture<OpOutput>, WorkError>)>,
}

/// A staged device op, typed inside.
trait DeviceEntry {
    fn op(&self) -> CommOp;
    fn ctx0(&self) -> &OpContext;
    /// Registers the op's work under `ctx`.
    fn register(&mut self, pg: &ProcessGroup, ctx: OpContext) -> Result<(), WorkError>;
    /// Hands the launched op its buffers and end event, or fails it.
    fn deliver(
        self: Box<Self>,
        launched: &mut Launched,
        failed: Option<&WorkError>,
        set: &mut WatchSet,
    );
    /// Fails the op before launch.
    fn fail(self: Box<Self>, err: WorkError);
}

type Cell<W> = Arc<Mutex<Option<Result<W, WorkError>>>>;

fn put<W>(cell: &Cell<W>, v: Result<W, WorkError>) {
    *cell.lock().unwrap_or_else(|p| p.into_inner()) = Some(v);
}

struct DeviceOp<R: DeviceResult> {
    op: CommOp,
    ctx: OpContext,
    meta: OpMeta,
    ticket: Ticket<R::Buf>,
    pair: Option<DevicePair<R>>,
    cell: Cell<DeviceWork<R>>,
}

impl<R: DeviceResult> DeviceEntry for DeviceOp<R> {
    fn op(&self) -> CommOp {
        self.op
    }

    fn ctx0(&self) -> &OpContext {
        &self.ctx
    }

    fn register(&mut self, pg: &ProcessGroup, ctx: OpContext) -> Result<(), WorkError> {
        self.ctx = ctx.clone();
        self.pair = Some(pg.register_device::<R>(ctx, self.op, self.meta.clone(), None)?);
        Ok(())
    }

    fn deliver(
        self: Box<Self>,
        launched: &mut Launched,
        failed: Option<&WorkError>,
        set: &mut WatchSet,
    ) {
        let DeviceOp {
            ctx,
            ticket,
            pair,
            cell,
            ..
        } = *self;
        let Some((work, completer)) = pair else {
            put(&cell, Err(not_registered(&ctx)));
            return;
        };
        // Taken in every case: on failure the buffers then wait for the
        // stream (or go at once if nothing was enqueued).
        let inflight = launched.take(ticket);
        let err = match (failed, inflight) {
            (None, Some(inflight)) => {
                put(
                    &cell,
                    Ok(DeviceWork::watched(
                        work,
                        watch_device(inflight, completer, set),
                    )),
                );
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
        put(&cell, Err(err));
    }

    fn fail(self: Box<Self>, err: WorkError) {
        let ctx = self.ctx.clone();
        if let Some((_, completer)) = self.pair {
            completer.complete(Err(err.for_op(ctx.clone())));
        }
        put(&self.cell, Err(err.for_op(ctx)));
    }
}

/// Checks a device op of a group or capture (`op` in group ranks) and
/// returns its device and what the flight recorder keeps of it.
pub(super) fn device_check<B: DeviceMem>(
    pg: &ProcessGroup,
    op: CommOp,
    bufs: &[B],
) -> Result<(u32, OpMeta), WorkError> {
    let name = super::device_op_name(op);
    let Some(first) = bufs.first() else {
        return Err(pg.invalid(0, name, "no buffer given".into()));
    };
    let dev = first.stream().device().ordinal() as u32;
    let mut meta = OpMeta {
        dtype: Some(std::borrow::Cow::Borrowed(first.nccl_type().name())),
        count: first.count() as u64,
        peer: None,
    };
    match op {
        CommOp::Send { peer } | CommOp::Recv { peer } => {
            meta.peer = Some(peer);
            pg.check_peer(name, peer)?;
        }
        CommOp::Broadcast { root } | CommOp::Reduce { root, .. } => {
            meta.peer = Some(root);
            pg.check_rank(name, "root", root)?;
        }
        CommOp::SendRecv { .. } => {
            return Err(pg.invalid(
                0,
                name,
                "send_recv cannot be grouped; stage a send and a recv".into(),
            ))
        }
        _ => {}
    }
    Ok((dev, meta))
}

fn not_registered(ctx: &OpContext) -> WorkError {
    WorkError::Backend {
        ctx: ctx.clone(),
        msg: "a grouped op was launched without a registered work (a chorus bug)".into(),
    }
}

fn cancelled(ctx: &OpContext) -> WorkError {
    WorkError::InvalidArgument {
        ctx: ctx.clone(),
        msg: "its group was dropped before launch (an error or panic while staging it): \
              the op never ran"
            .into(),
    }
}

impl ProcessGroup {
    /// Opens a group: stage ops on it, then [`launch`](Group::launch) them
    /// as one (see [`Group`]).
    pub fn group(&self) -> Group<'_> {
        Group {
            pg: self,
            staged: Staged::Empty,
            _not_send: PhantomData,
        }
    }

    /// Runs `stage` on a new group and launches the group if it returns
    /// `Ok`; on `Err` (or a panic) nothing runs.
    ///
    /// # Errors
    ///
    /// The error of `stage`, or of the launch.
    ///
    /// # Examples
    ///
    /// ```
    /// # async fn demo(pg: &chorus::ProcessGroup) -> Result<(), chorus::Error> {
    /// use chorus::ReduceOp;
    /// let (a, b) = pg.grouped(|g| {
    ///     Ok::<_, chorus::Error>((
    ///         g.all_reduce(vec![1.0f32; 4], ReduceOp::Sum)?,
    ///         g.broadcast(vec![0u8; 16], 0)?,
    ///     ))
    /// })?;
    /// let (a, b) = (a.await?, b.await?);
    /// # let _ = (a, b);
    /// # Ok(())
    /// # }
    /// ```
    pub fn grouped<T, E>(&self, stage: impl FnOnce(&mut Group<'_>) -> Result<T, E>) -> Result<T, E>
    where
        E: From<WorkError>,
    {
        let mut g = self.group();
        let out = stage(&mut g)?;
        g.launch()?;
        Ok(out)
    }
}

/// The group's ops. Each checks its arguments at once (a refusal gives the
/// buffers back and leaves the group as it was) and stages the op.
///
/// # Errors
///
/// [`Rejected`] with the buffers for invalid arguments, for a buffer of the
/// other backend than the group's first op (a group runs on one backend),
/// for device buffers on another device than the group's first, and when
/// the NCCL communicator cannot be had.
impl Group<'_> {
    /// Stages an all_reduce (see [`ProcessGroup::all_reduce`]).
    pub fn all_reduce<B: OpBuffer>(
        &mut self,
        buf: B,
        op: crate::ReduceOp,
    ) -> Result<Grouped<B::Work>, Rejected<B>> {
        B::stage1(self, buf, Op1::AllReduce(op))
    }

    /// Stages a broadcast (see [`ProcessGroup::broadcast`]).
    pub fn broadcast<B: OpBuffer>(
        &mut self,
        buf: B,
        root: usize,
    ) -> Result<Grouped<B::Work>, Rejected<B>> {
        B::stage1(self, buf, Op1::Broadcast { root })
    }

    /// Stages a reduce (see [`ProcessGroup::reduce`]).
    pub fn reduce<B: OpBuffer>(
        &mut self,
        buf: B,
        root: usize,
        op: crate::ReduceOp,
    ) -> Result<Grouped<B::Work>, Rejected<B>> {
        B::stage1(self, buf, Op1::Reduce { root, op })
    }

    /// Stages an all_gather (see [`ProcessGroup::all_gather`]).
    pub fn all_gather<B: OpBuffer>(
        &mut self,
        input: B,
        output: B,
    ) -> Result<Grouped<B::PairWork>, Rejected<(B, B)>> {
        B::stage2(self, input, output, Op2::AllGather)
    }

    /// Stages a reduce_scatter (see [`ProcessGroup::reduce_scatter`]).
    pub fn reduce_scatter<B: OpBuffer>(
        &mut self,
        input: B,
        output: B,
        op: crate::ReduceOp,
    ) -> Result<Grouped<B::PairWork>, Rejected<(B, B)>> {
        B::stage2(self, input, output, Op2::ReduceScatter(op))
    }

    /// Stages an all_to_all (see [`ProcessGroup::all_to_all`]).
    pub fn all_to_all<B: OpBuffer>(
        &mut self,
        input: B,
        output: B,
    ) -> Result<Grouped<B::PairWork>, Rejected<(B, B)>> {
        B::stage2(self, input, output, Op2::AllToAll)
    }

    /// Stages a send to `dst` (see [`ProcessGroup::send`]). Inside a group,
    /// a send and the matching recv may be staged in either order on each
    /// rank.
    pub fn send<B: OpBuffer>(
        &mut self,
        buf: B,
        dst: usize,
    ) -> Result<Grouped<B::Work>, Rejected<B>> {
        B::stage1(self, buf, Op1::Send { peer: dst })
    }

    /// Stages a recv from `src` (see [`ProcessGroup::recv`]).
    pub fn recv<B: OpBuffer>(
        &mut self,
        buf: B,
        src: usize,
    ) -> Result<Grouped<B::Work>, Rejected<B>> {
        B::stage1(self, buf, Op1::Recv { peer: src })
    }
}

impl<'pg> Group<'pg> {
    /// The process group the ops run on.
    pub fn process_group(&self) -> &'pg ProcessGroup {
        self.pg
    }

    /// Number of ops staged.
    pub fn len(&self) -> usize {
        match &self.staged {
            Staged::Empty => 0,
            Staged::Host(v) => v.len(),
            Staged::Device { ops, .. } => ops.len(),
        }
    }

    /// True if no op was staged.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn wrong_backend(&self, op: &'static str, this: &str) -> WorkError {
        self.pg.invalid(
            0,
            op,
            format!(
                "a group runs on one backend: its first op took {} buffers, this one {this} buffers",
                if this == "host" { "device" } else { "host" }
            ),
        )
    }

    /// Stages a checked host op; its work yields `R`.
    pub(crate) fn stage_host<R: OpResult + Send + 'static, B>(
        &mut self,
        kind: OpKind,
        back: fn(OpKind) -> B,
    ) -> Result<Grouped<Work<R>>, Rejected<B>> {
        if matches!(self.staged, Staged::Device { .. }) {
            let error = self.wrong_backend(kind.name(), "host");
            return Err(Rejected {
                error,
                buffers: back(kind),
            });
        }
        if matches!(self.staged, Staged::Empty) {
            self.staged = Staged::Host(Vec::new());
        }
        let ctx = self.pg.ctx(0, kind.name());
        let cell: Cell<Work<R>> = Arc::new(Mutex::new(None));
        let c = cell.clone();
        let entry = HostEntry {
            kind,
            ctx: ctx.clone(),
            deliver: Box::new(move |r| put(&c, r.map(Work::new))),
        };
        if let Staged::Host(v) = &mut self.staged {
            v.push(entry);
        }
        Ok(Grouped::new(cell, ctx))
    }

    /// Checks and stages a device op (`op` in group ranks).
    pub(crate) fn stage_device<R: DeviceResult>(
        &mut self,
        op: CommOp,
        bufs: Vec<R::Buf>,
    ) -> Result<Grouped<DeviceWork<R>>, (WorkError, Vec<R::Buf>)> {
        let name = super::device_op_name(op);
        if matches!(self.staged, Staged::Host(_)) {
            return Err((self.wrong_backend(name, "device"), bufs));
        }
        let pg = self.pg;
        let (dev, meta) = match device_check(pg, op, &bufs) {
            Ok(v) => v,
            Err(e) => return Err((e, bufs)),
        };
        if matches!(self.staged, Staged::Empty) {
            let comm = match pg.inner.nccl.collective(dev) {
                Ok(c) => c,
                Err(e) => return Err((lookup_error(pg.ctx(0, name), &e), bufs)),
            };
            self.staged = Staged::Device {
                batch: comm.batch(),
                ops: Vec::new(),
            };
        }
        let Staged::Device { batch, ops } = &mut self.staged else {
            return Err((
                pg.invalid(0, name, "the group is not a device group".into()),
                bufs,
            ));
        };
        let ctx = pg.ctx(0, name);
        let ticket = match batch.push(op, bufs) {
            Ok(t) => t,
            Err((e, bufs)) => return Err((comm_error(&ctx, e), bufs)),
        };
        let cell: Cell<DeviceWork<R>> = Arc::new(Mutex::new(None));
        ops.push(Box::new(DeviceOp::<R> {
            op,
            ctx: ctx.clone(),
            meta,
            ticket,
            pair: None,
            cell: cell.clone(),
        }));
        Ok(Grouped::new(cell, ctx))
    }

    /// Issues every staged op as one (see [`Group`]); returns at once. Each
    /// op's [`Grouped`] work then resolves when the whole group completes.
    /// An empty group launches nothing.
    ///
    /// # Errors
    ///
    /// The group already failed, or the launch failed (the NCCL or CUDA
    /// error): every op of the group then fails with the same error.
    pub fn launch(mut self) -> Result<(), WorkError> {
        match std::mem::replace(&mut self.staged, Staged::Empty) {
            Staged::Empty => Ok(()),
            Staged::Host(entries) => self.launch_host(entries),
            Staged::Device { batch, ops } => self.launch_device(batch, ops),
        }
    }

    fn launch_host(&self, entries: Vec<HostEntry>) -> Result<(), WorkError> {
        let pg = self.pg;
        let g = &pg.inner;
        let mut counters = g.submit.lock().unwrap_or_else(|p| p.into_inner());
        let mut reqs = Vec::with_capacity(entries.len());
        let mut failure: Option<WorkError> = None;
        for e in entries {
            if let Some(err) = &failure {
                (e.deliver)(Err(err.for_op(e.ctx)));
                continue;
            }
            match pg.register(&mut counters, e.kind) {
                Ok((work, req)) => {
                    (e.deliver)(Ok(work));
                    reqs.push(req);
                }
                Err((err, _kind)) => {
                    (e.deliver)(Err(err.clone()));
                    failure = Some(err);
                }
            }
        }
        if let Some(err) = failure {
            // Nothing of a group runs unless all of it does.
            for r in reqs {
                let e = err.for_op(r.ctx.clone());
                r.completer.complete(Err(e));
            }
            return Err(err);
        }
        g.backend.submit_group(reqs);
        Ok(())
    }

    fn launch_device(
        &self,
        batch: Batch,
        mut ops: Vec<Box<dyn DeviceEntry>>,
    ) -> Result<(), WorkError> {
        let pg = self.pg;
        let g = &pg.inner;
        let mut counters = g.submit.lock().unwrap_or_else(|p| p.into_inner());
        let mut next = counters.clone();
        let mut failure = None;
        for e in ops.iter_mut() {
            let op = e.op();
            let seq = next.next_device(op);
            next.bump_device(op, seq);
            let ctx = pg.ctx(seq, e.ctx0().op);
            if let Err(err) = e.register(pg, ctx) {
                failure = Some(err);
                break;
            }
        }
        if let Some(err) = failure {
            drop(counters);
            for e in ops {
                e.fail(err.clone());
            }
            return Err(err);
        }
        let mut launched = batch.launch();
        let failed = launched.error().cloned().map(|e| {
            let first = ops.first().map(|o| o.ctx0().clone());
            comm_error(&first.unwrap_or_else(|| pg.ctx(0, "group")), e)
        });
        if failed.is_none() {
            *counters = next;
        }
        drop(counters);
        // One reactor entry for the whole group: its ops share the end event.
        let mut set = WatchSet::new();
        for e in ops {
            e.deliver(&mut launched, failed.as_ref(), &mut set);
        }
        set.register();
        match failed {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

impl Drop for Group<'_> {
    fn drop(&mut self) {
        match std::mem::replace(&mut self.staged, Staged::Empty) {
            Staged::Empty => {}
            Staged::Host(entries) => {
                for e in entries {
                    let err = cancelled(&e.ctx);
                    (e.deliver)(Err(err));
                }
            }
            Staged::Device { ops, .. } => {
                for e in ops {
                    let err = cancelled(e.ctx0());
                    e.fail(err);
                }
            }
        }
    }
}

/// The work of an op staged in a [`Group`]: after [`Group::launch`] it is
/// the op's ordinary work `W` ([`Work`] or [`DeviceWork`]), and it resolves
/// when the whole group has completed.
///
/// # Cancel safety
///
/// As for `W`: dropping it detaches the op, which still runs with its group.
#[must_use = "the op runs with its group anyway, but its buffers come back only through the work"]
pub struct Grouped<W> {
    cell: Cell<W>,
    work: Option<W>,
    ctx: OpContext,
}

impl<W> std::fmt::Debug for Grouped<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grouped")
            .field("op", &self.ctx)
            .field("launched", &self.work.is_some())
            .finish()
    }
}

impl<W> Grouped<W> {
    fn new(cell: Cell<W>, ctx: OpContext) -> Self {
        Grouped {
            cell,
            work: None,
            ctx,
        }
    }

    fn fetch(&mut self) -> Option<Result<&mut W, WorkError>> {
        if self.work.is_none() {
            match self.cell.lock().unwrap_or_else(|p| p.into_inner()).take() {
                Some(Ok(w)) => self.work = Some(w),
                Some(Err(e)) => return Some(Err(e)),
                None => return None,
            }
        }
        self.work.as_mut().map(Ok)
    }

    /// The op's work, once its group was launched (for the levels `W`
    /// offers beyond `.await`, e.g. [`DeviceWork::stream_ordered`]).
    ///
    /// # Errors
    ///
    /// The group was not launched yet (the op still runs with its group if
    /// it is launched later), was dropped unlaunched, or failed to launch.
    pub fn into_work(mut self) -> Result<W, WorkError> {
        match self.fetch() {
            Some(Ok(_)) => self.work.take().ok_or_else(|| not_launched(&self.ctx)),
            Some(Err(e)) => Err(e),
            None => Err(not_launched(&self.ctx)),
        }
    }
}

fn not_launched(ctx: &OpContext) -> WorkError {
    WorkError::InvalidArgument {
        ctx: ctx.clone(),
        msg: "its group has not been launched yet (call Group::launch first)".into(),
    }
}

impl<W, R> Future for Grouped<W>
where
    W: Future<Output = Result<R, WorkError>> + Unpin,
{
    type Output = Result<R, WorkError>;

    /// Resolves with the op's work once the group completed. Polled before
    /// its group was launched it fails at once (a group is launched on the
    /// thread that staged it, so waiting could never end).
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let ctx = self.ctx.clone();
        match self.fetch() {
            Some(Ok(w)) => Pin::new(w).poll(cx),
            Some(Err(e)) => Poll::Ready(Err(e)),
            None => Poll::Ready(Err(not_launched(&ctx))),
        }
    }
}
