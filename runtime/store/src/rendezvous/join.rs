//! Joining a job: rank 0 hosts the store, every rank connects to it,
//! claims its rank and waits for the others ([`rendezvous`],
//! [`init_from_env`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::config::{RendezvousConfig, StoreHost};
use super::connect::{connect, remaining};
use super::error::RendezvousError;
use super::job_store::JobStore;
use super::joined_rank::Rendezvous;
use super::keys::{
    abort_ack_key, absent, join_list, parse_list, rank_key, ABORT, K_ALL_JOINED, K_JOINED, K_WORLD,
};
use super::launcher;
use crate::error::StoreError;
use crate::server::{ServerOptions, TcpStoreServer};
use crate::store::Store;
use crate::wait_report::Waiting;

/// How long rank 0, giving up, waits for the waiting ranks to read why
/// (they answer at once; the bound only matters for a rank that is stuck).
const ABORT_ACK_WAIT: Duration = Duration::from_secs(5);

fn never_joined(missing: Vec<usize>, cfg: &RendezvousConfig) -> RendezvousError {
    RendezvousError::NeverJoined {
        missing,
        world_size: cfg.world_size(),
        after: cfg.timeout(),
    }
}

/// Reads the environment ([`RendezvousConfig::from_env`]) and joins the job
/// ([`rendezvous`]).
///
/// # Errors
///
/// [`RendezvousError::Env`] naming a missing or malformed variable, and
/// those of [`rendezvous`].
///
/// # Cancel safety
///
/// As [`rendezvous`].
pub async fn init_from_env() -> Result<Rendezvous, RendezvousError> {
    let cfg = RendezvousConfig::from_env()?;
    launcher::tie_to_launcher()
        .map_err(|(pid, cause)| RendezvousError::LauncherGone { pid, cause })?;
    rendezvous(cfg).await
}

/// Joins the job described by `cfg`: rank 0 hosts the store, every rank
/// connects to it and announces itself; returns once all `world_size` ranks
/// have joined (see the [module docs](super) for the protocol).
///
/// Runs on chorus's I/O runtime: it can be awaited from any executor,
/// including `futures::executor::block_on`.
///
/// # Errors
///
/// * [`RendezvousError::Host`]: rank 0 cannot bind the store's address.
/// * [`RendezvousError::Connect`]: the store is unreachable for the whole
///   timeout (rank 0 not running, wrong address, wrong token).
/// * [`RendezvousError::NeverJoined`]: the timeout expired; names the ranks
///   that did not join.
/// * [`RendezvousError::DuplicateRank`], [`RendezvousError::WorldSizeMismatch`]:
///   the ranks were started inconsistently.
/// * [`RendezvousError::Store`], [`RendezvousError::Runtime`]: the store or
///   chorus's I/O runtime failed.
///
/// # Cancel safety
///
/// Dropping the future abandons the join at the next step; rank 0's server
/// is stopped. The other ranks then fail with a timeout or connection
/// error.
pub async fn rendezvous(cfg: RendezvousConfig) -> Result<Rendezvous, RendezvousError> {
    let (tx, rx) = futures::channel::oneshot::channel::<()>();
    // `_cancel` is dropped with this future: the join task sees it.
    let _cancel = tx;
    crate::rt::run(async move {
        tokio::select! {
            r = join(cfg) => r,
            _ = rx => Err(RendezvousError::Runtime("rendezvous cancelled".into())),
        }
    })
    .await
    .map_err(RendezvousError::Runtime)?
}

/// A random number (std's per-process random hash keys), so two processes
/// claiming one rank store different values.
fn nonce() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish()
}

async fn join(cfg: RendezvousConfig) -> Result<Rendezvous, RendezvousError> {
    let deadline = Instant::now() + cfg.timeout();
    let rank = cfg.rank();
    let world = cfg.world_size();

    let hosts = rank == 0 && *cfg.store_host() == StoreHost::Rank0;
    let server = if hosts {
        let addr = cfg.bind_addr();
        let opts = ServerOptions {
            token: cfg.token().map(str::to_owned),
            ..ServerOptions::default()
        };
        Some(
            TcpStoreServer::bind(addr, opts)
                .await
                .map_err(|cause| RendezvousError::Host { addr, cause })?,
        )
    } else {
        None
    };
    let joined = connect_and_join(&cfg, server.as_ref(), deadline).await;
    let (client, addr) = match joined {
        Ok(ok) => ok,
        Err(e) => {
            if let Some(s) = server {
                s.shutdown().await;
            }
            return Err(e);
        }
    };
    tracing::debug!(rank, world, %addr, "rendezvous: all ranks joined");

    let store = Arc::new(JobStore::new(client, addr, &cfg, server));
    Ok(Rendezvous { config: cfg, store })
}

