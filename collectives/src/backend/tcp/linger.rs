//! Pipes left watched after a caller's small op, so that the next op's
//! frames ring no doorbell.
//!
//! A caller that spun on a small op (see `drive`) watches the pipes of its
//! peers: their writers do not ring. If its last poll said "asleep", as a
//! host task does, every peer's next frame would ring the doorbell (a
//! system call) and wake this rank's I/O thread (a context switch), which
//! finds the reader claimed by the caller spinning on that next op: two
//! thread hand-offs per op for nothing, on a loop of back-to-back small
//! ops. So a caller whose op is done while the worker waits for work
//! *lingers*: its last poll leaves the pipes watched (`halves::while_lingering`)
//! and the peers' next frames wait in the pipes for the next caller.
//!
//! Whoever else must read them is told:
//!
//! * **The worker on an I/O thread.** An op the host task runs (a large
//!   one, or one submitted from an I/O thread) wakes the readers before it
//!   waits for frames ([`waking_lingering_readers`]); a reader polled by its
//!   host says it sleeps, as always, and reads what came. The caller, after
//!   its lingering poll, marks the linger and then looks at the worker: not
//!   idle, it polls the readers once more to sleep. The two flags and why
//!   no reader is left lingering unseen are `chorus_core::linger`'s (the
//!   loom suite checks them).
//! * **An op that nobody awaits.** A small op is started on its submitter's
//!   thread and may then wait for frames that no caller will read. The
//!   [`sweep`] looks every [`SWEEP`] while pipes linger: a worker that is
//!   still on the op it had at the last look, or one that waits for work,
//!   ends the linger (the readers are woken and sleep as usual). So such
//!   an op completes at most two sweeps late; ops that follow each other
//!   faster than that never wake the I/O thread.
//! * **A peer's end or a full pipe.** The socket stays registered with the
//!   I/O driver while its pipe lingers: the peer's end wakes the reader's
//!   host, and so does the doorbell a writer rings when it finds the pipe
//!   full (see `pipe_io`).

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::state::Inner;
use chorus_core::linger::Marked;
use chorus_core::sync::lock;

/// How often pipes that linger are looked at.
pub(super) const SWEEP: Duration = Duration::from_millis(1);

impl Inner {
    /// A caller left its pipes watched: marks it (see
    /// [`Linger::mark`](chorus_core::linger::Linger::mark)); the first mark
    /// of a linger starts the sweep.
    pub(super) fn mark_lingering(&self) -> Marked {
        let m = self.linger.mark();
        if m.first {
            self.linger_start.notify_one();
        }
        m
    }

    /// Ends a linger: the readers are woken; polled by their hosts, they
    /// say they sleep and read what came.
    pub(super) fn end_linger(&self) {
        if self.linger.end() {
            for r in lock(&self.readers).iter() {
                r.wake();
            }
        }
    }
}

/// The worker's future, ending a linger whenever it waits with an op in
/// hand on an I/O thread (see the module docs).
pub(super) fn waking_lingering_readers(
    inner: Arc<Inner>,
    fut: impl Future<Output = ()> + Send + 'static,
) -> impl Future<Output = ()> + Send + 'static {
    let mut fut = Box::pin(fut);
    std::future::poll_fn(move |cx| {
        let p = fut.as_mut().poll(cx);
        if p.is_pending() && chorus_store::rt::on_io_thread() && !inner.linger.is_idle() {
            inner.end_linger();
        }
        p
    })
}

/// The sweep of a group's lingering pipes (see the module docs), until
/// `done` says the worker ended.
pub(super) async fn sweep(inner: Arc<Inner>, mut done: watch::Receiver<bool>) {
    loop {
        tokio::select! {
            () = inner.linger_start.notified() => {}
            _ = done.wait_for(|d| *d) => return,
        }
        let mut last = inner.taken.load(Ordering::SeqCst);
        loop {
            tokio::time::sleep(SWEEP).await;
            if !inner.linger.is_lingering() {
                break;
            }
            // No op taken since the last look: the worker waits for work
            // or on an op no caller polls.
            let taken = inner.taken.load(Ordering::SeqCst);
            if taken == last {
                inner.end_linger();
                break;
            }
            last = taken;
        }
    }
}
