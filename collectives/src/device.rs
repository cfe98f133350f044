//! Device buffers, the buffer trait that routes an op to its backend, and
//! the [`DeviceWork`] of a GPU op with its explicit completion levels.
//!
//! | level | how | host cost |
//! |---|---|---|
//! | Enqueued | the op method returned `Ok(work)` | none |
//! | StreamOrdered | [`DeviceWork::stream_ordered`] / [`stream_ordered_on`](DeviceWork::stream_ordered_on): the stream waits on the end event, the buffers come back at once | one `cuStreamWaitEvent` |
//! | GpuFinished | `.await` (the completion reactor wakes the future when the end event completes), or [`DeviceWork::wait_timeout`] | waits for the GPU |

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use chorus_runtime::cuda::nccl::{CommOp, DeviceMem, NcclElement, NcclRedOp, Watched};
use chorus_runtime::cuda::{CudaError, Event, Stream};
use chorus_runtime::{OpContext, WorkError, WorkStatus};

pub use chorus_runtime::cuda::nccl::{DeviceBuffer, NcclType, RawDeviceBuffer};

use crate::dtype::{Element, ReduceOp};
use crate::error::Rejected;
use crate::process_group::group::{Group, Grouped};
use crate::process_group::ProcessGroup;
use crate::work::{split, CoalescedWork, OpResult, Work};

mod sealed {
    pub trait Sealed {}
}

pub(crate) fn red(op: ReduceOp) -> NcclRedOp {
    match op {
        ReduceOp::Sum => NcclRedOp::Sum,
        ReduceOp::Prod => NcclRedOp::Prod,
        ReduceOp::Min => NcclRedOp::Min,
        ReduceOp::Max => NcclRedOp::Max,
        ReduceOp::Avg => NcclRedOp::Avg,
    }
}

/// What a device op gives back: one buffer, or an (input, output) pair.
/// Sealed.
pub trait DeviceResult: Sized + Send + 'static + sealed::Sealed {
    /// The buffer type.
    type Buf: DeviceMem;
    #[doc(hidden)]
    fn from_bufs(bufs: Vec<Self::Buf>) -> Option<Self>;
}

impl<T: NcclElement> sealed::Sealed for DeviceBuffer<T> {}
impl<T: NcclElement> DeviceResult for DeviceBuffer<T> {
    type Buf = DeviceBuffer<T>;
    fn from_bufs(bufs: Vec<Self::Buf>) -> Option<Self> {
        bufs.into_iter().next()
    }
}
impl<T: NcclElement> sealed::Sealed for (DeviceBuffer<T>, DeviceBuffer<T>) {}
impl<T: NcclElement> DeviceResult for (DeviceBuffer<T>, DeviceBuffer<T>) {
    type Buf = DeviceBuffer<T>;
    fn from_bufs(bufs: Vec<Self::Buf>) -> Option<Self> {
        let mut it = bufs.into_iter();
        Some((it.next()?, it.next()?))
    }
}
impl<T: NcclElement> sealed::Sealed for Vec<DeviceBuffer<T>> {}
/// The buffers of a coalesced op, in order.
impl<T: NcclElement> DeviceResult for Vec<DeviceBuffer<T>> {
    type Buf = DeviceBuffer<T>;
    fn from_bufs(bufs: Vec<Self::Buf>) -> Option<Self> {
        Some(bufs)
    }
}
impl sealed::Sealed for Vec<RawDeviceBuffer> {}
/// The buffers of a coalesced op, in order.
impl DeviceResult for Vec<RawDeviceBuffer> {
    type Buf = RawDeviceBuffer;
    fn from_bufs(bufs: Vec<Self::Buf>) -> Option<Self> {
        Some(bufs)
    }
}
impl sealed::Sealed for RawDeviceBuffer {}
impl DeviceResult for RawDeviceBuffer {
    type Buf = RawDeviceBuffer;
    fn from_bufs(bufs: Vec<Self::Buf>) -> Option<Self> {
        bufs.into_iter().next()
    }
}
impl sealed::Sealed for (RawDeviceBuffer, RawDeviceBuffer) {}
impl DeviceResult for (RawDeviceBuffer, RawDeviceBuffer) {
    type Buf = RawDeviceBuffer;
    fn from_bufs(bufs: Vec<Self::Buf>) -> Option<Self> {
        let mut it = bufs.into_iter();
        Some((it.next()?, it.next()?))
    }
}

