//! [`WorkBatch`]: the works of ops launched as one (the ops of a group:
//! one launch, one end event), entered in the registry as one entry.
//!
//! Each op may get its own work and completer ([`WorkBatch::add`]), so
//! each is awaited, failed and given back on its own, or the batch may
//! have one work that stands for ops recorded without one
//! ([`WorkBatch::record`]; a group's ops read their outcome from it); what
//! the batch shares is the bookkeeping around them. Its ops' flight records are written under one
//! hold of the recorder with one clock reading, the registry holds one
//! entry for all of them (one deadline, one probe, failed as one by an
//! abort or a timeout, each work with the error made its own), and the
//! first of the completers to finish retires that entry and marks every
//! record: ops launched as one end as one. The records take that first
//! outcome, even where it was a completer dropped by a backend shutting
//! down ("dropped by the backend") and later ones of the batch ended well.

use std::time::{Duration, Instant};

use super::future::{Completer, OpFuture, Shared};
use super::registry::{BatchInsert, FinishedProbe, Registry};
use super::slot::Slot;
use crate::error::{OpContext, WorkError};
use crate::flight_recorder::OpMeta;
use crate::sync::{Arc, AtomicBool, DynArc};

/// The ops of one launch being registered ([`WorkBatch::register`]).
///
/// It holds the group's registry (and flight recorder) locked while it
/// lives: the closure given to `register` only adds ops, and must not
/// complete, drop or abort anything of the same group.
pub struct WorkBatch<'r> {
    registry: &'r Arc<Registry>,
    insert: BatchInsert<'r>,
    retired: Arc<AtomicBool>,
}

impl std::fmt::Debug for WorkBatch<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkBatch")
            .field("id", &self.insert.id())
            .finish_non_exhaustive()
    }
}

impl WorkBatch<'_> {
    /// Registers the ops that `add` adds (`len` of them, as far as the
    /// caller knows) as one batch, submitted and started at `now` (the
    /// launch's one clock reading), each due within `timeout`; `probe`
    /// (the launch's end event) tells the watchdog they finished. Returns
    /// what `add` returns, and the batch's ops in the order they were
    /// added: the one list the registry keeps too, for whoever names them
    /// later (a group's works).
    ///
    /// # Errors
    ///
    /// [`WorkError::GroupErrored`] (naming `first`, the batch's first op)
    /// if the group has already failed: nothing is registered and `add`
    /// does not run.
    pub fn register<R>(
        registry: &Arc<Registry>,
        first: &OpContext,
        len: usize,
        now: Instant,
        timeout: Option<Duration>,
        probe: Option<std::sync::Arc<dyn FinishedProbe>>,
        add: impl FnOnce(&mut WorkBatch<'_>) -> R,
    ) -> Result<(R, std::sync::Arc<[OpContext]>), WorkError> {
        let insert = registry.begin_batch(first, len, now)?;
        let mut batch = WorkBatch {
            registry,
            insert,
            retired: Arc::new(AtomicBool::new(false)),
        };
        let out = add(&mut batch);
        let deadline = timeout.and_then(|t| now.checked_add(t));
        let ops = registry.commit_batch(batch.insert, now, deadline, probe);
        Ok((out, ops))
    }

    /// Adds an op of the batch (`collective`: its sequence number is
    /// comparable across ranks) and returns its work and completer.
    pub fn add<T: Send + 'static>(
        &mut self,
        ctx: OpContext,
        collective: bool,
        meta: OpMeta,
    ) -> (OpFuture<T>, Completer<T>) {
        let rec = self.insert.record(ctx.clone(), collective, meta);
        let shared = DynArc::new(Shared {
            ctx,
            id: self.insert.id(),
            rec,
            slot: Slot::new(),
            hold: false,
            registry: self.registry.clone(),
            batch: Some(self.retired.clone()),
        });
        self.insert.member(shared.clone());
        (
            OpFuture {
                shared: shared.clone(),
            },
            Completer {
                shared: Some(shared),
            },
        )
    }

    /// Adds an op of the batch that gets no work of its own: one work of
    /// the batch ([`add`](Self::add)) stands for it, e.g. a group's one
    /// work for every op of the group. It is recorded, counted as pending
    /// and listed among the pending ops like the others, and retired or
    /// failed with the batch.
    pub fn record(&mut self, ctx: OpContext, collective: bool, meta: OpMeta) {
        self.insert.record(ctx, collective, meta);
    }
}
