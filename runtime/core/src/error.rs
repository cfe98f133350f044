//! Errors of in-flight work: what happened, where (rank, group, sequence
//! number, op) and what to do about it.

use std::fmt;
use std::num::NonZeroU64;
use std::sync::Arc;
use std::time::Duration;

/// Where an op sits: the rank that issued it, its group, its sequence number
/// in that group and the op's name.
///
/// An op chorus issues for itself (the exchange inside
/// `ProcessGroup::admit`) is numbered apart from the program's ops, so that
/// the program's sequence numbers are the same whether or not such ops ran:
/// its `internal` is its number among chorus's own ops, and its `seq` is the
/// number of the program's last op before it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpContext {
    /// Rank of the caller inside the group.
    pub rank: usize,
    /// Name of the group (`"world"` for the default group).
    pub group: Arc<str>,
    /// Sequence number of the op in its group, from 1: collectives count
    /// on one counter, a send or recv on the counter of its direction to
    /// its peer. An op refused before it ran ([`WorkError::InvalidArgument`],
    /// [`WorkError::GroupErrored`]) takes none: it shows the number it
    /// would have taken, which the next op then takes. 0 where there is
    /// no op (an abort, a capture) or none yet (an op staged in a group
    /// takes its number at launch); it is then left out of the message.
    /// For one of chorus's own ops: the program's last number before it.
    pub seq: u64,
    /// The op, e.g. `"all_reduce"`, or the name of one of chorus's own ops
    /// (`"admit"`).
    pub op: &'static str,
    /// For an op chorus issued for itself: its number among those ops of
    /// the group, from 1; `None` for the program's ops.
    pub internal: Option<NonZeroU64>,
}

impl OpContext {
    /// The context of the program's op `op` at `seq` on `rank` of `group`.
    pub fn new(rank: usize, group: Arc<str>, seq: u64, op: &'static str) -> Self {
        OpContext {
            rank,
            group,
            seq,
            op,
            internal: None,
        }
    }
}

impl fmt::Display for OpContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "rank {} in group '{}' ", self.rank, self.group)?;
        match self.internal {
            None if self.seq != 0 => write!(f, "at seq {} ({})", self.seq, self.op),
            None => write!(f, "({})", self.op),
            Some(k) => write!(
                f,
                "after seq {} ({}: chorus's own op #{k}, not one of the program's)",
                self.seq, self.op
            ),
        }
    }
}