/// The work of a GPU op. Its completion levels are explicit: the op is
/// Enqueued when the call returned; [`stream_ordered`](Self::stream_ordered)
/// gives the buffers back at once for work issued on a stream after the op;
/// `.await` resolves when the GPU finished it.
///
/// # Cancel safety
///
/// Dropping (or leaking) an unfinished work detaches it: the buffers stay
/// alive until the op's end event has completed, then the completion
/// reactor releases them. Ops are never cancelled by a drop; abort the
/// group to stop them.
#[must_use = "the op runs anyway, but its buffers come back only through the work"]
pub struct DeviceWork<R: DeviceResult> {
    inner: chorus_runtime::Work<Option<Vec<R::Buf>>>,
    watched: Watched<R::Buf>,
    /// Polled before (the first poll may watch the op briefly).
    polled: bool,
}

impl<R: DeviceResult> std::fmt::Debug for DeviceWork<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceWork")
            .field("op", self.inner.context())
            .field("status", &self.inner.status())
            .finish()
    }
}

fn missing(ctx: &OpContext) -> WorkError {
    WorkError::Backend {
        ctx: ctx.clone(),
        msg: "the op's buffers were already taken (a chorus bug)".into(),
    }
}

impl<R: DeviceResult> DeviceWork<R> {
    pub(crate) fn new(
        inner: chorus_runtime::Work<Option<Vec<R::Buf>>>,
        watched: Watched<R::Buf>,
    ) -> Self {
        DeviceWork {
            inner,
            watched,
            polled: false,
        }
    }

    /// The op's rank, group, sequence number and name.
    pub fn context(&self) -> &OpContext {
        self.inner.context()
    }

    /// Sequence number of the op.
    pub fn seq(&self) -> u64 {
        self.inner.seq()
    }

    /// Where the op stands. `Finished` only once the GPU has finished it
    /// (the end event completed), never at enqueue.
    pub fn status(&self) -> WorkStatus {
        self.inner.status()
    }

    /// True once the GPU finished the op (or it failed).
    pub fn is_done(&self) -> bool {
        self.inner.is_done()
    }

    /// The op's end event (recorded on the communicator's stream after the
    /// op).
    pub fn end_event(&self) -> &Event {
        self.watched.end_event()
    }

    /// A shared handle on the end event, usable from another thread (it
    /// stays valid after the work is consumed).
    pub fn end_event_handle(&self) -> std::sync::Arc<chorus_runtime::cuda::nccl::EndEvent> {
        self.watched.end_event_handle()
    }

    /// Queries the end event now (`cuEventQuery`): true once the GPU
    /// finished the op.
    ///
    /// # Errors
    ///
    /// A CUDA error of the op (never read as "not finished").
    pub fn gpu_finished(&self) -> Result<bool, CudaError> {
        self.watched.end_event().query()
    }

    /// StreamOrdered: makes each buffer's own (producer) stream wait on the
    /// op's end event and returns the buffers at once, with no host wait.
    /// Work issued on those streams afterwards sees the op's result.
    ///
    /// # Errors
    ///
    /// The op's error if it already failed, or the CUDA error of the stream
    /// wait.
    pub fn stream_ordered(self) -> Result<R, WorkError> {
        self.take_ordered(None)
    }

    /// StreamOrdered on `stream`: makes `stream` wait on the end event (and
    /// each buffer's producer stream too, so freeing the buffer there stays
    /// ordered after the op) and returns the buffers at once.
    ///
    /// # Errors
    ///
    /// As [`stream_ordered`](Self::stream_ordered).
    pub fn stream_ordered_on(self, stream: &Stream) -> Result<R, WorkError> {
        self.take_ordered(Some(stream))
    }

    fn take_ordered(mut self, stream: Option<&Stream>) -> Result<R, WorkError> {
        let ctx = self.inner.context().clone();
        if self.inner.status() == WorkStatus::Failed {
            return match self.inner.try_take() {
                Some(Err(e)) => Err(e),
                _ => Err(missing(&ctx)),
            };
        }
        match self.watched.take_stream_ordered(stream) {
            Ok(Some(bufs)) => R::from_bufs(bufs).ok_or_else(|| missing(&ctx)),
            Ok(None) => {
                // The reactor completed the op meanwhile: the buffers are in
                // (or about to be in) the work's slot.
                let t0 = std::time::Instant::now();
                loop {
                    if let Some(r) = self.inner.try_take() {
                        return r
                            .and_then(|b| b.and_then(R::from_bufs).ok_or_else(|| missing(&ctx)));
                    }
                    if t0.elapsed() > Duration::from_secs(5) {
                        return Err(missing(&ctx));
                    }
                    std::thread::yield_now();
                }
            }
            Err(e) => Err(WorkError::Backend {
                ctx,
                msg: format!("stream-ordered wait failed: {e}"),
            }),
        }
    }

