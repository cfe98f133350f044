//! The error type of chorus's public API.

use chorus_core::{Failed, WorkError};
use chorus_store::rendezvous::RendezvousError;
use chorus_store::StoreError;

/// Everything that can go wrong in chorus outside a running op's own
/// [`WorkError`].
#[derive(Debug, thiserror::Error)]
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
}

/// A submission that was refused before anything ran; gives the buffers
/// back.
#[derive(Debug, thiserror::Error)]
#[error("{error}")]
pub struct Rejected<B> {
    /// Why the op was refused.
    pub error: WorkError,
    /// The buffers, untouched.
    pub buffers: B,
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
/// [`WorkError`], e.g. a [`ProcessGroup::grouped`](crate::ProcessGroup::grouped)
/// closure).
impl<B> From<Rejected<B>> for WorkError {
    fn from(r: Rejected<B>) -> Self {
        r.error
    }
}

/// A failed op's error, without its buffers (for `?` in code that returns
/// [`Error`]).
impl<B> From<Failed<B>> for Error {
    fn from(f: Failed<B>) -> Self {
        Error::Work(f.error)
    }
}
