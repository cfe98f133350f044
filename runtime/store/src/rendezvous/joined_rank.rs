//! [`Rendezvous`]: a rank that joined, and its way out.

use std::sync::Arc;

use super::config::RendezvousConfig;
use super::error::RendezvousError;
use super::job_store::JobStore;
use crate::store::Store;

/// A joined rank: who it is, and the job's store.
///
/// Returned by [`rendezvous`](super::rendezvous()) / [`init_from_env`](super::init_from_env) once every rank has
/// joined. Call [`shutdown`](Rendezvous::shutdown) at the end of the job.
#[derive(Debug)]
pub struct Rendezvous {
    pub(super) config: RendezvousConfig,
    pub(super) store: Arc<JobStore>,
}

impl Rendezvous {
    /// This rank, in `0..world_size`.
    pub fn rank(&self) -> usize {
        self.config.rank()
    }

    /// Number of ranks in the job.
    pub fn world_size(&self) -> usize {
        self.config.world_size()
    }

    /// This rank's index on its node.
    pub fn local_rank(&self) -> usize {
        self.config.local_rank()
    }

    /// Number of ranks on this rank's node.
    pub fn local_world_size(&self) -> usize {
        self.config.local_world_size()
    }

    /// The config this rank joined with.
    pub fn config(&self) -> &RendezvousConfig {
        &self.config
    }

    /// The job's key-value store (a client of rank 0's server). Rank 0's
    /// server stays up while any handle is alive; see the
    /// [module docs](super).
    pub fn store(&self) -> Arc<dyn Store> {
        self.store.clone()
    }

    /// The address of the store this rank is connected to.
    pub fn store_addr(&self) -> &str {
        &self.store.addr
    }

    /// Leaves the job: this rank says it is done with the store. Rank 0 then
    /// waits until every rank has left (at most
    /// [`RendezvousConfig::shutdown_timeout`]) and stops the store server;
    /// the other ranks return at once. Store handles still alive fail
    /// afterwards (on rank 0, and on the others once rank 0 stopped).
    ///
    /// # Errors
    ///
    /// [`RendezvousError::NeverLeft`] on rank 0, naming the ranks that did
    /// not leave in time (the server is stopped anyway);
    /// [`RendezvousError::Store`] if the goodbye could not be sent (when the
    /// launcher serves the store and no longer does, the rank leaves
    /// without one: a warning, not an error).
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: the protocol runs on chorus's I/O runtime and
    /// finishes even if this future is dropped, but its result is lost.
    pub async fn shutdown(self) -> Result<(), RendezvousError> {
        match self.store.take_leave() {
            Some(leave) => crate::rt::run(leave.run())
                .await
                .map_err(RendezvousError::Runtime)?,
            None => Ok(()),
        }
    }
}