/// Connects to the store and runs the join protocol; returns the client and
/// the address it is connected to.
async fn connect_and_join(
    cfg: &RendezvousConfig,
    server: Option<&TcpStoreServer>,
    deadline: Instant,
) -> Result<(Arc<dyn Store>, String), RendezvousError> {
    let rank = cfg.rank();
    let world = cfg.world_size();
    let (client, addr) = connect(cfg, server, deadline).await?;

    // 1. One world size for everyone.
    let ours = world.to_string();
    let theirs = client.compare_set(K_WORLD, b"", ours.as_bytes()).await?;
    if theirs != ours.as_bytes() {
        return Err(RendezvousError::WorldSizeMismatch {
            ours: world,
            theirs: String::from_utf8_lossy(&theirs).into_owned(),
        });
    }
    // 2. Claim the rank with a value unique to this connection.
    let me = format!("pid {} nonce {:016x}", std::process::id(), nonce());
    let owner = client
        .compare_set(&rank_key(rank), b"", me.as_bytes())
        .await?;
    if owner != me.as_bytes() {
        return Err(RendezvousError::DuplicateRank { rank });
    }
    // 3. Count in; the last one opens the door (unless rank 0 gave up
    //    first: then the door says `abort`).
    if client.add(K_JOINED, 1).await? == world as i64 {
        client.compare_set(K_ALL_JOINED, b"", b"1").await?;
    }
    // 4. Wait for everyone, saying how many came while it lasts.
    let counter = &*client;
    let waiting = Waiting::new(
        format!(
            "rank {rank} waits for the job's {world} ranks to join, through the store at {addr} \
             (key {K_ALL_JOINED})"
        ),
        deadline
            .checked_sub(cfg.timeout())
            .unwrap_or_else(Instant::now),
        cfg.timeout(),
    )
    .progress(move || async move {
        let n = counter.add(K_JOINED, 0).await.ok()?;
        Some(format!("{n} of {world} ranks joined"))
    })
    .hint(
        "did every rank start, with the same MASTER_ADDR/MASTER_PORT and WORLD_SIZE? (the \
         rendezvous fails once the wait is over, naming the ranks that never joined)",
    );
    let joined = waiting
        .run(client.get(K_ALL_JOINED, remaining(deadline)))
        .await;
    let door = match joined {
        Ok(v) => v,
        Err(StoreError::Timeout { .. }) => {
            let missing = absent(&*client, world, rank_key).await?;
            if rank != 0 {
                // Rank 0 need not wait for this rank to read its verdict.
                let _ = client.set(&abort_ack_key(rank), b"1").await;
                return Err(never_joined(missing, cfg));
            }
            // Rank 0 tells every waiting rank which ranks are missing
            // before it stops the server.
            let abort = format!("{ABORT}{}", join_list(&missing));
            let door = client
                .compare_set(K_ALL_JOINED, b"", abort.as_bytes())
                .await?;
            if door == abort.as_bytes() {
                let present: Vec<String> = (1..world)
                    .filter(|r| !missing.contains(r))
                    .map(abort_ack_key)
                    .collect();
                let keys: Vec<&str> = present.iter().map(String::as_str).collect();
                // Best effort: a rank that does not answer will see the
                // connection close instead.
                let _ = client.wait(&keys, ABORT_ACK_WAIT).await;
                return Err(never_joined(missing, cfg));
            }
            door // the last rank arrived just now
        }
        Err(e) => return Err(e.into()),
    };
    if let Some(list) = door.strip_prefix(ABORT.as_bytes()) {
        let _ = client.set(&abort_ack_key(rank), b"1").await;
        return Err(never_joined(parse_list(list), cfg));
    }
    Ok((client, addr))
}
