//! Rendezvous: every rank of a job finds the others through rank 0's store.
//!
//! ```no_run
//! # async fn main_() -> Result<(), Box<dyn std::error::Error>> {
//! use chorus_store::rendezvous::init_from_env;
//!
//! let rdzv = init_from_env().await?; // returns once every rank has joined
//! let store = rdzv.store(); // shared key-value store of the job
//! store.set(&format!("hello/{}", rdzv.rank()), b"hi").await?;
//! // ... the job ...
//! rdzv.shutdown().await?; // rank 0 keeps the store up until all have left
//! # Ok(()) }
//! ```
//!
//! # Protocol
//!
//! Rank 0 binds a [`TcpStoreServer`] on [`RendezvousConfig::bind_addr`]
//! (MASTER_ADDR:MASTER_PORT by default). Every rank, rank 0 included,
//! connects a [`TcpStore`] client (retrying until the timeout, so ranks may
//! start in any order), then, under the `chorus/rdzv/` keys:
//!
//! 1. agrees on the world size (`compare_set` of `world_size`: a rank
//!    started with another WORLD_SIZE fails with
//!    [`RendezvousError::WorldSizeMismatch`]);
//! 2. claims its rank (`compare_set` of `rank/R` with a value unique to the
//!    connection: a second process with the same rank fails with
//!    [`RendezvousError::DuplicateRank`]);
//! 3. counts itself in (`add` of `joined`); the rank that brings the count
//!    to the world size sets `all_joined` to `1` (`compare_set`);
//! 4. waits for `all_joined` (a `get`, woken by the store, not polling).
//!    When rank 0's timeout expires first, it checks which `rank/R` keys are
//!    missing and sets `all_joined` to `abort 3,5` instead, so every waiting
//!    rank fails at once with the same [`RendezvousError::NeverJoined`]
//!    naming them (rank 0 waits up to 5 s for them to read it before it
//!    stops the server). A rank whose own timeout expires first checks the
//!    `rank/R` keys itself.
//!
//! One wait per rank on one key, so the store's work grows linearly with
//! the world size.
//!
//! # Under torchrun's agent store
//!
//! torchrun's elastic agent already serves a PyTorch TCPStore on
//! `MASTER_ADDR:MASTER_PORT` and sets `TORCHELASTIC_USE_AGENT_STORE=True`
//! ([`StoreHost::Torch`]). Then no rank binds the port: every rank connects
//! a [`TorchStore`] to the agent's store and runs the same protocol under
//! the namespace `chorus/{TORCHELASTIC_RUN_ID}/{TORCHELASTIC_RESTART_COUNT}`,
//! so workers restarted by the agent do not meet the keys of the attempt
//! before. The agent owns the store's lifetime, so rank 0's
//! [`Rendezvous::shutdown`] does not wait for the others to leave.
//!
//! # Under chorus-run's store
//!
//! `chorus-run` (node 0's, in a job of several nodes) serves the job's
//! store itself for as long as it runs, and says so with
//! `CHORUS_STORE_HOST=launcher` ([`StoreHost::Launcher`]): no rank binds
//! the port, every rank connects to `MASTER_ADDR:MASTER_PORT`, and the
//! store outlives any rank, rank 0 included (`chorus-run --rank0-store`
//! keeps the rank-0 store described below). As under torchrun, rank 0's
//! [`Rendezvous::shutdown`] does not wait for the others to leave.
//!
//! # Lifetime of the store
//!
//! Rank 0's server lives as long as the job's store: the
//! [`Arc<dyn Store>`](Rendezvous::store) handles and the [`Rendezvous`]
//! share it. Leaving follows the same pattern as joining: each rank sets
//! `left/R` and counts itself out; rank 0 stops the server only once every
//! rank has left, or after [`RendezvousConfig::shutdown_timeout`]. So a rank
//! 0 that finishes first does not pull the store from under the others.
//!
//! * Call [`Rendezvous::shutdown`] on every rank at the end of the job. On
//!   rank 0 it returns when the others have left (or the timeout expired);
//!   on the others it returns at once.
//! * Without it, the last drop of the store leaves: a rank other than 0
//!   sends its goodbye (waiting at most 1 s for it to go out); rank 0 hands
//!   its server to a background task of chorus's I/O runtime that stops it
//!   once all have left. That task dies with the process: a rank 0 that
//!   exits while others still use the store breaks them. Prefer `shutdown`.

mod config;
mod launcher;

