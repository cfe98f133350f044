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
//!
//! Files: `config` (where a rank and the store are: [`RendezvousConfig`]),
//! `launcher` (a rank tied to the chorus-run that started it), `error`
//! ([`RendezvousError`]), `keys` (the protocol's store keys), `connect`
//! (reaching the store, whoever serves it), `leave` (the goodbyes, and
//! waiting for them), `job_store` (the store as a rank holds it, which
//! leaves when dropped), `joined_rank` ([`Rendezvous`]), `join` (the join
//! protocol), `rejoin` (a replacement rank's reconnection).
//!
//! [`TcpStoreServer`]: crate::TcpStoreServer
//! [`TcpStore`]: crate::TcpStore
//! [`TorchStore`]: crate::TorchStore

mod config;
mod connect;
mod error;
mod job_store;
mod join;
mod joined_rank;
mod keys;
mod launcher;
mod leave;
mod rejoin;

pub use config::{
    ConfigError, EnvError, RendezvousConfig, RendezvousConfigBuilder, Source, StoreHost,
    DEFAULT_SHUTDOWN_TIMEOUT, DEFAULT_TIMEOUT, STORE_HOST_ENV,
};
pub use error::RendezvousError;
pub use join::{init_from_env, rendezvous};
pub use joined_rank::Rendezvous;
pub use launcher::LAUNCHER_PID_VAR;
pub use leave::wait_until_all_left;
pub use rejoin::{rejoin, rejoin_from_env};
