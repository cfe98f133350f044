//! [`Work`], the future of an op on host buffers (the TCP backend).

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use chorus_core::{Failed, HostBuffer, HostBuffers, OpContext, OpFuture, WorkError, WorkStatus};

/// The future of one collective or point-to-point op on host buffers.
///
/// Resolves to the op's buffers `R` (`Vec<T>`, `(Vec<T>, Vec<T>)` for
/// input and output, `Vec<Vec<T>>` for a coalesced op, `()` for a barrier)
/// once the op has finished on this rank. For the TCP backend "finished"
/// is the only completion level: the data is in the buffers and nothing
/// touches them any more.
///
/// # Failure
///
/// A failed op resolves to [`Failed`]: its [`WorkError`] and the op's
/// buffers, the very ones passed in, with their lengths and capacities and
/// unspecified contents. They come back as soon as the group's worker has
/// stopped the op, which it does at once when the op fails there, and at
/// the group's abort or the op's own timeout when the op is failed from
/// outside (a blocking wait that timed out, the watchdog, a peer's
/// reported error): until then the work stays pending, so a failed work
/// always carries its buffers, except a work polled again after it
/// returned, or one whose group shut down under it. `?` turns a `Failed`
/// into [`WorkError`] or [`Error`](crate::Error), dropping the buffers.
///
/// # Polling
///
/// A small op (its buffers at most
/// [`TcpOptions::crossover_bytes`](crate::TcpOptions::crossover_bytes))
/// is run by the first poll (or [`wait_timeout`](Self::wait_timeout))
/// that finds it pending, on the polling thread, for up to
/// [`TcpOptions::caller_spin`](crate::TcpOptions::caller_spin) (100 µs by
/// default where this host's ranks have a core each, else zero): a
/// round trip then wakes no other thread. That poll may hold its thread
/// that long; later polls return at once.
///
/// # Cancel safety
///
/// Dropping a `Work` detaches it: the op still runs to completion on the
/// group's worker, which releases the buffers when it is done. Ops are never
/// cancelled by a drop; abort the group to stop them.
#[must_use = "the op runs anyway, but its buffers come back only through the work"]
#[derive(Debug)]
pub struct Work<R> {
    inner: OpFuture<Vec<HostBuffer>>,
    /// A coalesced op's buffer lengths: its one result buffer is cut back
    /// into these. Empty otherwise.
    split: Vec<usize>,
    /// Runs the op on the caller's thread at the first wait that finds it
    /// pending (a small TCP op); taken then.
    assist: Option<Arc<dyn Assist>>,
    _out: PhantomData<fn() -> R>,
}

/// A backend that can make progress on the thread of a caller about to
/// wait for an op: the TCP backend runs a small op there (reading the
/// sockets, reducing, completing) rather than hand it from thread to
/// thread (docs/ARCHITECTURE.md, "A small TCP op without hand-offs").
pub(crate) trait Assist: Send + Sync + fmt::Debug {
    /// Makes progress on the calling thread until `done()` says the op is
    /// done, the backend's budget ran out or `deadline` (if any) passed;
    /// whatever is left, the backend's own threads finish.
    fn assist(&self, done: &dyn Fn() -> bool, deadline: Option<Instant>);
}

impl<R: HostBuffers> Work<R> {
    pub(crate) fn new(
        inner: OpFuture<Vec<HostBuffer>>,
        split: Vec<usize>,
        assist: Option<Arc<dyn Assist>>,
    ) -> Self {
        Work {
            inner,
            split,
            assist,
            _out: PhantomData,
        }
    }

    /// Runs the op on this thread for a while (until `deadline`, if any),
    /// if its backend can and it has not yet.
    fn help(&mut self, deadline: Option<Instant>) {
        if let Some(a) = self.assist.take() {
            let inner = &self.inner;
            a.assist(&|| inner.is_done(), deadline);
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
    /// group (every pending op fails) and returns [`WorkError::OpTimeout`]
    /// with the buffers, which the stopped worker hands back within moments
    /// (at most 2 s is waited for them; past that the work fails without
    /// them, and they are released when the worker lets go).
    ///
    /// # Errors
    ///
    /// The op's error, or the timeout, with the buffers.
    pub fn wait_timeout(mut self, timeout: Duration) -> Result<R, Failed<R>> {
        self.help(Instant::now().checked_add(timeout));
        let ctx = self.inner.context().clone();
        let r = self.inner.wait_timeout(timeout);
        convert(&ctx, &self.split, r)
    }
}

/// The op's typed buffers from what the backend gave back.
fn convert<R: HostBuffers>(
    ctx: &OpContext,
    split: &[usize],
    r: Result<Vec<HostBuffer>, Failed<Vec<HostBuffer>>>,
) -> Result<R, Failed<R>> {
    let bug = || WorkError::Backend {
        ctx: ctx.clone(),
        msg: "the backend returned buffers of another type or number (a chorus bug)".into(),
    };
    match r {
        Ok(out) => typed(split, out).ok_or_else(|| Failed::without_buffers(bug())),
        Err(f) => Err(f.map_buffers(|out| typed(split, out))),
    }
}

/// The typed buffers; `None` if the backend gave back others.
fn typed<R: HostBuffers>(split: &[usize], mut out: Vec<HostBuffer>) -> Option<R> {
    if !split.is_empty() {
        // A coalesced op ran as one op on the buffers' concatenation.
        out = match <[HostBuffer; 1]>::try_from(out) {
            Ok([fused]) => fused.split(split),
            Err(_) => return None,
        };
    }
    R::from_host(out)
}

impl<R: HostBuffers> Future for Work<R> {
    type Output = Result<R, Failed<R>>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut r = Pin::new(&mut self.inner).poll(cx);
        if r.is_pending() && self.assist.is_some() {
            self.help(None);
            r = Pin::new(&mut self.inner).poll(cx);
        }
        let r = std::task::ready!(r);
        Poll::Ready(convert(self.inner.context(), &self.split, r))
    }
}

impl<R> Unpin for Work<R> {}
