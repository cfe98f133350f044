//! The backend interface: [`Backend`], [`Runs`] and [`Coalesces`] (see
//! the [module docs](super)).

use std::fmt;
use std::time::Duration;

use chorus_core::{Op, WorkError};
use futures::future::BoxFuture;

use crate::batched::Batched;
use crate::error::Rejected;
use crate::sequence::Sequencer;

/// What a group does with a backend besides running single ops.
pub(crate) trait Backend: Send + Sync + fmt::Debug {
    /// The ops of one batch (see [`Batch`](crate::Batch)) staged for this
    /// backend. Dropped unlaunched, it fails their works: the ops never ran.
    type Staged: Default;

    /// Short name, e.g. `"tcp"`.
    fn name(&self) -> &'static str;

    /// Issues the staged ops as one, in staging order: they take their
    /// sequence numbers now, under one hold of the submission lock, so a
    /// batch is atomic with respect to ops other threads submit.
    ///
    /// # Errors
    ///
    /// The group failed before, or the launch failed; every op of the batch
    /// then fails with the same error.
    fn launch(
        &self,
        seq: &Sequencer,
        timeout: Duration,
        staged: Self::Staged,
    ) -> Result<(), WorkError>;

    /// Closes the backend gracefully at the end of a job: says goodbye to
    /// every peer and waits (bounded) for theirs, so that no rank exits
    /// while another still reads what it sent. Ops submitted afterwards
    /// fail.
    fn close(&self) -> BoxFuture<'static, ()> {
        Box::pin(async {})
    }

    /// Tears the backend down after a failure (close connections, abort
    /// communicators). Pending and later ops fail; buffers of ops still in
    /// flight are released only once nothing can touch them.
    fn abort(&self, cause: &WorkError);

    /// The backend's asynchronous error, if it has one (NCCL:
    /// `ncclCommGetAsyncError` of a live communicator); the watchdog asks.
    fn async_error(&self) -> Option<String> {
        None
    }
}

/// Running ops whose buffers come as `S`: one buffer `B`, or an input and
/// an output `(B, B)`.
pub(crate) trait Runs<S>: Backend {
    /// The future the op returns; it yields the buffers back as `S`.
    type Work;

    /// Checks `op` on `bufs`, takes its sequence number and submits it.
    ///
    /// # Errors
    ///
    /// The op was refused (invalid arguments, a failed group, a
    /// communicator that cannot be had): nothing ran, and the buffers come
    /// back untouched.
    fn submit(
        &self,
        seq: &Sequencer,
        timeout: Duration,
        op: Op,
        bufs: S,
    ) -> Result<Self::Work, Rejected<S>>;

    /// Checks `op` on `bufs` and stages it in `staged`; it runs when the
    /// batch is launched ([`Backend::launch`]).
    ///
    /// # Errors
    ///
    /// As for [`submit`](Self::submit); the batch stays as it was.
    fn stage(
        &self,
        seq: &Sequencer,
        staged: &mut Self::Staged,
        op: Op,
        bufs: S,
    ) -> Result<Batched<Self::Work>, Rejected<S>>;
}

/// A one-buffer op on each of several buffers `B`, as one op with one
/// sequence number and one work (PyTorch's `all_reduce_coalesced`).
pub(crate) trait Coalesces<B>: Backend {
    /// The future the op returns; it yields the buffers back in order.
    type Work;

    /// Checks and submits the coalesced op.
    ///
    /// # Errors
    ///
    /// As for [`Runs::submit`]; on NCCL, a failure inside the NCCL group
    /// (after part of it may have been enqueued) keeps the buffers until
    /// the stream has passed it, and the rejection holds none.
    fn submit_coalesced(
        &self,
        seq: &Sequencer,
        timeout: Duration,
        op: Op,
        bufs: Vec<B>,
    ) -> Result<Self::Work, Rejected<Vec<B>>>;
}
