//! Batches: several collectives and point-to-point ops staged, then
//! launched as one.
//!
//! [`ProcessGroup::batch`] opens a [`Batch`]; its op methods check and
//! stage ops without running them; [`Batch::launch`] issues them together:
//!
//! * **NCCL** (device buffers): one `ncclGroupStart` … `ncclGroupEnd` on the
//!   process group's collective communicator, so NCCL fuses the ops into one
//!   plan and launch; one input-ready wait per producer stream, one end
//!   event for the whole batch. Point-to-point ops in a batch run on the
//!   collective communicator (with group ranks), not on the pair
//!   communicators that a lone `send`/`recv` uses, as NCCL requires for a
//!   send and a recv to pair up inside one NCCL group.
//! * **TCP** (host buffers): the ops reach the worker together; runs of
//!   all_reduces with the same dtype and reduction are fused into one
//!   all_reduce of their concatenation (one message exchange), the other ops
//!   run in order.
//!
//! Every op of a batch returns its own [`Batched`] work, and every one of
//! them resolves when the whole batch has completed (on NCCL they share the
//! end event). Each backend stages and launches its own batches through the
//! backend interface (`backend::Backend::launch`). Ops take their sequence
//! numbers at launch, in staging order, so a batch is atomic with respect
//! to ops submitted by other threads.
//!
//! The NCCL group is opened and closed inside [`Batch::launch`], on the
//! calling thread: it can never be left open, whatever the caller does in
//! between, and [`Batch`] is `!Send` (a batch belongs to the thread that
//! staged it). A batch dropped before launch (an error with `?`, a panic)
//! runs nothing; its works fail with [`WorkError::InvalidArgument`] saying
//! so, and its buffers are dropped (no GPU work ever saw them).

use std::marker::PhantomData;

use chorus_core::{Op, ReduceOp, WorkError};

use super::batch_ops::BatchOps;
use super::process_group::ProcessGroup;
use crate::batched::Batched;
use crate::buffer::OpBuffer;
use crate::error::Rejected;

/// Ops staged to run as one (see the [module docs](self)).
///
/// # Examples
///
/// ```
/// # async fn demo(pg: &chorus::ProcessGroup) -> Result<(), chorus::Error> {
/// use chorus::ReduceOp;
/// let mut g = pg.batch();
/// let a = g.all_reduce(vec![1.0f32; 4], ReduceOp::Sum)?;
/// let b = g.all_reduce(vec![2i64; 3], ReduceOp::Max)?;
/// g.launch()?;
/// // Each fails with its own buffers; joined, the errors are one type.
/// use futures::TryFutureExt;
/// let (a, b) = futures::try_join!(a.err_into::<chorus::Error>(), b.err_into())?;
/// # let _ = (a, b);
/// # Ok(())
/// # }
/// ```
#[must_use = "a batch runs nothing until it is launched"]
pub struct Batch<'pg> {
    pg: &'pg ProcessGroup,
    ops: BatchOps,
    /// A batch belongs to the thread that stages it.
    _not_send: PhantomData<*const ()>,
}

impl std::fmt::Debug for Batch<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batch")
            .field("group", &self.pg.name())
            .field("backend", &self.ops.backend())
            .field("ops", &self.ops.len())
            .finish()
    }
}

