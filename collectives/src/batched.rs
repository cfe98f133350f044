//! [`Batched`]: the work of an op staged in a [`Batch`](crate::Batch),
//! which becomes the op's ordinary work once the batch is launched.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use chorus_core::sync::lock;
use chorus_core::{Failed, OpContext, WorkError};

/// Where a staged op's work lands at launch: the work, or why the op did
/// not run.
pub(crate) type Cell<W> = Arc<Mutex<Option<Result<W, WorkError>>>>;

/// Delivers `v` into `cell`.
pub(crate) fn put<W>(cell: &Cell<W>, v: Result<W, WorkError>) {
    *lock(cell) = Some(v);
}

/// The error of an op whose batch was dropped before launch.
pub(crate) fn cancelled(ctx: &OpContext) -> WorkError {
    WorkError::InvalidArgument {
        ctx: ctx.clone(),
        msg: "its batch was dropped before launch (an error or panic while staging it): \
              the op never ran"
            .into(),
    }
}

/// A new, empty cell.
pub(crate) fn cell<W>() -> Cell<W> {
    Arc::new(Mutex::new(None))
}

/// The work of an op staged in a [`Batch`](crate::Batch): after
/// [`Batch::launch`](crate::Batch::launch) it is
/// the op's ordinary work `W` ([`Work`](crate::Work) or
/// [`DeviceWork`](crate::DeviceWork)), and it resolves
/// when the whole batch has completed.
///
/// # Cancel safety
///
/// As for `W`: dropping it detaches the op, which still runs with its batch.
#[must_use = "the op runs with its batch anyway, but its buffers come back only through the work"]
pub struct Batched<W> {
    state: State<W>,
}

enum State<W> {
    /// A TCP batch's launch puts the work (or why the op did not run) into
    /// the cell.
    Cell { cell: Cell<W>, ctx: OpContext },
    /// The work: taken from its cell, or held from staging on (a view of
    /// its NCCL batch's one work), which `launched` says is launched (or
    /// why not).
    Work {
        work: W,
        launched: fn(&W) -> Result<(), WorkError>,
    },
}

impl<W: std::fmt::Debug> std::fmt::Debug for Batched<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.state {
            State::Cell { ctx, .. } => f
                .debug_struct("Batched")
                .field("op", ctx)
                .field("launched", &false)
                .finish(),
            State::Work { work, launched } => f
                .debug_struct("Batched")
                .field("work", work)
                .field("launched", &launched(work).is_ok())
                .finish(),
        }
    }
}

impl<W> Batched<W> {
    /// A work its batch's launch delivers into `cell`.
    pub(crate) fn new(cell: Cell<W>, ctx: OpContext) -> Self {
        Batched {
            state: State::Cell { cell, ctx },
        }
    }

    /// A work held from staging on, which `launched` says is launched
    /// (or why not).
    pub(crate) fn held(work: W, launched: fn(&W) -> Result<(), WorkError>) -> Self {
        Batched {
            state: State::Work { work, launched },
        }
    }

    /// The work once it is here; else why not (its batch is not launched
    /// yet, or the op did not run).
    fn fetch(&mut self) -> Result<&mut W, WorkError> {
        if let State::Cell { cell, ctx } = &self.state {
            let taken = lock(cell).take();
            match taken {
                Some(Ok(work)) => {
                    self.state = State::Work {
                        work,
                        launched: |_| Ok(()),
                    }
                }
                Some(Err(e)) => return Err(e),
                None => return Err(not_launched(ctx)),
            }
        }
        match &mut self.state {
            State::Work { work, .. } => Ok(work),
            State::Cell { ctx, .. } => Err(not_launched(ctx)),
        }
    }

    /// The op's work, once its batch was launched (for the levels `W`
    /// offers beyond `.await`, e.g.
    /// [`DeviceWork::stream_ordered`](crate::DeviceWork::stream_ordered)).
    ///
    /// # Errors
    ///
    /// The batch was not launched yet (the op still runs with its batch if
    /// it is launched later), was dropped unlaunched, or failed to launch.
    pub fn into_work(mut self) -> Result<W, WorkError> {
        self.fetch()?;
        match self.state {
            State::Work { work, launched } => launched(&work).map(|()| work),
            State::Cell { ctx, .. } => Err(not_launched(&ctx)),
        }
    }
}

/// The error of an op whose batch is not launched yet.
pub(crate) fn not_launched(ctx: &OpContext) -> WorkError {
    WorkError::InvalidArgument {
        ctx: ctx.clone(),
        msg: "its batch has not been launched yet (call Batch::launch first)".into(),
    }
}

impl<W, R> Future for Batched<W>
where
    W: Future<Output = Result<R, Failed<R>>> + Unpin,
{
    /// As `W`'s; an op whose batch failed to launch (or was never
    /// launched) fails without buffers: they were released with the batch.
    type Output = Result<R, Failed<R>>;

    /// Resolves with the op's work once the batch completed. Polled before
    /// its batch was launched it fails at once (a batch is launched on the
    /// thread that staged it, so waiting could never end).
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.fetch() {
            Ok(w) => Pin::new(w).poll(cx),
            Err(e) => Poll::Ready(Err(Failed::without_buffers(e))),
        }
    }
}