/// Why a piece of work failed.
///
/// Errors are cloneable: when a communicator or group fails, every pending
/// work receives the same error.
///
/// `Debug` shows the message (so `?` in `main` and `unwrap` print it);
/// `{:#?}` shows the structure (see [`message_debug`](crate::message_debug)).
#[derive(Clone, thiserror::Error)]
#[non_exhaustive]
pub enum WorkError {
    /// The op did not complete within its timeout. A peer is hung, slow or out
    /// of step; dump the flight recorder of every rank and run `chorus-trace`.
    #[error("{ctx}: op timed out after {after:?}; a peer is hung, slow or called a different op (dump every rank's flight recorder and run chorus-trace)")]
    OpTimeout {
        /// The op that timed out.
        ctx: OpContext,
        /// The timeout that expired.
        after: Duration,
    },
    /// The watchdog itself stopped making progress (stuck in a driver or
    /// system call), so no op of the process can be trusted to finish.
    #[error("{ctx}: heartbeat timeout: the chorus watchdog made no progress for {after:?} (a driver or system call is stuck); the flight recorder was dumped")]
    HeartbeatTimeout {
        /// The op that was pending.
        ctx: OpContext,
        /// How long the watchdog was silent.
        after: Duration,
    },
    /// The store failed while the op needed it.
    #[error("{ctx}: store error: {cause}")]
    Store {
        /// The op that was pending.
        ctx: OpContext,
        /// The store's error message.
        cause: String,
    },
    /// The connection to a peer broke while the op needed it: it ended
    /// without the peer's goodbye (the process died, or its group failed
    /// or was aborted), or broke mid-frame.
    #[error(
        "{ctx}: lost connection to rank {peer}: {cause}; that rank probably died, check its log"
    )]
    PeerLost {
        /// The op that was running.
        ctx: OpContext,
        /// The peer rank that went away.
        peer: usize,
        /// What the transport reported.
        cause: String,
    },
    /// A peer left the group cleanly, with a goodbye (it shut its group
    /// down, or dropped it), before taking part in an op this rank needed
    /// it for. It did not crash and its group had not failed: it called
    /// fewer ops than this rank, or its program ended early.
    #[error(
        "{ctx}: rank {peer} left the group before taking part in this op: it shut the group down \
         or dropped it, with a goodbye (it did not crash, and its group had not failed); it called \
         fewer ops than this rank, or its program ended early: check its log, and that every rank \
         calls the same ops"
    )]
    PeerLeft {
        /// The op that needed the peer.
        ctx: OpContext,
        /// The peer rank that left.
        peer: usize,
    },
    /// A peer went silent: nothing from it for the liveness timeout — not
    /// even the transport's acknowledgements (a network partition, a host
    /// that stopped), or no beat in the group's store (a stopped or hung
    /// process, a host cut off) — however long the op may run.
    #[error(
        "{ctx}: rank {peer} went silent: nothing from it for {after:?} (the liveness timeout); a \
         network partition, or a stopped process or host: check that rank's host and the network \
         to it"
    )]
    PeerSilent {
        /// The op that was running.
        ctx: OpContext,
        /// The peer rank that went silent.
        peer: usize,
        /// The liveness timeout that passed.
        after: Duration,
    },
    /// Ranks called different collectives at the same sequence number.
    #[error("{ctx}: collective mismatch: {detail}")]
    Mismatch {
        /// The op of this rank.
        ctx: OpContext,
        /// Both sides, e.g. `rank 1 at seq 7 called all_gather(count=10) but rank 0 called all_reduce(count=12)`.
        detail: String,
    },
    /// The group was aborted (by the user, the watchdog or a blocking wait
    /// that timed out) while the op was pending.
    #[error("{ctx}: aborted: {reason}")]
    Aborted {
        /// The op that was pending.
        ctx: OpContext,
        /// Why the group was aborted.
        reason: String,
    },
    /// The group had already failed; every later call fails with the cause.
    #[error("{ctx}: the group failed earlier and accepts no more work; cause: {cause}")]
    GroupErrored {
        /// The op that was refused.
        ctx: OpContext,
        /// The first error of the group.
        cause: Arc<WorkError>,
    },
    /// Another rank of the group failed and reported it — in the last frame
    /// it sent this rank (TCP backend), or through the store (error
    /// propagation, opt-in per group) — so this rank's works failed at once
    /// instead of waiting out their own timeouts.
    #[error("{ctx}: rank {origin} of the group failed and reported it: {cause}; the root cause is on rank {origin}: see its log and flight-recorder dump")]
    Remote {
        /// The op that was pending here.
        ctx: OpContext,
        /// The rank (in the group) that detected the failure.
        origin: usize,
        /// Its error, as that rank reported it (with its seq and op).
        cause: String,
    },
    /// The group took in replacement ranks and refuses ops until `admit`
    /// returned it on this rank (its members must first agree on one state,
    /// which the replacements do not hold); nothing was submitted.
    #[error("{ctx}: this group took in replacement ranks, so no op runs on it before ProcessGroup::admit returned it: call admit on every member first (it returns this group at once), then take the state from rank 0 (docs/FAULTS.md, Growing back)")]
    NotAdmitted {
        /// The op that was refused.
        ctx: OpContext,
    },
    /// The arguments were invalid; nothing was submitted.
    #[error("{ctx}: invalid argument: {msg}")]
    InvalidArgument {
        /// The op that was refused.
        ctx: OpContext,
        /// What is wrong and what is expected.
        msg: String,
    },
    /// The backend failed (NCCL or CUDA error code, socket error, ...).
    #[error("{ctx}: backend error: {msg}")]
    Backend {
        /// The op that failed.
        ctx: OpContext,
        /// The backend's description, with its error code where it has one.
        msg: String,
    },
}

impl WorkError {
    /// The variant's name (`"OpTimeout"`, `"PeerLost"`, ...), for logs and
    /// reports that classify errors.
    pub fn kind(&self) -> &'static str {
        match self {
            WorkError::OpTimeout { .. } => "OpTimeout",
            WorkError::HeartbeatTimeout { .. } => "HeartbeatTimeout",
            WorkError::Store { .. } => "Store",
            WorkError::PeerLost { .. } => "PeerLost",
            WorkError::PeerLeft { .. } => "PeerLeft",
            WorkError::PeerSilent { .. } => "PeerSilent",
            WorkError::Mismatch { .. } => "Mismatch",
            WorkError::Aborted { .. } => "Aborted",
            WorkError::GroupErrored { .. } => "GroupErrored",
            WorkError::Remote { .. } => "Remote",
            WorkError::NotAdmitted { .. } => "NotAdmitted",
            WorkError::InvalidArgument { .. } => "InvalidArgument",
            WorkError::Backend { .. } => "Backend",
        }
    }

    /// The op the error belongs to.
    pub fn context(&self) -> &OpContext {
        match self {
            WorkError::OpTimeout { ctx, .. }
            | WorkError::HeartbeatTimeout { ctx, .. }
            | WorkError::Store { ctx, .. }
            | WorkError::PeerLost { ctx, .. }
            | WorkError::PeerLeft { ctx, .. }
            | WorkError::PeerSilent { ctx, .. }
            | WorkError::Mismatch { ctx, .. }
            | WorkError::Aborted { ctx, .. }
            | WorkError::GroupErrored { ctx, .. }
            | WorkError::Remote { ctx, .. }
            | WorkError::NotAdmitted { ctx }
            | WorkError::InvalidArgument { ctx, .. }
            | WorkError::Backend { ctx, .. } => ctx,
        }
    }

    /// The same failure, re-addressed to another op of the group (used when
    /// one failure fails every pending op).
    pub fn for_op(&self, ctx: OpContext) -> WorkError {
        let mut e = self.clone();
        match &mut e {
            WorkError::OpTimeout { ctx: c, .. }
            | WorkError::HeartbeatTimeout { ctx: c, .. }
            | WorkError::Store { ctx: c, .. }
            | WorkError::PeerLost { ctx: c, .. }
            | WorkError::PeerLeft { ctx: c, .. }
            | WorkError::PeerSilent { ctx: c, .. }
            | WorkError::Mismatch { ctx: c, .. }
            | WorkError::Aborted { ctx: c, .. }
            | WorkError::GroupErrored { ctx: c, .. }
            | WorkError::Remote { ctx: c, .. }
            | WorkError::NotAdmitted { ctx: c }
            | WorkError::InvalidArgument { ctx: c, .. }
            | WorkError::Backend { ctx: c, .. } => *c = ctx,
        }
        e
    }
}

