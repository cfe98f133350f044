//! [`ProcessGroup`]: a handle on a group, and the collectives it runs.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use chorus_core::comm_cache::CommKey;
use chorus_core::flight_recorder::OpRecord;
use chorus_core::{Op, OpContext, ReduceOp, WorkError};
use chorus_gpu::nccl::DeviceMem;

use super::state::GroupState;
use crate::backend::{Backend, Runs};
use crate::buffer::OpBuffer;
use crate::device_work::DeviceWork;
use crate::error::{Error, Rejected};
use crate::watchdog;
use crate::work::Work;
use chorus_core::sync::lock;

/// A group of ranks that run collectives together.
///
/// Cheap to clone (the clones share the group). Every op is submitted to its
/// backend when it is called, in program order, and returns a work future
/// that yields the op's buffers back when it is done.
///
/// Every rank of a group must call the same collectives in the same order
/// with matching counts and dtypes; a mismatch is reported as
/// [`WorkError::Mismatch`] naming both sides.
#[derive(Clone)]
pub struct ProcessGroup {
    pub(crate) inner: Arc<GroupState>,
    /// Per-op timeout override set by [`with_timeout`](Self::with_timeout).
    pub(crate) timeout: Duration,
}

impl fmt::Debug for ProcessGroup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProcessGroup")
            .field("name", self.inner.seq.name())
            .field("rank", &self.rank())
            .field("size", &self.size())
            .finish()
    }
}

impl ProcessGroup {
    /// This rank's index in the group.
    pub fn rank(&self) -> usize {
        self.inner.seq.rank()
    }

    /// Number of ranks in the group.
    pub fn size(&self) -> usize {
        self.inner.seq.size()
    }

    /// The group's name (`"world"`, or `"world/1"` for its first subgroup).
    pub fn name(&self) -> &str {
        self.inner.seq.name()
    }

    /// World ranks of the members, by group rank.
    pub fn members(&self) -> &[usize] {
        &self.inner.members
    }

    /// This rank's world rank: its rank in the job (`members()[rank()]`).
    /// It stays the same in every group of this process, while
    /// [`rank`](Self::rank) is the rank inside this group (a subgroup's,
    /// or a re-formed group's after the ranks were renumbered).
    ///
    /// # Examples
    ///
    /// ```
    /// # async fn demo() -> Result<(), chorus::Error> {
    /// let store = std::sync::Arc::new(chorus::store::InMemoryStore::new());
    /// let world = chorus::ProcessGroup::builder().store(store).build().await?;
    /// let sub = world.new_group(&[0]).await?.expect("rank 0 is a member");
    /// assert_eq!(sub.world_rank(), world.world_rank());
    /// assert_eq!(sub.world_rank(), sub.members()[sub.rank()]);
    /// # Ok(()) }
    /// # futures::executor::block_on(demo()).unwrap();
    /// ```
    pub fn world_rank(&self) -> usize {
        self.inner.members[self.rank()]
    }

    /// How many times the launcher restarted this rank's process in place
    /// after it failed: `CHORUS_RANK_RESTARTS`, which `chorus-run
    /// --max-restarts` sets (0 on a first start, and under launchers that
    /// do not restart ranks in place). The same in every group of this
    /// process. Whether this rank rejoined a running group, whoever
    /// restarted it, is [`is_replacement`](Self::is_replacement).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), chorus::Error> {
    /// let pg = chorus::ProcessGroup::init_from_env().await?;
    /// if pg.restarts() > 0 {
    ///     eprintln!(
    ///         "world rank {} restarted {} time(s); rejoined as rank {} of '{}'",
    ///         pg.world_rank(),
    ///         pg.restarts(),
    ///         pg.rank(),
    ///         pg.name()
    ///     );
    /// }
    /// # Ok(()) }
    /// ```
    pub fn restarts(&self) -> u64 {
        self.inner.origin.restarts
    }

