//! [`RendezvousError`], the errors of joining, rejoining and leaving.

use std::net::SocketAddr;
use std::time::Duration;

use super::config::EnvError;
use crate::error::StoreError;

/// Errors of [`rendezvous`](super::rendezvous()), [`init_from_env`](super::init_from_env)
/// and [`Rendezvous::shutdown`](super::Rendezvous::shutdown).
///
/// `Debug` shows the message (so `?` in `main` prints it); `{:#?}` the
/// structure.
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum RendezvousError {
    /// The environment does not describe a rank.
    #[error("rendezvous: {0}")]
    Env(#[from] EnvError),
    /// Rank 0 could not start the store server.
    #[error("rank 0 cannot host the store on {addr}: {cause}; is MASTER_PORT free (not used by another job) and MASTER_ADDR an address of this node?")]
    Host {
        /// The address it tried to bind.
        addr: SocketAddr,
        /// Why it failed.
        cause: StoreError,
    },
    /// The store of rank 0 could not be reached in time.
    #[error("rank {rank} could not connect to the store of {host} at {addr} within {after:?}: {cause}; is {host} running, and MASTER_ADDR/MASTER_PORT the same on every rank?")]
    Connect {
        /// This rank.
        rank: usize,
        /// Who serves the store: `"rank 0"`, or the PyTorch TCPStore
        /// (torchrun's agent).
        host: &'static str,
        /// The store address.
        addr: String,
        /// The timeout.
        after: Duration,
        /// The last error.
        cause: StoreError,
    },
    /// `chorus-run` started this rank (`CHORUS_RUN_PID`) but has already
    /// exited, or the rank could not be tied to it (see
    /// `rendezvous::launcher`).
    #[error("the chorus-run that started this rank (pid {pid}) is gone or cannot be followed: {cause}; the job was stopped while this rank started")]
    LauncherGone {
        /// The launcher's process id.
        pid: i32,
        /// What was found.
        cause: String,
    },
    /// Some ranks did not join within the timeout.
    #[error("ranks {missing:?} of {world_size} never joined within {after:?}; did they start, with the same MASTER_ADDR/MASTER_PORT?")]
    NeverJoined {
        /// The ranks that did not join, ascending.
        missing: Vec<usize>,
        /// The world size.
        world_size: usize,
        /// The timeout.
        after: Duration,
    },
    /// Another process already joined with this rank.
    #[error("rank {rank} joined twice: another process already claimed it; check RANK (or the launcher) on every process")]
    DuplicateRank {
        /// The rank claimed twice.
        rank: usize,
    },
    /// The ranks disagree on the world size.
    #[error("this rank has WORLD_SIZE={ours} but the job's store says {theirs}; start every rank with the same world size")]
    WorldSizeMismatch {
        /// This rank's world size.
        ours: usize,
        /// The one the store holds (set by the first rank to join).
        theirs: String,
    },
    /// Some ranks did not leave before rank 0's shutdown timeout; the store
    /// server was stopped anyway.
    #[error("ranks {missing:?} of {world_size} did not leave within {after:?}; the store server was stopped anyway (did they crash, or not call Rendezvous::shutdown?)")]
    NeverLeft {
        /// The ranks that did not leave, ascending.
        missing: Vec<usize>,
        /// The world size.
        world_size: usize,
        /// The timeout.
        after: Duration,
    },
    /// A replacement rank cannot rejoin: the store it would meet the
    /// others through died with the rank it replaces.
    #[error("rank {rank} cannot rejoin the running job: {why}; let chorus-run host the store (its default) to restart ranks in place")]
    NoRejoin {
        /// This rank.
        rank: usize,
        /// Why not.
        why: &'static str,
    },
    /// A store operation of the protocol failed.
    #[error("rendezvous store operation failed: {0}")]
    Store(#[from] StoreError),
    /// chorus's I/O runtime could not run the protocol.
    #[error("rendezvous: {0}")]
    Runtime(String),
}

chorus_core::debug_shows_message!(RendezvousError {
    Env(e),
    Host { addr, cause },
    Connect { rank, host, addr, after, cause },
    LauncherGone { pid, cause },
    NeverJoined { missing, world_size, after },
    DuplicateRank { rank },
    WorldSizeMismatch { ours, theirs },
    NeverLeft { missing, world_size, after },
    NoRejoin { rank, why },
    Store(e),
    Runtime(msg),
});