debug_shows_message!(WorkError {
    OpTimeout { ctx, after },
    HeartbeatTimeout { ctx, after },
    Store { ctx, cause },
    PeerLost { ctx, peer, cause },
    PeerLeft { ctx, peer },
    PeerSilent { ctx, peer, after },
    Mismatch { ctx, detail },
    Aborted { ctx, reason },
    GroupErrored { ctx, cause },
    Remote { ctx, origin, cause },
    NotAdmitted { ctx },
    InvalidArgument { ctx, msg },
    Backend { ctx, msg },
});

/// An op that failed, with its buffers once nothing can touch them any
/// more.
///
/// What a work future resolves to when its op fails: the op's
/// [`WorkError`] and, where the backend could give them back, the buffers
/// the op took. The buffers' contents are unspecified (partly reduced,
/// partly received, or as they were). Their lengths and capacities are
/// the ones they had, and they are the very buffers passed in: nothing is
/// copied or reallocated.
///
/// `buffers` is `None` where the buffers could not be handed back (see
/// the work type's docs for when): they are then released by the backend
/// once nothing touches them.
///
/// Displays as its error does (like [`WorkError`] it has no source), so
/// a log line or `?` into an error type reads the same as before. `Debug`
/// shows that message too, for any `B` (so `?` in `main` prints it);
/// `{:#?}` shows the structure, with the buffers by their type.
#[derive(thiserror::Error)]
#[error("{error}")]
pub struct Failed<B> {
    /// Why the op failed.
    pub error: WorkError,
    /// The op's buffers, contents unspecified, when they came back.
    pub buffers: Option<B>,
}

impl<B> fmt::Debug for Failed<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        crate::message_debug::fmt(self, f, |f| {
            f.debug_struct("Failed")
                .field("error", &self.error)
                .field(
                    "buffers",
                    &self
                        .buffers
                        .as_ref()
                        .map(|_| crate::message_debug::TypeName::<B>::of()),
                )
                .finish()
        })
    }
}

impl<B> Failed<B> {
    /// A failure that carries `buffers` back.
    pub fn new(error: WorkError, buffers: B) -> Self {
        Failed {
            error,
            buffers: Some(buffers),
        }
    }

    /// A failure without buffers (the backend keeps them until nothing
    /// touches them, then releases them).
    pub fn without_buffers(error: WorkError) -> Self {
        Failed {
            error,
            buffers: None,
        }
    }

    /// Why the op failed.
    pub fn error(&self) -> &WorkError {
        &self.error
    }

    /// The error, dropping the buffers.
    pub fn into_error(self) -> WorkError {
        self.error
    }

    /// The buffers (contents unspecified), if they came back.
    pub fn into_buffers(self) -> Option<B> {
        self.buffers
    }

    /// The error and the buffers.
    pub fn into_parts(self) -> (WorkError, Option<B>) {
        (self.error, self.buffers)
    }

    /// The same failure with its buffers converted by `f` (`f` returning
    /// `None` drops them).
    pub fn map_buffers<C>(self, f: impl FnOnce(B) -> Option<C>) -> Failed<C> {
        Failed {
            error: self.error,
            buffers: self.buffers.and_then(f),
        }
    }
}

impl<B> From<WorkError> for Failed<B> {
    fn from(error: WorkError) -> Self {
        Failed::without_buffers(error)
    }
}

/// The failure's error, without the buffers (for `?` in code that returns
/// [`WorkError`]).
impl<B> From<Failed<B>> for WorkError {
    fn from(f: Failed<B>) -> Self {
        f.error
    }
}
