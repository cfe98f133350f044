//! Connecting to the job's store, whoever serves it.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::config::{RendezvousConfig, StoreHost};
use super::error::RendezvousError;
use crate::client::{ClientOptions, TcpStore};
use crate::prefix::PrefixStore;
use crate::server::TcpStoreServer;
use crate::store::Store;
use crate::torch::{TorchStore, TorchStoreOptions};
use crate::wait_report::Waiting;

/// The time left until `deadline`, at least 1 ms.
pub(super) fn remaining(deadline: Instant) -> Duration {
    deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1))
}

/// Connects to the job's store: rank 0's chorus store, or the PyTorch store
/// torchrun's agent serves (under chorus's namespace). Returns the client
/// and the address it is connected to.
pub(super) async fn connect(
    cfg: &RendezvousConfig,
    server: Option<&TcpStoreServer>,
    deadline: Instant,
) -> Result<(Arc<dyn Store>, String), RendezvousError> {
    let rank = cfg.rank();
    let host = match cfg.store_host() {
        StoreHost::Rank0 => "rank 0",
        StoreHost::Torch { .. } => "the PyTorch TCPStore (torchrun's agent)",
        StoreHost::Launcher => "chorus-run (node 0)",
    };
    let connect_err = |addr: &str, cause| RendezvousError::Connect {
        rank,
        host,
        addr: addr.to_owned(),
        after: cfg.timeout(),
        cause,
    };
    // Connecting retries until the deadline: say so while it lasts.
    let started = deadline
        .checked_sub(cfg.timeout())
        .unwrap_or_else(Instant::now);
    let waiting = |addr: &str| {
        Waiting::new(
            format!("rank {rank} waits to connect to the job's store, served by {host}, at {addr}"),
            started,
            cfg.timeout(),
        )
        .hint(format!(
            "is {host} running, and MASTER_ADDR/MASTER_PORT the same on every rank?"
        ))
    };
    if let StoreHost::Torch { namespace } = cfg.store_host() {
        if cfg.token().is_some() {
            tracing::warn!(
                rank,
                "the PyTorch store has no authentication: the store token is not used"
            );
        }
        let addr = cfg.master_endpoint(cfg.master_port());
        let opts = TorchStoreOptions {
            connect_timeout: remaining(deadline),
            ..TorchStoreOptions::default()
        };
        let torch = waiting(&addr)
            .run(TorchStore::connect(&addr, opts))
            .await
            .map_err(|cause| connect_err(&addr, cause))?;
        let store: Arc<dyn Store> = Arc::new(PrefixStore::new(namespace.clone(), Arc::new(torch)));
        return Ok((store, addr));
    }
    let addr = match server {
        // Rank 0 talks to its own server on the address it bound (loopback
        // when it bound every interface).
        Some(s) => {
            let a = s.local_addr();
            let ip = match a.ip() {
                IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
                IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
                ip => ip,
            };
            SocketAddr::new(ip, a.port()).to_string()
        }
        None => cfg.master_endpoint(cfg.master_port()),
    };
    let opts = ClientOptions {
        token: cfg.token().map(str::to_owned),
        connect_timeout: remaining(deadline),
        ..ClientOptions::default()
    };
    let client = waiting(&addr)
        .run(TcpStore::connect(&addr, opts))
        .await
        .map_err(|cause| connect_err(&addr, cause))?;
    Ok((Arc::new(client), addr))
}