impl ProcessGroup {
    /// Opens a batch: stage ops on it, then [`launch`](Batch::launch) them
    /// as one (see [`Batch`]).
    pub fn batch(&self) -> Batch<'_> {
        Batch {
            pg: self,
            ops: BatchOps::default(),
            _not_send: PhantomData,
        }
    }

    /// Runs `stage` on a new batch and launches the batch if it returns
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
    /// let (a, b) = pg.batched(|g| {
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
    pub fn batched<T, E>(&self, stage: impl FnOnce(&mut Batch<'_>) -> Result<T, E>) -> Result<T, E>
    where
        E: From<WorkError>,
    {
        let mut g = self.batch();
        let out = stage(&mut g)?;
        g.launch()?;
        Ok(out)
    }
}

/// The batch's ops. Each checks its arguments at once (a refusal gives the
/// buffers back and leaves the batch as it was) and stages the op.
///
/// # Errors
///
/// [`Rejected`] with the buffers for invalid arguments, for a buffer of the
/// other backend than the batch's first op (a batch runs on one backend),
/// for device buffers on another device than the batch's first, and when
/// the NCCL communicator cannot be had.
impl Batch<'_> {
    /// Stages an all_reduce (see [`ProcessGroup::all_reduce`]).
    pub fn all_reduce<B: OpBuffer>(
        &mut self,
        buf: B,
        op: ReduceOp,
    ) -> Result<Batched<B::Work>, Rejected<B>> {
        self.stage1(Op::AllReduce(op), buf)
    }

    /// Stages a broadcast (see [`ProcessGroup::broadcast`]).
    pub fn broadcast<B: OpBuffer>(
        &mut self,
        buf: B,
        root: usize,
    ) -> Result<Batched<B::Work>, Rejected<B>> {
        self.stage1(Op::Broadcast { root }, buf)
    }

    /// Stages a reduce (see [`ProcessGroup::reduce`]).
    pub fn reduce<B: OpBuffer>(
        &mut self,
        buf: B,
        root: usize,
        op: ReduceOp,
    ) -> Result<Batched<B::Work>, Rejected<B>> {
        self.stage1(Op::Reduce { root, op }, buf)
    }

    /// Stages an all_gather (see [`ProcessGroup::all_gather`]).
    pub fn all_gather<B: OpBuffer>(
        &mut self,
        input: B,
        output: B,
    ) -> Result<Batched<B::PairWork>, Rejected<(B, B)>> {
        self.stage2(Op::AllGather, input, output)
    }

    /// Stages a reduce_scatter (see [`ProcessGroup::reduce_scatter`]).
    pub fn reduce_scatter<B: OpBuffer>(
        &mut self,
        input: B,
        output: B,
        op: ReduceOp,
    ) -> Result<Batched<B::PairWork>, Rejected<(B, B)>> {
        self.stage2(Op::ReduceScatter(op), input, output)
    }

    /// Stages an all_to_all (see [`ProcessGroup::all_to_all`]).
    pub fn all_to_all<B: OpBuffer>(
        &mut self,
        input: B,
        output: B,
    ) -> Result<Batched<B::PairWork>, Rejected<(B, B)>> {
        self.stage2(Op::AllToAll, input, output)
    }

    /// Stages a send to `dst` (see [`ProcessGroup::send`]). Inside a batch,
    /// a send and the matching recv may be staged in either order on each
    /// rank.
    pub fn send<B: OpBuffer>(
        &mut self,
        buf: B,
        dst: usize,
    ) -> Result<Batched<B::Work>, Rejected<B>> {
        self.stage1(Op::Send { peer: dst }, buf)
    }

    /// Stages a recv from `src` (see [`ProcessGroup::recv`]).
    pub fn recv<B: OpBuffer>(
        &mut self,
        buf: B,
        src: usize,
    ) -> Result<Batched<B::Work>, Rejected<B>> {
        self.stage1(Op::Recv { peer: src }, buf)
    }
}

impl<'pg> Batch<'pg> {
    /// Stages a one-buffer op through its buffer's backend.
    fn stage1<B: OpBuffer>(&mut self, op: Op, buf: B) -> Result<Batched<B::Work>, Rejected<B>> {
        B::stage1(&self.pg.inner, &mut self.ops, op, buf)
    }

    /// Stages a two-buffer op through its buffers' backend.
    fn stage2<B: OpBuffer>(
        &mut self,
        op: Op,
        input: B,
        output: B,
    ) -> Result<Batched<B::PairWork>, Rejected<(B, B)>> {
        B::stage2(&self.pg.inner, &mut self.ops, op, input, output)
    }

    /// The process group the ops run on.
    pub fn process_group(&self) -> &'pg ProcessGroup {
        self.pg
    }

    /// Number of ops staged.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// True if no op was staged.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Issues every staged op as one (see [`Batch`]); returns at once. Each
    /// op's [`Batched`] work then resolves when the whole batch completes.
    /// An empty batch launches nothing.
    ///
    /// # Errors
    ///
    /// The process group already failed, or the launch failed (the NCCL or
    /// CUDA error): every op of the batch then fails with the same error.
    pub fn launch(mut self) -> Result<(), WorkError> {
        let ops = std::mem::take(&mut self.ops);
        ops.launch(&self.pg.inner, self.pg.timeout)
    }
}
