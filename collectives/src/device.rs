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

use std::sync::Arc;

use chorus_core::{OpContext, WorkError, WorkStatus};
use chorus_gpu::cuda::{CudaError, Event, Stream};
use chorus_gpu::nccl::{
    CommOp, DeviceMem, EndEvent, Finished, InFlight, NcclElement, NcclRedOp, Watched,
};

pub use chorus_gpu::nccl::{DeviceBuffer, NcclType, RawDeviceBuffer};

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
/// A work holds its op itself until it is polled, dropped or taken back:
/// nothing goes to the completion reactor at enqueue. A poll that finds the
/// end event complete finishes the op on the polling thread; one that does
/// not hands it to the reactor, which wakes the future. A stream-ordered
/// take or a drop leaves it in its communicator's retire queue: the
/// threads that let go of the communicator's later ops retire it once its
/// end event completed (a query every few ops, a couple of ops retired at
/// each), and a sweeper on the reactor retires what is left once nobody
/// lets go of more. So a stream of ops nobody awaits one by one is finished
/// on the thread that issues it, with no reactor queries, wake-ups or
/// memory handed between threads. The
/// watchdog asks the end event of an op past its deadline before it times
/// it out, so a finished op whose work is simply not polled yet never
/// times out.
///
/// # Cancel safety
///
/// Dropping an unfinished work detaches it: the buffers stay alive until
/// the op's end event has completed and the op is retired (by a later op's
/// thread or the reactor's sweeper, see above); a leaked work leaks them
/// with it. Ops are never cancelled by a drop; abort the group to stop
/// them.
#[must_use = "the op runs anyway, but its buffers come back only through the work"]
pub struct DeviceWork<R: DeviceResult> {
    inner: chorus_core::OpFuture<Option<Vec<R::Buf>>>,
    end: Arc<EndEvent>,
    track: Option<Track<R::Buf>>,
    /// Polled before (the first poll may watch the op briefly).
    polled: bool,
}

// Never pinned structurally: the buffers move in and out by value.
impl<R: DeviceResult> Unpin for DeviceWork<R> {}

/// The backend's side of a device work.
pub(crate) type DeviceCompleter<B> = chorus_core::Completer<Option<Vec<B>>>;

/// Where an enqueued op's buffers and completion are.
enum Track<B: DeviceMem> {
    /// With the work (nothing handed to the reactor yet).
    Held(Held<B>),
    /// With the completion reactor, which completes the work.
    Watched(Watched<B>),
}

/// An op its work still holds, with its completer. Dropped, it goes to its
/// communicator's retire queue (its buffers are released only after the
/// end event completed).
struct Held<B: DeviceMem>(Option<(InFlight<B>, DeviceCompleter<B>)>);

impl<B: DeviceMem> Held<B> {
    /// Hands the op to the reactor for someone who waits on it.
    fn watch(mut self) -> Option<Watched<B>> {
        let (f, c) = self.0.take()?;
        Some(f.watch(finisher(c)))
    }
}

impl<B: DeviceMem> Drop for Held<B> {
    fn drop(&mut self) {
        if let Some((f, c)) = self.0.take() {
            f.detach(finisher(c));
        }
    }
}

/// Completes a device op's work with what the completion reactor found.
pub(crate) fn finisher<B: DeviceMem>(
    completer: DeviceCompleter<B>,
) -> impl FnOnce(Finished<B>) + Send + 'static {
    move |(res, bufs): Finished<B>| match res {
        Ok(()) => completer.complete(Ok(bufs)),
        Err(e) => {
            let msg = format!("CUDA error while the op ran: {e}");
            match completer.context().cloned() {
                Some(ctx) => completer.complete(Err(WorkError::Backend { ctx, msg })),
                None => drop(completer),
            }
        }
    }
}

