//! A replacement rank reconnects to the running job's store ([`rejoin`],
//! [`rejoin_from_env`]).

use std::sync::Arc;
use std::time::Instant;

use super::config::{RendezvousConfig, StoreHost};
use super::connect::{connect, remaining};
use super::error::RendezvousError;
use super::job_store::JobStore;
use super::joined_rank::Rendezvous;
use super::keys::K_WORLD;
use super::launcher;

/// Reads the environment ([`RendezvousConfig::from_env`]) and reconnects a
/// replacement rank ([`rejoin`]).
///
/// # Errors
///
/// [`RendezvousError::Env`] naming a missing or malformed variable, and
/// those of [`rejoin`].
///
/// # Cancel safety
///
/// As [`rejoin`].
pub async fn rejoin_from_env() -> Result<Rendezvous, RendezvousError> {
    let cfg = RendezvousConfig::from_env()?;
    launcher::tie_to_launcher()
        .map_err(|(pid, cause)| RendezvousError::LauncherGone { pid, cause })?;
    rejoin(cfg).await
}

/// Reconnects a rank that a launcher restarted in place (its predecessor
/// joined and died) to the running job's store, without the join protocol
/// the others passed long ago: it checks the world size and returns at
/// once. The rank then meets the others through the store (chorus's
/// `ProcessGroup::rejoin`).
///
/// # Errors
///
/// [`RendezvousError::NoRejoin`] where rank 0 hosts the store (rank 0's
/// replacement would find no store); [`RendezvousError::Connect`] if the
/// store is unreachable within the timeout;
/// [`RendezvousError::WorldSizeMismatch`] if the job was started with
/// another world size (or never started: the store holds none).
///
/// # Cancel safety
///
/// Cancel safe: nothing is written to the store.
pub async fn rejoin(cfg: RendezvousConfig) -> Result<Rendezvous, RendezvousError> {
    let rank = cfg.rank();
    if rank == 0 && *cfg.store_host() == StoreHost::Rank0 {
        return Err(RendezvousError::NoRejoin {
            rank,
            why: "rank 0 hosted the job's store, which died with it",
        });
    }
    crate::rt::run(async move {
        let deadline = Instant::now() + cfg.timeout();
        let (client, addr) = connect(&cfg, None, deadline).await?;
        let world = cfg.world_size();
        let theirs = if client.check(&[K_WORLD]).await? {
            client.get(K_WORLD, remaining(deadline)).await?
        } else {
            b"none (no rank joined)".to_vec()
        };
        if theirs != world.to_string().as_bytes() {
            return Err(RendezvousError::WorldSizeMismatch {
                ours: world,
                theirs: String::from_utf8_lossy(&theirs).into_owned(),
            });
        }
        tracing::debug!(rank, world, %addr, "rendezvous: reconnected a replacement rank");
        let store = Arc::new(JobStore::new(client, addr, &cfg, None));
        Ok(Rendezvous { config: cfg, store })
    })
    .await
    .map_err(RendezvousError::Runtime)?
}
