//! The error types of chorus's public API: [`Error`], a refused op
//! ([`Rejected`]), a group that could not be re-formed ([`ReformError`]).
//!
//! Every error type of chorus (these, [`WorkError`], [`Failed`], the
//! store's and the rendezvous' errors) shows its message for `{:?}`, so a
//! `main` that returns one with `?` prints what went wrong and what to do;
//! `{:#?}` shows its structure.
//!
//! ```
//! let e = chorus::Error::InvalidArgument("device 9 is out of range".into());
//! assert_eq!(format!("{e:?}"), "invalid argument: device 9 is out of range");
//! assert_eq!(format!("{e:#?}"), "InvalidArgument(\n    \"device 9 is out of range\",\n)");
//! ```

use std::fmt;

use chorus_core::message_debug::TypeName;
use chorus_core::{Failed, WorkError};
use chorus_store::rendezvous::RendezvousError;
use chorus_store::StoreError;

/// Everything that can go wrong in chorus outside a running op's own
/// [`WorkError`].
///
/// `Debug` shows the message, so `fn main() -> Result<(), chorus::Error>`
/// with `?` prints it; `{:#?}` shows the structure.
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An op failed or was refused.
    #[error(transparent)]
    Work(#[from] WorkError),
    /// The store failed (address exchange, subgroup creation).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The ranks could not meet (environment, store host, missing ranks).
    #[error(transparent)]
    Rendezvous(#[from] RendezvousError),
    /// A backend could not be set up (connections between ranks, NCCL
    /// communicator creation).
    #[error("group '{group}' rank {rank}: backend setup failed: {msg}")]
    Setup {
        /// The group being created.
        group: String,
        /// This rank.
        rank: usize,
        /// What failed and what to check.
        msg: String,
    },
    /// An argument to group creation was invalid.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A group could not be re-formed.
    #[error(transparent)]
    Reform(#[from] ReformError),
}

chorus_core::debug_shows_message!(Error {
    Work(e),
    Store(e),
    Rendezvous(e),
    Setup { group, rank, msg },
    InvalidArgument(msg),
    Reform(e),
});

/// A submission that was refused before anything ran; gives the buffers
/// back.
///
/// Displays as its error does; `Debug` shows that message too, for any
/// `B`; `{:#?}` shows the structure, with the buffers by their type.
#[derive(thiserror::Error)]
#[error("{error}")]
pub struct Rejected<B> {
    /// Why the op was refused.
    pub error: WorkError,
    /// The buffers, untouched.
    pub buffers: B,
}

impl<B> fmt::Debug for Rejected<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        chorus_core::message_debug::fmt(self, f, |f| {
            f.debug_struct("Rejected")
                .field("error", &self.error)
                .field("buffers", &TypeName::<B>::of())
                .finish()
        })
    }
}

impl<B> Rejected<B> {
    pub(crate) fn new(error: WorkError, buffers: B) -> Self {
        Rejected { error, buffers }
    }

    /// The buffers, untouched.
    pub fn into_buffers(self) -> B {
        self.buffers
    }
}

impl<B> From<Rejected<B>> for Error {
    fn from(r: Rejected<B>) -> Self {
        Error::Work(r.error)
    }
}

/// The refusal's error, without the buffers (for `?` in code that returns
/// [`WorkError`], e.g. a [`ProcessGroup::batched`](crate::ProcessGroup::batched)
/// closure).
impl<B> From<Rejected<B>> for WorkError {
    fn from(r: Rejected<B>) -> Self {
        r.error
    }
}

/// A refusal as a failure that carries its buffers back: a retry loop
/// matches one type for an op that was refused (when it was called) and
/// one that failed (when it was awaited), and gets its buffers back from
/// either.
///
/// # Examples
///
/// ```no_run
/// # async fn demo(pg: &chorus::ProcessGroup) -> Result<(), chorus::Error> {
/// use chorus::{Failed, ReduceOp};
///
/// let mut grads = vec![0.5f32; 1024];
/// for _attempt in 0..3 {
///     // `?` inside turns a refusal into a `Failed` with its buffers.
///     let run = async {
///         let work = pg.all_reduce(grads, ReduceOp::Sum)?;
///         work.await
///     };
///     let result: Result<Vec<f32>, Failed<Vec<f32>>> = run.await;
///     match result {
///         Ok(sum) => {
///             grads = sum;
///             break;
///         }
///         Err(failed) => {
///             eprintln!("all_reduce did not run: {failed}");
///             // Refused or failed: the buffers come back either way
///             // (a device op's may not, when the device still holds
///             // them).
///             grads = failed.into_buffers().unwrap_or_else(|| vec![0.5; 1024]);
///         }
///     }
/// }
/// # Ok(()) }
/// ```
impl<B> From<Rejected<B>> for Failed<B> {
    fn from(r: Rejected<B>) -> Self {
        Failed::new(r.error, r.buffers)
    }
}