    /// GpuFinished, blocking: waits until the GPU finished the op. On
    /// timeout aborts the group (its NCCL communicators are aborted and
    /// every pending op fails) and returns [`WorkError::OpTimeout`].
    ///
    /// # Errors
    ///
    /// The op's error, or the timeout.
    pub fn wait_timeout(self, timeout: Duration) -> Result<R, WorkError> {
        let ctx = self.inner.context().clone();
        let reactor = chorus_runtime::reactor::global();
        reactor.nudge();
        // A blocking wait may spin a little before it sleeps: short ops then
        // return without the wake-up latency of a parked thread.
        let t0 = std::time::Instant::now();
        let spin = timeout.min(Duration::from_micros(100));
        while !self.inner.is_done() && t0.elapsed() < spin {
            std::hint::spin_loop();
        }
        let r = self
            .inner
            .wait_timeout(timeout.saturating_sub(t0.elapsed()))?;
        r.and_then(R::from_bufs).ok_or_else(|| missing(&ctx))
    }
}

impl<R: DeviceResult> Future for DeviceWork<R> {
    type Output = Result<R, WorkError>;

    /// GpuFinished: resolves once the op's end event completed (the
    /// completion reactor polls it and wakes this future).
    ///
    /// The first poll of an unfinished op watches it for a few microseconds
    /// before returning `Pending` (`CHORUS_POLL_SPIN_US`, default 10; 0
    /// turns it off): a small GPU op finishes within that, and resolving it
    /// then saves the park and wake-up of the awaiting thread (~5 µs), which
    /// otherwise dominates the round trip. While it watches, it queries the
    /// end event itself and, once that completed, takes the buffers at once
    /// (the reactor completes the work's bookkeeping afterwards). Later
    /// polls never wait.
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if !self.polled {
            self.polled = true;
            let spin = poll_spin();
            if !spin.is_zero() && !self.inner.is_done() {
                chorus_runtime::reactor::global().nudge();
                let t0 = std::time::Instant::now();
                // The awaiting thread may never have used the device.
                let bound = self.watched.bind_device().is_ok();
                while bound && !self.inner.is_done() && t0.elapsed() < spin {
                    match self.watched.take_finished() {
                        Ok(Some(bufs)) => {
                            let ctx = self.inner.context();
                            return Poll::Ready(R::from_bufs(bufs).ok_or_else(|| missing(ctx)));
                        }
                        // Running, or the reactor is completing it.
                        Ok(None) => {}
                        // The reactor fails the work with it.
                        Err(_) => break,
                    }
                    // Leave the driver to the enqueueing threads a moment.
                    for _ in 0..32 {
                        std::hint::spin_loop();
                    }
                }
            }
        }
        match Pin::new(&mut self.inner).poll(cx) {
            Poll::Ready(r) => {
                let ctx = self.inner.context();
                Poll::Ready(r.and_then(|b| b.and_then(R::from_bufs).ok_or_else(|| missing(ctx))))
            }
            Poll::Pending => {
                chorus_runtime::reactor::global().nudge();
                Poll::Pending
            }
        }
    }
}

/// How long the first poll of a device work may watch it
/// (`CHORUS_POLL_SPIN_US`, default 10 µs).
fn poll_spin() -> Duration {
    static SPIN: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();
    *SPIN.get_or_init(|| {
        let us = std::env::var("CHORUS_POLL_SPIN_US")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(10)
            .min(1000);
        Duration::from_micros(us)
    })
}

