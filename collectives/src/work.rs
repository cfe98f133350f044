//! The typed work a collective returns.

use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use chorus_core::{OpContext, WorkError, WorkStatus};

use crate::backend::OpOutput;
use crate::dtype::{Element, HostBuffer};

/// The input and output buffers of all_gather, reduce_scatter and
/// all_to_all, as their work yields them back.
pub type InOut<T> = (Vec<T>, Vec<T>);

mod sealed {
    pub trait Sealed {}
}

/// What a finished op gives back: its buffers, with their types.
///
/// Implemented for `Vec<T>` (in-place ops, send, recv), `(Vec<T>, Vec<T>)`
/// (input and output of all_gather, reduce_scatter, all_to_all) and `()`
/// (barrier). Sealed.
pub trait OpResult: Sized + sealed::Sealed {
    #[doc(hidden)]
    fn from_output(out: OpOutput) -> Option<Self>;
}

impl sealed::Sealed for () {}
impl OpResult for () {
    fn from_output(_: OpOutput) -> Option<Self> {
        Some(())
    }
}

impl<T: Element> sealed::Sealed for Vec<T> {}
impl<T: Element> OpResult for Vec<T> {
    fn from_output(out: OpOutput) -> Option<Self> {
        let mut it = out.into_iter();
        let b: HostBuffer = it.next()?;
        T::from_host(b).ok()
    }
}

impl<T: Element> sealed::Sealed for (Vec<T>, Vec<T>) {}
impl<T: Element> OpResult for (Vec<T>, Vec<T>) {
    fn from_output(out: OpOutput) -> Option<Self> {
        let mut it = out.into_iter();
        let a = T::from_host(it.next()?).ok()?;
        let b = T::from_host(it.next()?).ok()?;
        Some((a, b))
    }
}

/// The future of one collective or point-to-point op.
///
/// Resolves to the op's buffers when the op has finished on this rank (for
/// the TCP backend "finished" is the only level: the data is in the buffers
/// and nothing touches them any more).
///
/// # Cancel safety
///
/// Dropping a `Work` detaches it: the op still runs to completion on the
/// group's worker, which releases the buffers when it is done. Ops are never
/// cancelled by a drop; abort the group to stop them.
#[must_use = "the op runs anyway, but its buffers come back only through the work"]
#[derive(Debug)]
pub struct Work<T> {
    inner: chorus_core::OpFuture<OpOutput>,
    _out: PhantomData<fn() -> T>,
}

impl<T: OpResult> Work<T> {
    pub(crate) fn new(inner: chorus_core::OpFuture<OpOutput>) -> Self {
        Work {
            inner,
            _out: PhantomData,
        }
    }

    /// The op's rank, group, sequence number and name.
    pub fn context(&self) -> &OpContext {
        self.inner.context()
    }

    /// Sequence number of the op (collective sequence number of the group, or
    /// message number of the pair for send/recv).
    pub fn seq(&self) -> u64 {
        self.inner.seq()
    }

    /// Where the op stands, without waiting. Never `Finished` before the op
    /// has finished.
    pub fn status(&self) -> WorkStatus {
        self.inner.status()
    }

    /// True once the op has finished or failed.
    pub fn is_done(&self) -> bool {
        self.inner.is_done()
    }

    /// Blocks the calling thread until the op is done; on timeout aborts the
    /// group (every pending op fails) and returns [`WorkError::OpTimeout`].
    ///
    /// # Errors
    ///
    /// The op's error, or the timeout.
    pub fn wait_timeout(self, timeout: Duration) -> Result<T, WorkError> {
        let ctx = self.inner.context().clone();
        convert(&ctx, self.inner.wait_timeout(timeout))
    }
}

fn convert<T: OpResult>(ctx: &OpContext, r: Result<OpOutput, WorkError>) -> Result<T, WorkError> {
    r.and_then(|out| {
        T::from_output(out).ok_or_else(|| WorkError::Backend {
            ctx: ctx.clone(),
            msg: "the backend returned buffers of another type or number (a chorus bug)".into(),
        })
    })
}

impl<T: OpResult> Future for Work<T> {
    type Output = Result<T, WorkError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let r = std::task::ready!(Pin::new(&mut self.inner).poll(cx));
        Poll::Ready(convert(self.inner.context(), r))
    }
}

/// The work of [`ProcessGroup::all_reduce_coalesced`] on host buffers: one
/// all_reduce of the buffers' concatenation (one message exchange), split
/// back into one buffer per input, in order, when it has finished.
///
/// # Cancel safety
///
/// As [`Work`]: dropping it detaches the op, which still runs.
///
/// [`ProcessGroup::all_reduce_coalesced`]: crate::ProcessGroup::all_reduce_coalesced
#[must_use = "the op runs anyway, but its buffers come back only through the work"]
#[derive(Debug)]
pub struct CoalescedWork<T> {
    inner: Work<Vec<T>>,
    lens: Vec<usize>,
}

impl<T> CoalescedWork<T>
where
    Vec<T>: OpResult,
{
    pub(crate) fn new(inner: Work<Vec<T>>, lens: Vec<usize>) -> Self {
        CoalescedWork { inner, lens }
    }

    /// The op's rank, group, sequence number and name.
    pub fn context(&self) -> &OpContext {
        self.inner.context()
    }

    /// Sequence number of the op in its group (one for all the buffers).
    pub fn seq(&self) -> u64 {
        self.inner.seq()
    }

    /// Where the op stands, without waiting.
    pub fn status(&self) -> WorkStatus {
        self.inner.status()
    }

    /// True once the op has finished or failed.
    pub fn is_done(&self) -> bool {
        self.inner.is_done()
    }

    /// Blocks until the op is done (as [`Work::wait_timeout`]).
    ///
    /// # Errors
    ///
    /// The op's error, or [`WorkError::OpTimeout`] after `timeout` (the
    /// group is then aborted).
    pub fn wait_timeout(self, timeout: Duration) -> Result<Vec<Vec<T>>, WorkError> {
        let lens = self.lens;
        self.inner
            .wait_timeout(timeout)
            .map(|flat| split(flat, &lens))
    }
}

impl<T> Future for CoalescedWork<T>
where
    Vec<T>: OpResult,
{
    type Output = Result<Vec<Vec<T>>, WorkError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let r = std::task::ready!(Pin::new(&mut self.inner).poll(cx));
        Poll::Ready(r.map(|flat| split(flat, &self.lens)))
    }
}

/// Cuts `flat` into consecutive buffers of `lens` elements (their sum is
/// `flat.len()`; a shorter `flat` gives shorter trailing buffers).
pub(crate) fn split<T>(mut flat: Vec<T>, lens: &[usize]) -> Vec<Vec<T>> {
    let mut out = Vec::with_capacity(lens.len());
    for &len in lens.iter().rev() {
        let at = flat.len().saturating_sub(len);
        out.push(flat.split_off(at));
    }
    out.reverse();
    out
}