    /// True when this rank is a replacement: it came into the job by
    /// rejoining the running group ([`GroupBuilder::rejoin`](crate::GroupBuilder::rejoin),
    /// [`rejoin_from_env`](crate::GroupBuilder::rejoin_from_env), or
    /// [`init_from_env`](crate::GroupBuilder::init_from_env) in a rank
    /// that `chorus-run --max-restarts` restarted), not through the
    /// initial rendezvous, and so holds none of the others' state. Groups
    /// made from its group keep the answer: those re-formed from it
    /// ([`reform`](Self::reform), [`admit`](Self::admit)) and its
    /// subgroups ([`new_group`](Self::new_group)).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn load_checkpoint() -> Vec<f32> { vec![0.0; 1024] }
    /// # fn fresh_model() -> Vec<f32> { vec![0.0; 1024] }
    /// # async fn demo() -> Result<(), chorus::Error> {
    /// let pg = chorus::ProcessGroup::init_from_env().await?;
    /// let params = if pg.is_replacement() {
    ///     // The others trained on while this rank was down.
    ///     load_checkpoint()
    /// } else {
    ///     fresh_model()
    /// };
    /// # let _ = params; Ok(()) }
    /// ```
    pub fn is_replacement(&self) -> bool {
        self.inner.origin.replacement
    }

    /// The name of the backend host buffers run on (`"tcp"`); device
    /// buffers run on NCCL.
    pub fn backend_name(&self) -> &'static str {
        self.inner.tcp.name()
    }

    /// The op timeout applied to ops submitted through this handle.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// A handle on the same group whose ops use `timeout` instead of the
    /// group's default (the per-op override).
    pub fn with_timeout(&self, timeout: Duration) -> ProcessGroup {
        ProcessGroup {
            inner: self.inner.clone(),
            timeout,
        }
    }

    /// Number of ops submitted and not yet finished.
    pub fn pending(&self) -> usize {
        self.inner.seq.registry().pending()
    }

    /// The ops in the group's flight recorder, oldest first.
    pub fn flight_record(&self) -> Vec<OpRecord> {
        self.inner
            .seq
            .registry()
            .recorder()
            .map(|r| r.snapshot())
            .unwrap_or_default()
    }

    /// Writes the flight recorders of every group of this process into the
    /// dump folder ([`WatchdogConfig::dump_dir`](crate::watchdog::WatchdogConfig::dump_dir),
    /// `CHORUS_TRACE_DIR`) and returns the file's path; read it with
    /// `chorus-trace`.
    ///
    /// # Errors
    ///
    /// The I/O error.
    pub fn dump_flight_recorder(&self) -> std::io::Result<std::path::PathBuf> {
        watchdog::dump_all("request")
    }

    /// The group's first error, once it has failed or was aborted.
    pub fn error(&self) -> Option<WorkError> {
        self.inner.seq.registry().errored()
    }

    /// Aborts the group: closes its connections and fails every pending op
    /// with [`WorkError::Aborted`]; every later op fails at once. Ops cannot
    /// be recalled otherwise (dropping a work does not cancel it).
    pub fn abort(&self, reason: &str) {
        let cause = WorkError::Aborted {
            ctx: self.inner.seq.ctx(0, "abort"),
            reason: reason.to_string(),
        };
        tracing::warn!(group = %self.name(), reason, "group aborted");
        self.inner.seq.registry().abort(&cause);
    }

    /// How many NCCL communicators this group has created (each creation
    /// also emits a `tracing` event "creating NCCL communicator").
    pub fn nccl_comms_created(&self) -> u64 {
        self.inner.nccl.comms_created()
    }

    /// How long shrinking its predecessor's NCCL communicator took
    /// (`ncclCommShrink`), if this group was re-formed after lost ranks
    /// and got its communicator that way ([`ReformComms::Shrink`](crate::ReformComms::Shrink));
    /// `None` for a group whose communicators are created afresh.
    pub fn nccl_shrunk(&self) -> Option<std::time::Duration> {
        self.inner.nccl.shrunk()
    }

    /// Creates the group's NCCL communicator on `device` now (eager init)
    /// instead of at the first device op. Every rank of the group must call
    /// it. A no-op if it exists.
    ///
    /// # Errors
    ///
    /// [`Error::Setup`] if NCCL or CUDA is unavailable or the communicator
    /// cannot be created.
    pub async fn init_device(&self, device: usize) -> Result<(), Error> {
        let dev = u32::try_from(device)
            .map_err(|_| Error::InvalidArgument(format!("device {device} is out of range")))?;
        self.inner
            .nccl
            .comm_async(CommKey::devices([dev]), dev)
            .await
            .map_err(|e| Error::Setup {
                group: self.name().to_string(),
                rank: self.rank(),
                msg: e.to_string(),
            })?;
        Ok(())
    }

    /// Leaves the job at its end, on every rank: closes the group's
    /// connections gracefully (says goodbye to every peer and waits, at most
    /// 2 s, for theirs, so no rank exits while another still reads what it
    /// sent), then leaves the rendezvous (rank 0 waits for every rank to
    /// leave, then stops the store server). Ops submitted afterwards fail.
    ///
    /// # Errors
    ///
    /// [`Error::Rendezvous`] if some ranks did not leave in time (rank 0).
    pub async fn shutdown(&self) -> Result<(), Error> {
        // Failures after the goodbye are nobody else's concern.
        if let Some(p) = &self.inner.propagation {
            p.stop();
        }
        if let Some(l) = &self.inner.liveness_task {
            l.stop();
        }
        // Goodbyes first: no rank closes while another still reads from it.
        let close = self.inner.tcp.close();
        chorus_store::rt::run(close)
            .await
            .map_err(|msg| Error::Setup {
                group: self.name().to_string(),
                rank: self.rank(),
                msg,
            })?;
        let rdzv = lock(&self.inner.rendezvous).take();
        match rdzv {
            Some(r) => Ok(r.shutdown().await?),
            None => Ok(()),
        }
    }

    /// The context of this group's op `op` at `seq`.
    pub(crate) fn ctx(&self, seq: u64, op: &'static str) -> OpContext {
        self.inner.seq.ctx(seq, op)
    }
}