/// A failed op's error, without its buffers (for `?` in code that returns
/// [`Error`]).
impl<B> From<Failed<B>> for Error {
    fn from(f: Failed<B>) -> Self {
        Error::Work(f.error)
    }
}

/// Why [`ProcessGroup::reform`](crate::ProcessGroup::reform) gave no new
/// group.
///
/// `Debug` shows the message; `{:#?}` the structure.
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum ReformError {
    /// The survivors closed the roster of `epoch` without this rank: it
    /// announced itself after the roster was written (it was stopped or
    /// too slow to notice the failure within their window). It cannot join
    /// that epoch; its old group stays aborted.
    #[error(
        "rank {rank} of group '{group}' was voted out of epoch {epoch}: the survivors (old ranks \
         {members:?}) closed the roster without it, because it announced itself too late (was it \
         stopped, or slower than the window to notice the failure?); it cannot rejoin that epoch: \
         exit, or come back as a replacement rank"
    )]
    VotedOut {
        /// The group this rank was in.
        group: String,
        /// This rank's rank in that group.
        rank: usize,
        /// The epoch it was voted out of.
        epoch: u64,
        /// The old ranks that form that epoch.
        members: Vec<usize>,
    },
    /// The store failed during the quorum (its host died, or it timed
    /// out): this rank cannot know the roster.
    #[error("rank {rank} of group '{group}': the store failed while forming epoch {epoch}: {source}; the store must outlive the ranks (let the launcher host it)")]
    Store {
        /// The group being re-formed.
        group: String,
        /// This rank's rank in it.
        rank: usize,
        /// The epoch being formed.
        epoch: u64,
        /// The store's error.
        #[source]
        source: StoreError,
    },
    /// The store holds a roster for this epoch that chorus cannot read
    /// (another program wrote the key, or a different chorus version).
    #[error(
        "group '{group}' epoch {epoch}: the store's roster is not one chorus wrote: {value:?}"
    )]
    Corrupt {
        /// The group being re-formed.
        group: String,
        /// The epoch being formed.
        epoch: u64,
        /// The stored value, as text where it is UTF-8.
        value: String,
    },
    /// A replacement rank was not admitted into the running group within
    /// its rejoin timeout: no survivor re-formed the group (after a
    /// failure) or admitted joiners (at a step boundary) in that time.
    #[error("world rank {world_rank}: no epoch of group '{group}' admitted this replacement rank within {after:?} (it waited for epoch {epoch}); do the survivors call ProcessGroup::admit at step boundaries (or reform after a failure)? Raise CHORUS_REJOIN_TIMEOUT_MS if their steps are longer")]
    NotAdmitted {
        /// The group (its name at epoch 0).
        group: String,
        /// This rank's world rank.
        world_rank: usize,
        /// The epoch it waited for last.
        epoch: u64,
        /// The rejoin timeout.
        after: std::time::Duration,
    },
    /// The quorum agreed, but connecting the new group failed (typically a
    /// member that announced itself and died before connecting). Every
    /// member fails alike; call `reform` on the old group again to form
    /// the next epoch without it.
    #[error("rank {rank} of group '{group}': epoch {epoch} (old ranks {members:?}) agreed but its group could not be connected: {source}; call reform again to form the next epoch")]
    Connect {
        /// The group being re-formed.
        group: String,
        /// This rank's rank in it.
        rank: usize,
        /// The epoch that could not be connected.
        epoch: u64,
        /// Its members (old ranks).
        members: Vec<usize>,
        /// What failed.
        #[source]
        source: Box<Error>,
    },
    /// The group failed because its ranks called different ops at one
    /// sequence number: the program disagrees with itself, and a new group
    /// would fail the same way, so [`ProcessGroup::admit`](crate::ProcessGroup::admit)
    /// does not re-form it.
    #[error("rank {rank} of group '{group}': not re-forming: the group failed because its ranks called different ops ({source}); a new group would fail the same way: fix the program (for admit: docs/FAULTS.md, Growing back)")]
    Mismatch {
        /// The group that failed.
        group: String,
        /// This rank's rank in it.
        rank: usize,
        /// The mismatch.
        #[source]
        source: Box<WorkError>,
    },
}

chorus_core::debug_shows_message!(ReformError {
    VotedOut { group, rank, epoch, members },
    Store { group, rank, epoch, source },
    Corrupt { group, epoch, value },
    NotAdmitted { group, world_rank, epoch, after },
    Connect { group, rank, epoch, members, source },
    Mismatch { group, rank, source },
});