/// A one-buffer op, as the [`ProcessGroup`] and [`Group`] methods hand it
/// to [`OpBuffer`] (internal).
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op1 {
    /// In place.
    AllReduce(ReduceOp),
    /// In place, from `root`.
    Broadcast {
        /// The root rank.
        root: usize,
    },
    /// In place, onto `root`.
    Reduce {
        /// The root rank.
        root: usize,
        /// The reduction.
        op: ReduceOp,
    },
    /// To `peer`.
    Send {
        /// The peer rank.
        peer: usize,
    },
    /// From `peer`.
    Recv {
        /// The peer rank.
        peer: usize,
    },
}

/// A two-buffer op (input, output) (internal).
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op2 {
    /// All-gather.
    AllGather,
    /// Reduce-scatter.
    ReduceScatter(ReduceOp),
    /// All-to-all.
    AllToAll,
}

impl Op1 {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Op1::AllReduce(_) => "all_reduce",
            Op1::Broadcast { .. } => "broadcast",
            Op1::Reduce { .. } => "reduce",
            Op1::Send { .. } => "send",
            Op1::Recv { .. } => "recv",
        }
    }

    pub(crate) fn comm_op(self) -> CommOp {
        match self {
            Op1::AllReduce(op) => CommOp::AllReduce(red(op)),
            Op1::Broadcast { root } => CommOp::Broadcast { root },
            Op1::Reduce { root, op } => CommOp::Reduce { root, op: red(op) },
            Op1::Send { peer } => CommOp::Send { peer },
            Op1::Recv { peer } => CommOp::Recv { peer },
        }
    }
}

impl Op2 {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Op2::AllGather => "all_gather",
            Op2::ReduceScatter(_) => "reduce_scatter",
            Op2::AllToAll => "all_to_all",
        }
    }

    pub(crate) fn comm_op(self) -> CommOp {
        match self {
            Op2::AllGather => CommOp::AllGather,
            Op2::ReduceScatter(op) => CommOp::ReduceScatter(red(op)),
            Op2::AllToAll => CommOp::AllToAll,
        }
    }
}

/// A buffer an op can take: `Vec<T>` (host, TCP backend),
/// [`DeviceBuffer<T>`] and [`RawDeviceBuffer`] (GPU, NCCL backend). The
/// buffer type picks the backend and the work type. Sealed.
pub trait OpBuffer: Sized + Send + 'static + sealed::Sealed {
    /// The work of a one-buffer op (all_reduce, broadcast, reduce, send,
    /// recv).
    type Work: Send + 'static;
    /// The work of a two-buffer op (all_gather, reduce_scatter, all_to_all).
    type PairWork: Send + 'static;
    /// The work of a coalesced op on several buffers
    /// ([`ProcessGroup::all_reduce_coalesced`]).
    type ManyWork: Send + 'static;
    #[doc(hidden)]
    fn submit1(pg: &ProcessGroup, b: Self, op: Op1) -> Result<Self::Work, Rejected<Self>>;
    #[doc(hidden)]
    fn submit2(
        pg: &ProcessGroup,
        i: Self,
        o: Self,
        op: Op2,
    ) -> Result<Self::PairWork, Rejected<(Self, Self)>>;
    #[doc(hidden)]
    fn submit_many(
        pg: &ProcessGroup,
        bufs: Vec<Self>,
        op: Op1,
    ) -> Result<Self::ManyWork, Rejected<Vec<Self>>>;
    #[doc(hidden)]
    fn stage1(g: &mut Group<'_>, b: Self, op: Op1) -> Result<Grouped<Self::Work>, Rejected<Self>>;
    #[doc(hidden)]
    fn stage2(
        g: &mut Group<'_>,
        i: Self,
        o: Self,
        op: Op2,
    ) -> Result<Grouped<Self::PairWork>, Rejected<(Self, Self)>>;
}

