//! [`DeviceWork`]: the one type over a lone op's own work and a batch op's
//! view of its batch's work, its completion levels and its `Future`.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use chorus_core::{Failed, OpContext, OpFuture, WorkError, WorkStatus};
use chorus_gpu::cuda::{CudaError, Event, Stream};
use chorus_gpu::nccl::{DeviceBuffers, EndEvent, InFlight};

use super::member::Member;
use super::own::{DeviceCompleter, OwnWork};

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
/// # Batches
///
/// The works of a [`Batch`](crate::Batch)'s ops are views of one work for
/// the whole launch (one registry entry, one completion, one end event):
/// an op's work holds no completion of its own, only its place in the
/// launch, which holds the buffers. The first of them polled watches the
/// batch's end (briefly, then through the reactor, as a lone op's work
/// does); every one polled while the batch runs is woken when it ends; each
/// then takes its own buffers, with no further query of the GPU. A batch's
/// failure fails each of its works as its own op (its sequence number),
/// with its own buffers where the GPU is done with them.
///
/// # Failure
///
/// A failed op resolves to [`Failed`] with its [`WorkError`], and with
/// the buffers only where no device can write them any more: when the
/// completion reactor found the op's end event failed (a CUDA error; the
/// context stops running work), or when the op's end event has completed
/// by the time the failure is read (after an abort, once the aborted
/// communicator's stream passed the op). Otherwise the buffers are
/// withheld: `Failed::buffers` is `None`, and they stay with the op in its
/// communicator's retire queue, which releases them once the end event
/// completed (a later op's thread or the reactor's sweeper). Memory a GPU
/// may still write is never handed back.
///
/// # Cancel safety
///
/// Dropping an unfinished work detaches it: the buffers stay alive until
/// the op's end event has completed and the op is retired (by a later op's
/// thread or the reactor's sweeper, see above); a leaked work leaks them
/// with it. Ops are never cancelled by a drop; abort the group to stop
/// them.
#[must_use = "the op runs anyway, but its buffers come back only through the work"]
pub struct DeviceWork<R: DeviceBuffers> {
    repr: Repr<R>,
}

enum Repr<R: DeviceBuffers> {
    Own(OwnWork<R>),
    Member(Member<R>),
}

// Never pinned structurally: the buffers move in and out by value.
impl<R: DeviceBuffers> Unpin for DeviceWork<R> {}

impl<R: DeviceBuffers> std::fmt::Debug for DeviceWork<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceWork")
            .field("op", self.context())
            .field("status", &self.status())
            .finish()
    }
}

impl<R: DeviceBuffers> DeviceWork<R> {
    /// The work of a lone op it holds itself (see the type's docs).
    pub(crate) fn held(
        inner: OpFuture<Option<R>>,
        op: InFlight<R>,
        completer: DeviceCompleter<R>,
        spin: Duration,
    ) -> Self {
        DeviceWork {
            repr: Repr::Own(OwnWork::held(inner, op, completer, spin)),
        }
    }

    /// The work of an op of a batch (see the type's docs).
    pub(crate) fn member(member: Member<R>) -> Self {
        DeviceWork {
            repr: Repr::Member(member),
        }
    }

    /// For a batch's op: whether its batch was launched (see
    /// [`Member::launched`]); a lone op's work always was.
    pub(crate) fn launched(&self) -> Result<(), WorkError> {
        match &self.repr {
            Repr::Own(_) => Ok(()),
            Repr::Member(m) => m.launched(),
        }
    }

    /// The op's rank, group, sequence number and name.
    pub fn context(&self) -> &OpContext {
        match &self.repr {
            Repr::Own(w) => w.context(),
            Repr::Member(m) => m.context(),
        }
    }

    /// Sequence number of the op.
    pub fn seq(&self) -> u64 {
        self.context().seq
    }

    /// Where the op stands. `Finished` only once the GPU has finished it
    /// (the end event completed), never at enqueue; for an op nobody has
    /// seen finish yet this queries the end event.
    pub fn status(&self) -> WorkStatus {
        match &self.repr {
            Repr::Own(w) => w.status(),
            Repr::Member(m) => m.status(),
        }
    }

    /// True once the GPU finished the op (or it failed).
    pub fn is_done(&self) -> bool {
        matches!(self.status(), WorkStatus::Finished | WorkStatus::Failed)
    }