/// The collectives. Each is submitted at once, in program order, and returns
/// a work that gives the buffers back. The buffer type picks the backend
/// ([`OpBuffer`]): host `Vec<T>` runs on the TCP backend and returns a
/// [`Work`]; device buffers ([`DeviceBuffer<T>`](crate::DeviceBuffer),
/// [`RawDeviceBuffer`](crate::RawDeviceBuffer), any
/// [`DeviceMem`]) run on NCCL and return a [`DeviceWork`] with explicit
/// completion levels.
///
/// The first device op of a group on a device creates its NCCL communicator
/// (every rank must reach it) and blocks until it is ready, unless the
/// device was given at creation ([`GroupBuilder::device`](crate::GroupBuilder::device))
/// or to [`ProcessGroup::init_device`].
///
/// # Errors
///
/// Each returns [`Rejected`] (with the buffers, untouched) if the arguments
/// are invalid, the group has already failed, or the NCCL communicator
/// cannot be created; the work itself fails with a [`WorkError`] if the op
/// fails while running.
impl ProcessGroup {
    /// Reduces `buf` across all ranks, in place: every rank gets the result.
    pub fn all_reduce<B: OpBuffer>(&self, buf: B, op: ReduceOp) -> Result<B::Work, Rejected<B>> {
        B::submit1(&self.inner, self.timeout, Op::AllReduce(op), buf)
    }

    /// Reduces each buffer of `bufs` across all ranks, as one op with one
    /// work (PyTorch's `all_reduce_coalesced`): every rank passes buffers of
    /// the same lengths and dtypes in the same order, and the work yields
    /// them back in that order. For many small buffers (gradient buckets)
    /// this costs one op where a [`batch`](Self::batch) costs one work per
    /// buffer.
    ///
    /// * **NCCL** (device buffers): one `ncclGroupStart` … `ncclGroupEnd`
    ///   with one `ncclAllReduce` per buffer (NCCL fuses them into one
    ///   launch), one input-ready wait per producer stream and one end event;
    ///   the [`DeviceWork`] has the usual completion levels.
    /// * **TCP** (host buffers): one all_reduce of the concatenation, cut
    ///   back into the buffers when it finishes.
    ///
    /// The op takes one sequence number.
    ///
    /// # Errors
    ///
    /// No buffer, a buffer that does not fit, or a failed group: the
    /// buffers come back untouched in the [`Rejected`]. On NCCL, a failure
    /// inside the NCCL group (after part of it may have been enqueued)
    /// keeps the buffers until the stream has passed it, and the rejection
    /// holds none.
    ///
    /// # Cancel safety
    ///
    /// As for every op: dropping the work detaches it.
    pub fn all_reduce_coalesced<B: OpBuffer>(
        &self,
        bufs: Vec<B>,
        op: ReduceOp,
    ) -> Result<B::ManyWork, Rejected<Vec<B>>> {
        B::submit_many(&self.inner, self.timeout, Op::AllReduce(op), bufs)
    }

