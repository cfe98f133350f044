//! Leaving the job: each rank's goodbye, and rank 0 (or the launcher)
//! waiting for every rank to leave before the store stops.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::error::RendezvousError;
use super::keys::{absent, left_key, K_ALL_LEFT, K_LEFT};
use crate::error::StoreError;
use crate::server::TcpStoreServer;
use crate::store::Store;
use crate::wait_report::Waiting;

/// Waits until every one of the job's `world` ranks has left the job's
/// store (each rank's [`Rendezvous::shutdown`](super::Rendezvous::shutdown), or the drop of its last
/// store handle, says goodbye). For whoever serves the store outside the
/// ranks — chorus-run on node 0 — so that the store does not go away
/// under a rank of another node that is still leaving.
///
/// # Errors
///
/// [`RendezvousError::NeverLeft`] naming the ranks that had not left after
/// `timeout`; [`RendezvousError::Store`] if the store cannot be read.
pub async fn wait_until_all_left(
    store: &dyn Store,
    world: usize,
    timeout: Duration,
) -> Result<(), RendezvousError> {
    let left = Waiting::new(
        format!(
            "the job's store waits for its {world} ranks to leave (key {K_ALL_LEFT}) before it \
             stops serving"
        ),
        Instant::now(),
        timeout,
    )
    .progress(move || async move {
        let n = store.add(K_LEFT, 0).await.ok()?;
        Some(format!("{n} of {world} ranks left"))
    })
    .hint(
        "a rank leaves with Rendezvous::shutdown (ProcessGroup::shutdown) or when its last \
         store handle is dropped; one still running keeps the store up until the wait is over",
    )
    .run(store.wait(&[K_ALL_LEFT], timeout))
    .await;
    match left {
        Ok(()) => Ok(()),
        Err(StoreError::Timeout { .. }) => Err(RendezvousError::NeverLeft {
            missing: absent(store, world, left_key).await.unwrap_or_default(),
            world_size: world,
            after: timeout,
        }),
        Err(e) => Err(e.into()),
    }
}

/// One rank's leave protocol.
pub(super) struct Leave {
    pub(super) client: Arc<dyn Store>,
    pub(super) rank: usize,
    pub(super) world: usize,
    pub(super) timeout: Duration,
    pub(super) server: Option<TcpStoreServer>,
    pub(super) launcher_hosted: bool,
}

impl Leave {
    pub(super) async fn run(self) -> Result<(), RendezvousError> {
        let said = self.goodbye().await;
        let Some(server) = self.server else {
            return said;
        };
        // Rank 0: keep serving until all have left, then stop.
        let waited = match said {
            Err(e) => Err(e),
            Ok(()) => wait_until_all_left(&*self.client, self.world, self.timeout).await,
        };
        server.shutdown().await;
        waited
    }

    async fn goodbye(&self) -> Result<(), RendezvousError> {
        match self.say_goodbye().await {
            // The launcher stopped serving after its own ranks were done
            // and the others had their moment: this rank's work is done
            // too, and nobody is left to tell.
            Err(StoreError::Connection { addr, cause }) if self.launcher_hosted => {
                tracing::warn!(
                    rank = self.rank,
                    %addr,
                    %cause,
                    "leaving the job: the launcher no longer serves the store; leaving without a goodbye"
                );
                Ok(())
            }
            r => r.map_err(Into::into),
        }
    }

    async fn say_goodbye(&self) -> Result<(), StoreError> {
        self.client.set(&left_key(self.rank), b"1").await?;
        if self.client.add(K_LEFT, 1).await? == self.world as i64 {
            self.client.set(K_ALL_LEFT, b"1").await?;
        }
        Ok(())
    }
}
