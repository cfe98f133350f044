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
//! end event). Each backend stages and launches its own kind of group
//! through the backend interface (`backend::Backend::launch`). Ops take their sequence numbers at launch, in staging order,
//! so a group is atomic with respect to ops submitted by other threads.
//!
//! The NCCL group is opened and closed inside [`Group::launch`], on the
//! calling thread: it can never be left open, whatever the caller does in
//! between, and [`Group`] is `!Send` (a group belongs to the thread that
//! staged it). A group dropped before launch (an error with `?`, a panic)
//! runs nothing; its works fail with [`WorkError::InvalidArgument`] saying
//! so, and its buffers are dropped (no GPU work ever saw them).

use std::marker::PhantomData;

use chorus_core::{Op, ReduceOp, WorkError};

use super::handle::ProcessGroup;
use super::staging::Staging;
use crate::buffer::OpBuffer;
use crate::error::Rejected;
use crate::grouped::Grouped;

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
/// // Each fails with its own buffers; joined, the errors are one type.
/// use futures::TryFutureExt;
/// let (a, b) = futures::try_join!(a.err_into::<chorus::Error>(), b.err_into())?;
/// # let _ = (a, b);
/// # Ok(())
/// # }
/// ```
#[must_use = "a group runs nothing until it is launched"]
pub struct Group<'pg> {
    pg: &'pg ProcessGroup,
    staging: Staging,
    /// A group belongs to the thread that stages it.
    _not_send: PhantomData<*const ()>,
}

impl std::fmt::Debug for Group<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Group")
            .field("group", &self.pg.name())
            .field("backend", &self.staging.backend())
            .field("ops", &self.staging.len())
            .finish()
    }
}

impl ProcessGroup {
    /// Opens a group: stage ops on it, then [`launch`](Group::launch) them
    /// as one (see [`Group`]).
    pub fn group(&self) -> Group<'_> {
        Group {
            pg: self,
            staging: Staging::default(),
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
        op: ReduceOp,
    ) -> Result<Grouped<B::Work>, Rejected<B>> {
        B::stage1(&self.pg.inner, &mut self.staging, Op::AllReduce(op), buf)
    }

    /// Stages a broadcast (see [`ProcessGroup::broadcast`]).
    pub fn broadcast<B: OpBuffer>(
        &mut self,
        buf: B,
        root: usize,
    ) -> Result<Grouped<B::Work>, Rejected<B>> {
        B::stage1(
            &self.pg.inner,
            &mut self.staging,
            Op::Broadcast { root },
            buf,
        )
    }

    /// Stages a reduce (see [`ProcessGroup::reduce`]).
    pub fn reduce<B: OpBuffer>(
        &mut self,
        buf: B,
        root: usize,
        op: ReduceOp,
    ) -> Result<Grouped<B::Work>, Rejected<B>> {
        B::stage1(
            &self.pg.inner,
            &mut self.staging,
            Op::Reduce { root, op },
            buf,
        )
    }

    /// Stages an all_gather (see [`ProcessGroup::all_gather`]).
    pub fn all_gather<B: OpBuffer>(
        &mut self,
        input: B,
        output: B,
    ) -> Result<Grouped<B::PairWork>, Rejected<(B, B)>> {
        B::stage2(
            &self.pg.inner,
            &mut self.staging,
            Op::AllGather,
            input,
            output,
        )
    }

    /// Stages a reduce_scatter (see [`ProcessGroup::reduce_scatter`]).
    pub fn reduce_scatter<B: OpBuffer>(
        &mut self,
        input: B,
        output: B,
        op: ReduceOp,
    ) -> Result<Grouped<B::PairWork>, Rejected<(B, B)>> {
        B::stage2(
            &self.pg.inner,
            &mut self.staging,
            Op::ReduceScatter(op),
            input,
            output,
        )
    }

    /// Stages an all_to_all (see [`ProcessGroup::all_to_all`]).
    pub fn all_to_all<B: OpBuffer>(
        &mut self,
        input: B,
        output: B,
    ) -> Result<Grouped<B::PairWork>, Rejected<(B, B)>> {
        B::stage2(
            &self.pg.inner,
            &mut self.staging,
            Op::AllToAll,
            input,
            output,
        )
    }

    /// Stages a send to `dst` (see [`ProcessGroup::send`]). Inside a group,
    /// a send and the matching recv may be staged in either order on each
    /// rank.
    pub fn send<B: OpBuffer>(
        &mut self,
        buf: B,
        dst: usize,
    ) -> Result<Grouped<B::Work>, Rejected<B>> {
        B::stage1(
            &self.pg.inner,
            &mut self.staging,
            Op::Send { peer: dst },
            buf,
        )
    }

    /// Stages a recv from `src` (see [`ProcessGroup::recv`]).
    pub fn recv<B: OpBuffer>(
        &mut self,
        buf: B,
        src: usize,
    ) -> Result<Grouped<B::Work>, Rejected<B>> {
        B::stage1(
            &self.pg.inner,
            &mut self.staging,
            Op::Recv { peer: src },
            buf,
        )
    }
}

impl<'pg> Group<'pg> {
    /// The process group the ops run on.
    pub fn process_group(&self) -> &'pg ProcessGroup {
        self.pg
    }

    /// Number of ops staged.
    pub fn len(&self) -> usize {
        self.staging.len()
    }

    /// True if no op was staged.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
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
        let staging = std::mem::take(&mut self.staging);
        staging.launch(&self.pg.inner, self.pg.timeout)
    }
}