    /// Copies `root`'s `buf` into every rank's `buf` (same length on every
    /// rank).
    pub fn broadcast<B: OpBuffer>(&self, buf: B, root: usize) -> Result<B::Work, Rejected<B>> {
        B::submit1(&self.inner, self.timeout, Op::Broadcast { root }, buf)
    }

    /// Reduces `buf` across all ranks into `root`'s `buf`; the other ranks'
    /// buffers come back unchanged (TCP) or unspecified (NCCL).
    pub fn reduce<B: OpBuffer>(
        &self,
        buf: B,
        root: usize,
        op: ReduceOp,
    ) -> Result<B::Work, Rejected<B>> {
        B::submit1(&self.inner, self.timeout, Op::Reduce { root, op }, buf)
    }

    /// Gathers every rank's `input` into `output` (length `size × input.len()`),
    /// in rank order. Yields `(input, output)`.
    pub fn all_gather<B: OpBuffer>(
        &self,
        input: B,
        output: B,
    ) -> Result<B::PairWork, Rejected<(B, B)>> {
        B::submit2(&self.inner, self.timeout, Op::AllGather, input, output)
    }

    /// Reduces `input` (length `size × output.len()`) across ranks; rank r
    /// receives block r of the result in `output`. Yields `(input, output)`.
    pub fn reduce_scatter<B: OpBuffer>(
        &self,
        input: B,
        output: B,
        op: ReduceOp,
    ) -> Result<B::PairWork, Rejected<(B, B)>> {
        B::submit2(
            &self.inner,
            self.timeout,
            Op::ReduceScatter(op),
            input,
            output,
        )
    }

    /// Exchanges equal blocks: block j of this rank's `input` goes to rank j,
    /// and block i of `output` comes from rank i. Both have `size × k`
    /// elements. Yields `(input, output)`.
    pub fn all_to_all<B: OpBuffer>(
        &self,
        input: B,
        output: B,
    ) -> Result<B::PairWork, Rejected<(B, B)>> {
        B::submit2(&self.inner, self.timeout, Op::AllToAll, input, output)
    }

    /// Sends `buf` to rank `dst`, which must post a matching
    /// [`recv`](Self::recv) of the same length. Yields `buf` back.
    pub fn send<B: OpBuffer>(&self, buf: B, dst: usize) -> Result<B::Work, Rejected<B>> {
        B::submit1(&self.inner, self.timeout, Op::Send { peer: dst }, buf)
    }

    /// Receives from rank `src` into `buf`, whose length must equal the
    /// sender's. Yields `buf` filled.
    pub fn recv<B: OpBuffer>(&self, buf: B, src: usize) -> Result<B::Work, Rejected<B>> {
        B::submit1(&self.inner, self.timeout, Op::Recv { peer: src }, buf)
    }

    /// Sends `send` to `peer` and receives `recv` from it, as one grouped
    /// NCCL op on the pair's point-to-point communicator (`peer` may be this
    /// rank). Yields `(send, recv)`. Device buffers only: on host buffers,
    /// stage a send and a recv in a [`batch`](Self::batch).
    pub fn send_recv<B: DeviceMem>(
        &self,
        send: B,
        recv: B,
        peer: usize,
    ) -> Result<DeviceWork<(B, B)>, Rejected<(B, B)>> {
        self.inner.nccl.submit(
            &self.inner.seq,
            self.timeout,
            Op::SendRecv { peer },
            (send, recv),
        )
    }

    /// Completes when every rank of the group has entered the barrier.
    pub fn barrier(&self) -> Result<Work<()>, Rejected<()>> {
        self.inner
            .tcp
            .submit(&self.inner.seq, self.timeout, Op::Barrier, ())
    }
}
