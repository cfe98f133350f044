//! The job's store as a rank holds it: [`JobStore`], which leaves the job
//! when its last handle is dropped.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::config::{RendezvousConfig, StoreHost};
use super::leave::Leave;
use crate::error::StoreError;
use crate::server::TcpStoreServer;
use crate::store::Store;
use chorus_core::sync::lock;

/// How long a dropped store of a rank other than 0 waits for its goodbye to
/// reach rank 0.
const DROP_GOODBYE_WAIT: Duration = Duration::from_secs(1);

/// The job's store as handed out: a client of rank 0's server that leaves
/// the job when the last handle is dropped, and on rank 0 owns the server.
pub(super) struct JobStore {
    client: Arc<dyn Store>,
    pub(super) addr: String,
    rank: usize,
    world: usize,
    shutdown_timeout: Duration,
    /// Set once the leave protocol has been started.
    left: AtomicBool,
    /// Rank 0's server, until the leave protocol takes it.
    server: Mutex<Option<TcpStoreServer>>,
    /// The launcher serves the store (chorus-run): it stops serving once
    /// its own node's ranks are done and the others had a moment to
    /// leave, so a goodbye that finds it gone is late, not lost work.
    launcher_hosted: bool,
}

impl fmt::Debug for JobStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JobStore")
            .field("addr", &self.addr)
            .field("rank", &self.rank)
            .field("world", &self.world)
            .field("hosts_server", &(self.rank == 0))
            .field("left", &self.left.load(Ordering::Relaxed))
            .finish()
    }
}

impl JobStore {
    /// The job's store for the rank `cfg` names, over `client` (connected
    /// to `addr`); on rank 0 with the `server` it hosts.
    pub(super) fn new(
        client: Arc<dyn Store>,
        addr: String,
        cfg: &RendezvousConfig,
        server: Option<TcpStoreServer>,
    ) -> JobStore {
        JobStore {
            client,
            addr,
            rank: cfg.rank(),
            world: cfg.world_size(),
            shutdown_timeout: cfg.shutdown_timeout(),
            left: AtomicBool::new(false),
            server: Mutex::new(server),
            launcher_hosted: matches!(cfg.store_host(), StoreHost::Launcher),
        }
    }

    /// The leave protocol, the first time it is asked for.
    pub(super) fn take_leave(&self) -> Option<Leave> {
        if self.left.swap(true, Ordering::AcqRel) {
            return None;
        }
        let server = lock(&self.server).take();
        Some(Leave {
            client: self.client.clone(),
            rank: self.rank,
            world: self.world,
            timeout: self.shutdown_timeout,
            server,
            launcher_hosted: self.launcher_hosted,
        })
    }
}

impl Drop for JobStore {
    fn drop(&mut self) {
        let Some(leave) = self.take_leave() else {
            return;
        };
        let Ok(handle) = crate::rt::handle() else {
            return;
        };
        let hosts = leave.server.is_some();
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        handle.spawn(async move {
            let rank = leave.rank;
            if let Err(e) = leave.run().await {
                tracing::warn!(rank, "leaving the job's store on drop: {e}");
            }
            let _ = tx.send(());
        });
        // A rank other than 0 waits briefly so its goodbye leaves before a
        // process exit (never on chorus's own I/O threads, which run it).
        let on_io_thread = std::thread::current().name() == Some("chorus-io");
        if !hosts && !on_io_thread {
            let _ = rx.recv_timeout(DROP_GOODBYE_WAIT);
        }
    }
}

#[async_trait::async_trait]
impl Store for JobStore {
    async fn set(&self, key: &str, value: &[u8]) -> Result<(), StoreError> {
        self.client.set(key, value).await
    }

    async fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>, StoreError> {
        self.client.get(key, timeout).await
    }

    async fn add(&self, key: &str, delta: i64) -> Result<i64, StoreError> {
        self.client.add(key, delta).await
    }

    async fn compare_set(
        &self,
        key: &str,
        expected: &[u8],
        desired: &[u8],
    ) -> Result<Vec<u8>, StoreError> {
        self.client.compare_set(key, expected, desired).await
    }

    async fn wait(&self, keys: &[&str], timeout: Duration) -> Result<(), StoreError> {
        self.client.wait(keys, timeout).await
    }

    async fn check(&self, keys: &[&str]) -> Result<bool, StoreError> {
        self.client.check(keys).await
    }

    async fn present(&self, keys: &[&str]) -> Result<Vec<bool>, StoreError> {
        self.client.present(keys).await
    }

    async fn delete(&self, key: &str) -> Result<bool, StoreError> {
        self.client.delete(key).await
    }

    async fn num_keys(&self) -> Result<u64, StoreError> {
        self.client.num_keys().await
    }

    async fn multi_get(
        &self,
        keys: &[&str],
        timeout: Duration,
    ) -> Result<Vec<Vec<u8>>, StoreError> {
        self.client.multi_get(keys, timeout).await
    }

    async fn multi_set(&self, entries: &[(&str, &[u8])]) -> Result<(), StoreError> {
        self.client.multi_set(entries).await
    }
}