impl<T: Element> sealed::Sealed for Vec<T> {}
impl<T: Element> OpBuffer for Vec<T>
where
    Vec<T>: OpResult,
    (Vec<T>, Vec<T>): OpResult,
{
    type Work = Work<Vec<T>>;
    type PairWork = Work<(Vec<T>, Vec<T>)>;
    type ManyWork = CoalescedWork<T>;
    fn submit1(pg: &ProcessGroup, b: Self, op: Op1) -> Result<Self::Work, Rejected<Self>> {
        let kind = pg.host_one(b, op)?;
        pg.host_submit(kind, one_host::<T>)
    }
    fn submit2(
        pg: &ProcessGroup,
        i: Self,
        o: Self,
        op: Op2,
    ) -> Result<Self::PairWork, Rejected<(Self, Self)>> {
        let kind = pg.host_two(i, o, op)?;
        pg.host_submit(kind, two_host::<T>)
    }
    fn submit_many(
        pg: &ProcessGroup,
        bufs: Vec<Self>,
        op: Op1,
    ) -> Result<Self::ManyWork, Rejected<Vec<Self>>> {
        if bufs.is_empty() {
            return Err(Rejected {
                error: pg.invalid_coalesced(op),
                buffers: bufs,
            });
        }
        // One op on the concatenation: one message exchange for all.
        let lens: Vec<usize> = bufs.iter().map(Vec::len).collect();
        match Self::submit1(pg, bufs.concat(), op) {
            Ok(work) => Ok(CoalescedWork::new(work, lens)),
            Err(r) => Err(Rejected {
                error: r.error,
                buffers: split(r.buffers, &lens),
            }),
        }
    }
    fn stage1(g: &mut Group<'_>, b: Self, op: Op1) -> Result<Grouped<Self::Work>, Rejected<Self>> {
        let kind = g.process_group().host_one(b, op)?;
        g.stage_host(kind, one_host::<T>)
    }
    fn stage2(
        g: &mut Group<'_>,
        i: Self,
        o: Self,
        op: Op2,
    ) -> Result<Grouped<Self::PairWork>, Rejected<(Self, Self)>> {
        let kind = g.process_group().host_two(i, o, op)?;
        g.stage_host(kind, two_host::<T>)
    }
}

fn one_host<T: Element>(kind: crate::backend::OpKind) -> Vec<T> {
    crate::process_group::one(kind)
}

fn two_host<T: Element>(kind: crate::backend::OpKind) -> (Vec<T>, Vec<T>) {
    crate::process_group::two(kind)
}

/// The buffer of a refused one-buffer device op.
pub(crate) fn one<B, W>(r: Result<W, (WorkError, Vec<B>)>) -> Result<W, Rejected<B>> {
    r.map_err(|(error, bufs)| {
        let mut it = bufs.into_iter();
        match it.next() {
            Some(buffers) => Rejected { error, buffers },
            None => unreachable!("a refused one-buffer op gives its buffer back"),
        }
    })
}

/// The buffers of a refused two-buffer device op.
pub(crate) fn two<B, W>(r: Result<W, (WorkError, Vec<B>)>) -> Result<W, Rejected<(B, B)>> {
    r.map_err(|(error, bufs)| {
        let mut it = bufs.into_iter();
        match (it.next(), it.next()) {
            (Some(a), Some(b)) => Rejected {
                error,
                buffers: (a, b),
            },
            _ => unreachable!("a refused two-buffer op gives both buffers back"),
        }
    })
}

macro_rules! device_op_buffer {
    ($([$($g:tt)*] $t:ty),*) => {$(
        impl<$($g)*> OpBuffer for $t {
            type Work = DeviceWork<$t>;
            type PairWork = DeviceWork<($t, $t)>;
            type ManyWork = DeviceWork<Vec<$t>>;
            fn submit1(pg: &ProcessGroup, b: Self, op: Op1) -> Result<Self::Work, Rejected<Self>> {
                one(pg.device_submit(op.comm_op(), vec![b]))
            }
            fn submit2(pg: &ProcessGroup, i: Self, o: Self, op: Op2) -> Result<Self::PairWork, Rejected<(Self, Self)>> {
                two(pg.device_submit(op.comm_op(), vec![i, o]))
            }
            fn submit_many(pg: &ProcessGroup, bufs: Vec<Self>, op: Op1) -> Result<Self::ManyWork, Rejected<Vec<Self>>> {
                pg.device_submit_coalesced(op.comm_op(), bufs)
                    .map_err(|(error, buffers)| Rejected { error, buffers })
            }
            fn stage1(g: &mut Group<'_>, b: Self, op: Op1) -> Result<Grouped<Self::Work>, Rejected<Self>> {
                one(g.stage_device(op.comm_op(), vec![b]))
            }
            fn stage2(g: &mut Group<'_>, i: Self, o: Self, op: Op2) -> Result<Grouped<Self::PairWork>, Rejected<(Self, Self)>> {
                two(g.stage_device(op.comm_op(), vec![i, o]))
            }
        }
    )*};
}

device_op_buffer!([T: NcclElement] DeviceBuffer<T>, [] RawDeviceBuffer);