    /// The op's end event (recorded on the communicator's stream after the
    /// op; a batch's ops share one).
    pub fn end_event(&self) -> &Event {
        match &self.repr {
            Repr::Own(w) => w.end_event(),
            Repr::Member(m) => m.end_event(),
        }
    }

    /// A shared handle on the end event, usable from another thread (it
    /// stays valid after the work is consumed).
    pub fn end_event_handle(&self) -> Arc<EndEvent> {
        match &self.repr {
            Repr::Own(w) => w.end_event_handle(),
            Repr::Member(m) => m.end_event_handle(),
        }
    }

    /// Queries the end event now (`cuEventQuery`): true once the GPU
    /// finished the op.
    ///
    /// # Errors
    ///
    /// A CUDA error of the op (never read as "not finished").
    pub fn gpu_finished(&self) -> Result<bool, CudaError> {
        match &self.repr {
            Repr::Own(w) => w.gpu_finished(),
            Repr::Member(m) => m.gpu_finished(),
        }
    }

    /// StreamOrdered: makes each buffer's own (producer) stream wait on the
    /// op's end event and returns the buffers at once, with no host wait.
    /// Work issued on those streams afterwards sees the op's result.
    ///
    /// # Errors
    ///
    /// The op's error if it already failed, or the CUDA error of the stream
    /// wait.
    pub fn stream_ordered(self) -> Result<R, Failed<R>> {
        match self.repr {
            Repr::Own(w) => w.stream_ordered(),
            Repr::Member(m) => m.stream_ordered(None),
        }
    }

    /// StreamOrdered on `stream`: makes `stream` wait on the end event (and
    /// each buffer's producer stream too, so freeing the buffer there stays
    /// ordered after the op) and returns the buffers at once.
    ///
    /// # Errors
    ///
    /// As [`stream_ordered`](Self::stream_ordered).
    pub fn stream_ordered_on(self, stream: &Stream) -> Result<R, Failed<R>> {
        match self.repr {
            Repr::Own(w) => w.stream_ordered_on(stream),
            Repr::Member(m) => m.stream_ordered(Some(stream)),
        }
    }

    /// GpuFinished, blocking: waits until the GPU finished the op. On
    /// timeout aborts the group (its NCCL communicators are aborted and
    /// every pending op fails) and returns
    /// [`WorkError::OpTimeout`].
    ///
    /// # Errors
    ///
    /// The op's error, or the timeout; with the buffers only where the GPU
    /// is known to be done with them (see the type's docs).
    pub fn wait_timeout(self, timeout: Duration) -> Result<R, Failed<R>> {
        match self.repr {
            Repr::Own(w) => w.wait_timeout(timeout),
            Repr::Member(m) => m.wait_timeout(timeout),
        }
    }
}

impl<R: DeviceBuffers> Future for DeviceWork<R> {
    type Output = Result<R, Failed<R>>;

    /// GpuFinished: resolves once the op's end event completed.
    ///
    /// The first poll of an unfinished op watches it for a few microseconds
    /// ([`NcclOptions::poll_spin`](crate::NcclOptions::poll_spin), default
    /// 10; 0 turns it off; skipped when ops like it ran longer), querying
    /// the end event itself: a small GPU op finishes within that, and
    /// resolving it then (on this thread, without the completion reactor)
    /// saves the park and wake-up of the awaiting thread, which
    /// otherwise dominates the round trip. If the op is still running after
    /// that, the poll hands it to the completion reactor, which wakes the
    /// future when the end event completes, and returns `Pending`. When ops
    /// like this one ended before, the reactor also wakes the future
    /// shortly before this one is expected to end; that poll watches the
    /// end event (for at most twice the reactor's `prewake_lead` and an
    /// eighth of the op's expected length), napping in short steps until
    /// shortly before the expected end and spinning from then on, so that
    /// the op's end is seen within microseconds rather than after a parked
    /// thread's wake-up, at the cost of a few system calls rather than a
    /// core for the whole lead. An op expected to end within that lead
    /// already is watched so by the first poll, which then completes it
    /// itself, without the reactor. Other polls never wait. A batch's works
    /// share this: the batch's first poll watches, the others find the
    /// batch ended.
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match &mut self.get_mut().repr {
            Repr::Own(w) => Pin::new(w).poll(cx),
            Repr::Member(m) => m.poll(cx),
        }
    }
}