pub use launcher::LAUNCHER_PID_VAR;

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use config::{
    ConfigError, EnvError, RendezvousConfig, RendezvousConfigBuilder, Source, StoreHost,
    DEFAULT_SHUTDOWN_TIMEOUT, DEFAULT_TIMEOUT, STORE_HOST_ENV,
};

use crate::client::{ClientOptions, TcpStore};
use crate::error::StoreError;
use crate::prefix::PrefixStore;
use crate::server::{ServerOptions, TcpStoreServer};
use crate::store::Store;
use crate::torch::{TorchStore, TorchStoreOptions};
use crate::wait_report::Waiting;

const K_WORLD: &str = "chorus/rdzv/world_size";
const K_JOINED: &str = "chorus/rdzv/joined";
const K_ALL_JOINED: &str = "chorus/rdzv/all_joined";
const K_LEFT: &str = "chorus/rdzv/left";
const K_ALL_LEFT: &str = "chorus/rdzv/all_left";

fn rank_key(rank: usize) -> String {
    format!("chorus/rdzv/rank/{rank}")
}

fn abort_ack_key(rank: usize) -> String {
    format!("chorus/rdzv/abort_ack/{rank}")
}

/// Value of `all_joined` when rank 0 gave up, followed by the missing ranks.
const ABORT: &str = "abort ";

/// How long rank 0, giving up, waits for the waiting ranks to read why
/// (they answer at once; the bound only matters for a rank that is stuck).
const ABORT_ACK_WAIT: Duration = Duration::from_secs(5);

fn join_list(ranks: &[usize]) -> String {
    ranks
        .iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

fn parse_list(list: &[u8]) -> Vec<usize> {
    String::from_utf8_lossy(list)
        .split(',')
        .filter_map(|r| r.trim().parse().ok())
        .collect()
}

fn never_joined(missing: Vec<usize>, cfg: &RendezvousConfig) -> RendezvousError {
    RendezvousError::NeverJoined {
        missing,
        world_size: cfg.world_size(),
        after: cfg.timeout(),
    }
}

fn left_key(rank: usize) -> String {
    format!("chorus/rdzv/left/{rank}")
}

/// How long a dropped store of a rank other than 0 waits for its goodbye to
/// reach rank 0.
const DROP_GOODBYE_WAIT: Duration = Duration::from_secs(1);

/// Errors of [`rendezvous`], [`init_from_env`] and [`Rendezvous::shutdown`].
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

/// A joined rank: who it is, and the job's store.
///
/// Returned by [`rendezvous`] / [`init_from_env`] once every rank has
/// joined. Call [`shutdown`](Rendezvous::shutdown) at the end of the job.
#[derive(Debug)]
pub struct Rendezvous {
    config: RendezvousConfig,
    store: Arc<JobStore>,
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
    /// [module docs](self).
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

/// Joins the job described by `cfg`: rank 0 hosts the store, every rank
/// connects to it and announces itself; returns once all `world_size` ranks
/// have joined (see the [module docs](self) for the protocol).
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

fn remaining(deadline: Instant) -> Duration {
    deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1))
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

/// Connects to the job's store: rank 0's chorus store, or the PyTorch store
/// torchrun's agent serves (under chorus's namespace). Returns the client
/// and the address it is connected to.
async fn connect(
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

/// The ranks in `0..world` whose key `key(r)` does not exist.
async fn absent(
    client: &dyn Store,
    world: usize,
    key: fn(usize) -> String,
) -> Result<Vec<usize>, StoreError> {
    let mut missing = Vec::new();
    for r in 0..world {
        if !client.check(&[&key(r)]).await? {
            missing.push(r);
        }
    }
    Ok(missing)
}

/// Waits until every one of the job's `world` ranks has left the job's
/// store (each rank's [`Rendezvous::shutdown`], or the drop of its last
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

/// The job's store as handed out: a client of rank 0's server that leaves
/// the job when the last handle is dropped, and on rank 0 owns the server.
struct JobStore {
    client: Arc<dyn Store>,
    addr: String,
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
    fn new(
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
    fn take_leave(&self) -> Option<Leave> {
        if self.left.swap(true, Ordering::AcqRel) {
            return None;
        }
        let server = self
            .server
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take();
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

/// One rank's leave protocol.
struct Leave {
    client: Arc<dyn Store>,
    rank: usize,
    world: usize,
    timeout: Duration,
    server: Option<TcpStoreServer>,
    launcher_hosted: bool,
}

impl Leave {
    async fn run(self) -> Result<(), RendezvousError> {
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