impl<R: DeviceResult> std::fmt::Debug for DeviceWork<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceWork")
            .field("op", self.inner.context())
            .field("status", &self.status())
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
    /// The work of an op it holds itself (see the type's docs).
    pub(crate) fn held(
        inner: chorus_core::OpFuture<Option<Vec<R::Buf>>>,
        op: InFlight<R::Buf>,
        completer: DeviceCompleter<R::Buf>,
    ) -> Self {
        let end = op.end_event_handle();
        DeviceWork {
            inner,
            end,
            track: Some(Track::Held(Held(Some((op, completer))))),
            polled: false,
        }
    }

    /// The work of an op already handed to the completion reactor.
    pub(crate) fn watched(
        inner: chorus_core::OpFuture<Option<Vec<R::Buf>>>,
        watched: Watched<R::Buf>,
    ) -> Self {
        DeviceWork {
            inner,
            end: watched.end_event_handle(),
            track: Some(Track::Watched(watched)),
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
    /// (the end event completed), never at enqueue; for an op the work
    /// still holds this queries the end event.
    pub fn status(&self) -> WorkStatus {
        let st = self.inner.status();
        match &self.track {
            Some(Track::Held(Held(Some((f, _))))) if st == WorkStatus::Pending => {
                match f.bind_device().and_then(|()| self.end.event().query()) {
                    Ok(true) => WorkStatus::Finished,
                    Ok(false) => WorkStatus::Pending,
                    Err(_) => WorkStatus::Failed,
                }
            }
            _ => st,
        }
    }

    /// True once the GPU finished the op (or it failed).
    pub fn is_done(&self) -> bool {
        matches!(self.status(), WorkStatus::Finished | WorkStatus::Failed)
    }

    /// The op's end event (recorded on the communicator's stream after the
    /// op).
    pub fn end_event(&self) -> &Event {
        self.end.event()
    }

    /// A shared handle on the end event, usable from another thread (it
    /// stays valid after the work is consumed).
    pub fn end_event_handle(&self) -> Arc<EndEvent> {
        self.end.clone()
    }

    /// Queries the end event now (`cuEventQuery`): true once the GPU
    /// finished the op.
    ///
    /// # Errors
    ///
    /// A CUDA error of the op (never read as "not finished").
    pub fn gpu_finished(&self) -> Result<bool, CudaError> {
        self.end.event().query()
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
        if self.inner.status() == WorkStatus::Failed {
            // A held op goes to the retire queue with the work's drop.
            return match self.inner.try_take() {
                Some(Err(e)) => Err(e),
                _ => Err(missing(self.inner.context())),
            };
        }
        let taken = match &mut self.track {
            Some(Track::Held(Held(Some((f, _))))) => f.take_stream_ordered(stream),
            Some(Track::Watched(w)) => w.take_stream_ordered(stream),
            _ => Ok(None),
        };
        match taken {
            // The rest of the op (its bookkeeping) goes to the
            // communicator's retire queue when `self` drops.
            Ok(Some(bufs)) => R::from_bufs(bufs).ok_or_else(|| missing(self.inner.context())),
            Ok(None) => {
                // The reactor completed the op meanwhile: the buffers are in
                // (or about to be in) the work's slot.
                let t0 = std::time::Instant::now();
                loop {
                    if let Some(r) = self.inner.try_take() {
                        let ctx = self.inner.context();
                        return r
                            .and_then(|b| b.and_then(R::from_bufs).ok_or_else(|| missing(ctx)));
                    }
                    if t0.elapsed() > Duration::from_secs(5) {
                        return Err(missing(self.inner.context()));
                    }
                    std::thread::yield_now();
                }
            }
            Err(e) => Err(WorkError::Backend {
                ctx: self.inner.context().clone(),
                msg: format!("stream-ordered wait failed: {e}"),
            }),
        }
    }

    /// Hands a held op to the reactor for someone who waits on it.
    fn watch(&mut self) {
        if let Some(Track::Held(h)) = self.track.take() {
            self.track = h.watch().map(Track::Watched);
        }
    }

    /// GpuFinished, blocking: waits until the GPU finished the op. On
    /// timeout aborts the group (its NCCL communicators are aborted and
    /// every pending op fails) and returns [`WorkError::OpTimeout`].
    ///
    /// # Errors
    ///
    /// The op's error, or the timeout.
    pub fn wait_timeout(mut self, timeout: Duration) -> Result<R, WorkError> {
        let ctx = self.inner.context().clone();
        // A blocking wait watches the end event itself a little before it
        // sleeps: short ops then return without the reactor and the
        // wake-up latency of a parked thread.
        let t0 = std::time::Instant::now();
        if let Some(bufs) = self.watch_briefly(timeout.min(Duration::from_micros(100))) {
            return R::from_bufs(bufs).ok_or_else(|| missing(&ctx));
        }
        self.watch();
        chorus_gpu::reactor::global().nudge();
        let r = self
            .inner
            .wait_timeout(timeout.saturating_sub(t0.elapsed()))?;
        r.and_then(R::from_bufs).ok_or_else(|| missing(&ctx))
    }

    /// The first poll's brief watch of the end event (see `poll`): the
    /// buffers if the op finished meanwhile.
    fn watch_briefly(&mut self, spin: Duration) -> Option<Vec<R::Buf>> {
        let t0 = std::time::Instant::now();
        match &mut self.track {
            Some(Track::Held(held)) => {
                let (f, _) = held.0.as_mut()?;
                // The awaiting thread may never have used the device.
                f.bind_device().ok()?;
                loop {
                    match f.take_finished() {
                        Ok(Some(bufs)) => {
                            // Finished here: complete the work on this
                            // thread; the reactor never sees the op.
                            if let Some((_, c)) = held.0.take() {
                                c.complete(Ok(None));
                            }
                            return Some(bufs);
                        }
                        Ok(None) => {}
                        // The reactor reports it (after the hand-off).
                        Err(_) => return None,
                    }
                    if self.inner.is_done() || t0.elapsed() >= spin {
                        return None;
                    }
                    // Leave the driver to the enqueueing threads a moment.
                    for _ in 0..32 {
                        std::hint::spin_loop();
                    }
                }
            }
            Some(Track::Watched(w)) => {
                chorus_gpu::reactor::global().nudge();
                w.bind_device().ok()?;
                while !self.inner.is_done() && t0.elapsed() < spin {
                    match w.take_finished() {
                        Ok(Some(bufs)) => return Some(bufs),
                        // Running, or the reactor is completing it.
                        Ok(None) => {}
                        // The reactor fails the work with it.
                        Err(_) => return None,
                    }
                    for _ in 0..32 {
                        std::hint::spin_loop();
                    }
                }
                None
            }
            None => None,
        }
    }
}

impl<R: DeviceResult> Future for DeviceWork<R> {
    type Output = Result<R, WorkError>;

    /// GpuFinished: resolves once the op's end event completed.
    ///
    /// The first poll of an unfinished op watches it for a few microseconds
    /// (`CHORUS_POLL_SPIN_US`, default 10; 0 turns it off), querying the end
    /// event itself: a small GPU op finishes within that, and resolving it
    /// then (on this thread, without the completion reactor) saves the park
    /// and wake-up of the awaiting thread (~5 µs), which otherwise
    /// dominates the round trip. If the op is still running after that,
    /// the poll hands it to the completion reactor, which wakes the future
    /// when the end event completes, and returns `Pending`. Later polls
    /// never wait.
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if !self.polled {
            self.polled = true;
            let spin = poll_spin();
            if !spin.is_zero() && !self.inner.is_done() {
                if let Some(bufs) = self.watch_briefly(spin) {
                    let ctx = self.inner.context();
                    return Poll::Ready(R::from_bufs(bufs).ok_or_else(|| missing(ctx)));
                }
            }
        }
        self.watch();
        match Pin::new(&mut self.inner).poll(cx) {
            Poll::Ready(r) => {
                let ctx = self.inner.context();
                Poll::Ready(r.and_then(|b| b.and_then(R::from_bufs).ok_or_else(|| missing(ctx))))
            }
            Poll::Pending => {
                chorus_gpu::reactor::global().nudge();
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
